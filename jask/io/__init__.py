"""Disk side of jask: Zarr stores, scratch space, atomic commits."""
