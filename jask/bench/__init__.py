"""Benchmarks, each runnable as ``python -m jask.bench.NAME`` (e.g. ``kernels``: tile kernels versus plain jnp)."""
