"""Execution: runs a plan's windows on the compute device (see DESIGN.md)."""
