"""Named errors of the user-facing calls, for code that wants to catch one case and not others."""
from __future__ import annotations


class OverBudgetError(ValueError):
    """``materialize`` of an array larger than the memory budget.

    ``nbytes`` is the array's size and ``budget`` the memory budget, both in
    bytes. ``materialize(x, allow_over_budget=True)`` builds it anyway.
    """

    def __init__(self, message, nbytes: int, budget: int):
        super().__init__(message)
        self.nbytes, self.budget = nbytes, budget
