"""hydraplan planner: pure planning of heterogeneous parallel training steps.

No IO, no globals; deterministic for a seed under its work limits. Entry points:
`planner.solve.solve`, `planner.solve.evaluate_strategy` and `planner.check.check_plan` (not
re-exported here: a `solve` attribute would hide the `planner.solve` module).
"""

from hydraplan.planner.errors import PlanningError
from hydraplan.planner.schemas import CostProfile, Plan, PlanRequest, SolverOptions
from hydraplan.planner.scheme import ParallelScheme

__all__ = ["CostProfile", "ParallelScheme", "Plan", "PlanRequest", "PlanningError", "SolverOptions"]
