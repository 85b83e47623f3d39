"""Runtime settings: memory budget, scratch location, backend, forced tile size, durability.

One mutable ``Config`` instance, changed through :func:`update` or
:func:`set_memory_budget`; every planner and executor call reads it fresh, so a
change applies to the next execution.
"""
from __future__ import annotations

import dataclasses
import os
import re

from jask.io import durable, scratch, settings as io_settings
from jask.kernels import registry

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
PRECISIONS = ("highest", "high", "default", "float32", "tensorfloat32", "bfloat16")


def parse_bytes(value) -> int:
    """Parse ``512MB``, ``1.5GiB`` or a plain integer into a byte count."""
    if isinstance(value, bool):
        raise TypeError(f"memory size must be an int or a string like '512MB', got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"cannot parse memory size {value!r}; use e.g. '512MB' or '2GiB'")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        raise TypeError(f"memory size must be an int or a string like '512MB', got {value!r}")
    if n <= 0:
        raise ValueError(f"memory size must be positive, got {value!r}")
    return n


@dataclasses.dataclass
class Config:
    """Current settings. ``tile`` forces the tile edge (None: derive from the budget).

    ``durability``: ``"process"`` (default) makes every commit survive a killed
    process; ``"power"`` also a power cut, by fsyncing each user store's files
    and folders before its commit rename and the parent folder after it
    (:mod:`jask.io.durable`). ``JASK_DURABILITY`` sets the default.

    ``read_mmap``: read whole uncompressed, unsharded chunks in the page cache
    as read-only maps of their files instead of copies
    (:meth:`jask.io.reader.TileReader.map_chunk`). ``"auto"`` (default) maps a
    file only under a read lease (:mod:`jask.io.leases`), which keeps another
    program from truncating it in place while it is mapped (that would end the
    process with SIGBUS); ``True`` maps also where the kernel grants no lease;
    ``False`` never maps. ``JASK_READ_MMAP`` (``auto``, ``1``/``on``, ``0``/``off``) sets the default.
    """

    memory_budget: int = parse_bytes(os.environ.get("JASK_MEMORY_BUDGET", "512MB"))
    scratch_dir: str | None = os.environ.get("JASK_SCRATCH_DIR") or None
    allow_tmpfs: bool = False
    scratch_storage_options: dict | None = None   # credentials/endpoint when scratch_dir is a store URL
    backend: str = os.environ.get("JASK_BACKEND", "auto")
    tile: int | None = None
    fusion: bool = True
    progress: bool = False
    device: object = None          # a jax.Device for tile math; None: the default backend's first device
    devices: object = None         # devices a pass spreads its windows over: a tuple, "all", or None (just `device`)
    device_budget: int | None = None  # bytes of device memory a window may take; None: half the free memory
    precision: str = os.environ.get("JASK_PRECISION", "highest")  # float32 contractions (matmul precision)
    durability: str = os.environ.get("JASK_DURABILITY", "process")  # "power": fsync around commits (jask.io.durable)
    # bytes compiled window programs may hold; None: max(budget / 4, 256 MiB) (jask.exec.program_cache)
    program_cache: int | None = (parse_bytes(os.environ["JASK_PROGRAM_CACHE"])
                                 if os.environ.get("JASK_PROGRAM_CACHE") else None)
    read_mmap: bool | str = dataclasses.field(default_factory=lambda: _read_mmap_from_env())


def parse_read_mmap(text: str, source: str) -> bool | str:
    """The ``read_mmap`` value a word names (``auto``, ``on``/``1``, ``off``/``0``); ``source`` names it in errors."""
    value = text.strip().lower()
    if value in ("", "auto"):
        return "auto"
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{source}={value!r}: use auto, on (1) or off (0)")


def _read_mmap_from_env() -> bool | str:
    return parse_read_mmap(os.environ.get("JASK_READ_MMAP", "auto"), "JASK_READ_MMAP")


config = Config()
durable.check_mode(config.durability)   # a bad JASK_DURABILITY fails at import, naming the choices
io_settings.use_settings(config)   # the io layer reads its settings from here, never imports this module
registry.use_settings(config)  # so does the kernels layer


def update(name: str, value) -> None:
    """Set one setting, e.g. ``jask.config.update("tile", 64)``."""
    if not hasattr(config, name):
        names = ", ".join(f.name for f in dataclasses.fields(Config))
        raise ValueError(f"unknown jask setting {name!r}; known settings: {names}")
    if name in BYTE_SETTINGS:
        value = _bytes_setting(name, value)
    elif name in BOOLEAN_SETTINGS and not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    elif name == "scratch_storage_options" and value is not None and not isinstance(value, dict):
        raise TypeError(f"scratch_storage_options must be a dict of s3fs/gcsfs options or None, got {value!r}")
    elif name == "scratch_dir" and value is not None and not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"scratch_dir must be a folder path or store URL (a str) or None, got {value!r}")
    elif name == "device" and value is not None:
        import jax
        if not isinstance(value, jax.Device):
            raise TypeError(f"device must be a jax.Device (e.g. jax.devices()[0]) or None, got {value!r}")
    elif name == "devices" and value is not None:
        value = _check_devices(value)
    if name in ("device", "devices"):
        device = value if name == "device" else config.device
        devices = value if name == "devices" else config.devices
        if device is not None and isinstance(devices, tuple) and device != devices[0]:
            raise ValueError(f"device {device} must be the first of devices ({', '.join(map(str, devices))}): "
                             "the compute device is where a pass's first share, custom ops and copies run; "
                             "set device to None or list it first")
    elif name == "precision" and value not in PRECISIONS:
        raise ValueError(f"unknown matmul precision {value!r}; choose one of {PRECISIONS}")
    elif name == "backend" and value != "auto" and value not in registry.names():
        raise ValueError(f"unknown backend {value!r}; choose one of {('auto', *registry.names())}")
    elif name == "tile" and value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"tile must be a positive int or None, got {value!r}")
    elif name == "durability":
        durable.check_mode(value)
    elif name == "read_mmap" and not isinstance(value, bool) and value != "auto":
        raise TypeError(f"read_mmap must be True, False or 'auto', got {value!r}")
    elif name == "scratch_dir" and value is not None:
        scratch.check_scratch_dir(value, config.allow_tmpfs, "jask.config.update('scratch_dir', ...)")
    setattr(config, name, value)


