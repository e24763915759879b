"""Errors the planner raises for requests it cannot plan (user mistakes, not bugs)."""


class PlanningError(ValueError):
    """The request cannot be planned as asked; the message names the offending value."""
