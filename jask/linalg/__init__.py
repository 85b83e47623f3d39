"""Public ops, one short file each."""
