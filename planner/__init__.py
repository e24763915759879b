"""hydraplan planner: pure planning of heterogeneous parallel training steps.

No IO, no globals; deterministic for a seed. Entry points: `solve` and `check_plan`.
"""

from planner.errors import PlanningError
from planner.scheme import ParallelScheme
from planner.schemas import CostProfile, Plan, PlanRequest, SolverOptions

__all__ = ["CostProfile", "ParallelScheme", "Plan", "PlanRequest", "PlanningError", "SolverOptions"]
