"""The workload families, one module each, behind one interface.

A workload module defines:

``NAME``, ``TITLE``
    Its key (``--workload``) and a one-line description.
``UNIT``, ``WORK``
    ``"GB/s"`` or ``"GFLOP/s"``, and what the throughput counts.
``CACHE``
    The page-cache states it runs in by default (``cold``, ``warm``).
``LIMIT``
    The system the ``jask/limit`` ratio divides by.
``sizes(gib, quick)``
    A list of sizes: dicts with ``label``, ``gib`` (the x axis of the plots)
    and the workload's parameters.
``work(params)``, ``ram_bytes(params)``
    The work done per repetition (bytes or flops), and what holding the
    workload in RAM takes (whether the ``jnp`` peer runs).
``chunk_edge(params, budget)``
    The tile edge the stores are chunked with and jask is told to use.
``make_data(params, root, tile, layout)``
    Writes the input stores under ``root``; returns ``{name: path}``.
``SYSTEMS``
    System name (see :mod:`jask.bench.peers`) to a runner class, or to a
    string saying why that system cannot do this workload.
"""
from __future__ import annotations

import importlib

NAMES = ("sum", "elementwise", "dot", "grad", "adam", "mlp")
COLS = 16384  # columns of the 2-D arrays whose size is given in GiB


def get(name: str):
    if name not in NAMES:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(NAMES)}")
    return importlib.import_module(f"jask.bench.workloads.{name}")


def rows_for(gib: float, cols: int = COLS) -> int:
    """Rows of a float32 array with ``cols`` columns holding about ``gib`` GiB."""
    return max(1, int(round(gib * 2**30 / (4 * cols))))


def gib_label(gib: float) -> str:
    return f"{gib * 1024:.0f} MiB" if gib < 1 else f"{gib:g} GiB"


def default_chunk_edge(shape, budget, n_inputs: int) -> int:
    """The tile edge jask would pick for an elementwise op over ``n_inputs`` arrays of ``shape``."""
    from jask.plan.tiling import default_tile
    from jask.config import config, parse_bytes
    saved = config.memory_budget, config.tile
    try:
        config.memory_budget, config.tile = parse_bytes(budget), None
        return default_tile(tuple(shape), 4, n_inputs=n_inputs)
    finally:
        config.memory_budget, config.tile = saved
