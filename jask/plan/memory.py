"""The memory model shared by the planner's projection and the window schedule.

Each term is tiles held at once, charged at the tile size of the array it
belongs to (items counted as at least 4 bytes: partials accumulate in float32).
"""
SLOTS_PER_LEAF = 4   # per stored input tile: raw chunk bytes, the assembled tile, its device copy, one read ahead
SLOTS_PER_OP = 2     # per op on the pull path: a partial and an accumulator
SLOTS_FIXED = 2      # per output tile: the finished tile and its write buffer