BYTE_SETTINGS = ("memory_budget", "device_budget", "program_cache")   # sizes: "512MB", an int; the last two None
BOOLEAN_SETTINGS = ("fusion", "progress", "allow_tmpfs")


def _bytes_setting(name: str, value):
    """A size setting's value in bytes, with errors that name the setting."""
    if value is None and name != "memory_budget":
        return None
    if value is None:
        raise ValueError("memory_budget cannot be None: give a size such as '512MB' or 2**30")
    try:
        return parse_bytes(value)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{name}: {e}") from None


def _check_devices(value):
    """The ``devices`` setting as stored: ``"all"``, or a tuple of distinct devices of one platform.

    A ``jax.sharding.Mesh`` gives its devices in mesh order. Only this process's own devices
    (``jax.local_devices()``): in a ``jax.distributed`` run each process spreads its share of a
    pass over its own devices.
    """
    import jax
    if isinstance(value, str):
        if value != "all":
            raise ValueError(f"devices must be 'all', None or a list of jax.Device, got {value!r}")
        return value
    if isinstance(value, jax.sharding.Mesh):
        value = list(value.devices.flat)
    try:
        devices = tuple(value)
    except TypeError:
        raise TypeError(f"devices must be 'all', None or a list of jax.Device, got {value!r}") from None
    if not devices:
        raise ValueError("devices must not be empty; use None for the single compute device")
    bad = [d for d in devices if not isinstance(d, jax.Device)]
    if bad:
        raise TypeError(f"devices must be jax.Device objects (e.g. jax.devices()[:4]), got {bad[0]!r}")
    if len(set(devices)) != len(devices):
        raise ValueError(f"devices lists a device twice: {[str(d) for d in devices]}")
    platforms = sorted({d.platform for d in devices})
    if len(platforms) > 1:
        raise ValueError(f"devices must share one platform, got {platforms}")
    foreign = [d for d in devices if d.process_index != jax.process_index()]
    if foreign:
        raise ValueError(f"devices must belong to this process (jax.local_devices()): {foreign[0]} is "
                         f"process {foreign[0].process_index}'s, this is process {jax.process_index()}")
    return devices


def set_memory_budget(budget, scratch_dir=None, allow_tmpfs: bool = False, device_budget=None) -> None:
    """Set the memory budget tile shapes are derived from, and where scratch stores live.

    Parameters
    ----------
    budget : int or str
        Bytes, or a string such as ``"512MB"`` or ``"2GiB"``.
    scratch_dir : str or path, optional
        Directory for op outputs and gradients. Must be on a real disk: tmpfs and
        ramfs (and ``memory://`` URLs) count against RAM, so they are refused
        unless ``allow_tmpfs``; a file is refused.
    device_budget : int or str, optional
        Device memory one window of tiles may take (default: half of the
        compute device's free memory; on the host CPU the budget above).
    """
    n = parse_bytes(budget)
    device_n = None if device_budget is None else parse_bytes(device_budget)
    if scratch_dir is not None:
        scratch.check_scratch_dir(os.fspath(scratch_dir), allow_tmpfs, "jask.set_memory_budget(scratch_dir=...)")
        config.scratch_dir = os.fspath(scratch_dir)
    config.allow_tmpfs = allow_tmpfs
    config.memory_budget = n
    if device_n is not None:
        config.device_budget = device_n
