"""Planning: tile sizes, fusion, windows and the memory they are projected to take."""
