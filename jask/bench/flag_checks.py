"""Checks on ``python -m jask.bench``'s flags, run by absl as it parses them: a bad value is one usage line
naming the flag, before any data is written (a traceback from deep in a run before; ``--gib=-1`` ran a
one-row array and reported it as "-1024 MiB")."""
from __future__ import annotations

from absl import flags

from jask import cli
from jask.bench import workloads


def _numbers(kind, positive=True):
    """A validator for a list flag of ``kind`` (int or float) numbers, each above 0 when ``positive``."""
    def check(values):
        try:
            numbers = [kind(v) for v in values]
        except ValueError:
            return False
        return all(n > 0 for n in numbers) if positive else True
    return check


def register() -> None:
    """Attach the checks to the flags ``jask.bench.__main__`` defines."""
    flags.register_validator("workload", lambda names: set(names) <= set(workloads.NAMES),
                             message=f"--workload takes names among {', '.join(workloads.NAMES)}")
    flags.register_validator("gib", _numbers(float), message="--gib takes sizes in GiB above 0, e.g. 0.5,2")
    flags.register_validator("n", _numbers(int), message="--n takes whole matrix sizes above 0, e.g. 4096,8192")
    cli.check_budget_flag()
    flags.register_validator("tile", lambda v: v >= 0, message="--tile is a tile edge >= 1, or 0 for jask's own")
    flags.register_validator("repeat", lambda v: v >= 1, message="--repeat must be at least 1")
    flags.register_validator("warmup", lambda v: v in (0, 1), message="--warmup is 0 or 1")
