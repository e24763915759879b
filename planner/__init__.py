"""hydraplan planner: pure planning of heterogeneous parallel training steps.

No IO, no globals; deterministic for a seed under its work limits. Entry points: `solve`,
`evaluate_strategy` and `check_plan`.
"""

from planner.check import check_plan
from planner.errors import PlanningError
from planner.scheme import ParallelScheme
from planner.schemas import CostProfile, Plan, PlanRequest, SolverOptions
from planner.solve import evaluate_strategy, solve

__all__ = [
    "CostProfile",
    "ParallelScheme",
    "Plan",
    "PlanRequest",
    "PlanningError",
    "SolverOptions",
    "check_plan",
    "evaluate_strategy",
    "solve",
]
