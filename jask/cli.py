"""What the command-line entry points (the demo, the benchmarks) share.

``absl.app.run`` shows Python log records from INFO up, so JAX's note that an
optional backend could not start (``Unable to initialize backend 'tpu': ...``,
logged at INFO when that backend may fail quietly) lands in the middle of a
CLI's output on every machine without that accelerator. :func:`run` drops
exactly that record; warnings and errors, JAX's included, still show, and a
backend the user asked for with ``JAX_PLATFORMS`` still fails loudly (JAX
raises instead of logging).
"""
from __future__ import annotations

import logging

from absl import app

PLATFORM_PROBE = "Unable to initialize backend"


class DropPlatformProbe(logging.Filter):
    """Drops JAX's INFO-level platform-probe records and nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno <= logging.INFO and str(record.msg).startswith(PLATFORM_PROBE))


def quiet_platform_probe() -> None:
    """Install :class:`DropPlatformProbe` on the logger JAX probes platforms with (idempotent)."""
    logger = logging.getLogger("jax._src.xla_bridge")
    if not any(isinstance(f, DropPlatformProbe) for f in logger.filters):
        logger.addFilter(DropPlatformProbe())


def check_budget_flag(flag: str = "budget") -> None:
    """Have absl refuse ``--budget`` values jask cannot parse, as one usage line naming the flag."""
    from absl import flags

    def check(value: str) -> bool:
        from jask.config import parse_bytes
        try:
            parse_bytes(value)
        except (TypeError, ValueError) as e:
            raise flags.ValidationError(f"--{flag}: {e}") from None
        return True

    flags.register_validator(flag, check)


def run(main) -> None:
    """``absl.app.run(main)`` without JAX's platform-probe lines."""
    quiet_platform_probe()
    app.run(main)
