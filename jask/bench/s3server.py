"""A real S3-compatible server on loopback (moto's server mode), for the remote-store tests and benchmark.

It runs in its own process (``python -m moto.server``), so its request
handling does not share the client's interpreter lock. With ``auth=True`` it
checks credentials: the first IAM calls (free of checks) make a user with
full access and its key, and every later request must be signed with that key.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

from jask.bench.harness import free_port

_AUTH_SETUP_CALLS = 3   # create user, attach its policy, create its key


def moto_missing() -> str | None:
    """Why the server cannot run here (a missing package), or None."""
    for module, package in (("moto.server", "moto[server]"), ("flask", "moto[server]"), ("s3fs", "s3fs"),
                            ("boto3", "boto3")):
        try:
            __import__(module)
        except ImportError:
            return f"needs {package} (pip install '{package}')"
    return None


class S3Server:
    """``python -m moto.server`` on 127.0.0.1 at a free port; :meth:`stop` ends it.

    ``storage_options`` are what jask's ``storage_options=`` take for it (s3fs's names).
    """

    def __init__(self, auth: bool = False, start_timeout: float = 60.0):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, AWS_DEFAULT_REGION="us-east-1")
        if auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(_AUTH_SETUP_CALLS)
        self._proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait(start_timeout)
        self.key, self.secret = ("testing", "testing") if not auth else self._make_user()

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=2).read()
                return
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto server on {self.endpoint} did not start") from None
                time.sleep(0.1)

    def _make_user(self):
        iam = self.client("iam", "unchecked", "unchecked")
        iam.create_user(UserName="jask")
        iam.put_user_policy(UserName="jask", PolicyName="all", PolicyDocument=(
            '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}'))
        key = iam.create_access_key(UserName="jask")["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def client(self, service: str = "s3", key: str | None = None, secret: str | None = None):
        import boto3
        return boto3.client(service, endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=key or self.key, aws_secret_access_key=secret or self.secret)

    def storage_options(self, key: str | None = None, secret: str | None = None) -> dict:
        return {"key": key or self.key, "secret": secret or self.secret, "endpoint_url": self.endpoint,
                "client_kwargs": {"region_name": "us-east-1"}}

    def make_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
