"""hydraplan planner: pure planning of heterogeneous parallel training steps.

No IO, no globals; deterministic for a seed. Entry points: `solve` and `check_plan`.
"""

from planner.errors import PlanningError
from planner.schemas import CostProfile, Plan, PlanRequest, SolverOptions
from planner.scheme import ParallelScheme

__all__ = ["CostProfile", "ParallelScheme", "Plan", "PlanRequest", "PlanningError", "SolverOptions"]
