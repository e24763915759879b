"""The planning-time budget `auto`: a share of the step the plan is for.

A plan for step k+1 is computed while step k trains, so what the planner may spend is a share of
the step time, not a fixed number of seconds. Before any search the step time is not known; its
floor is: no strategy of the runnable schemes finishes the batch's pipeline work faster than the
area / longest-item bound over all of them (`BoundTables.pipeline_time_bound_s`, the same bound
the search starts from). `auto` budgets `AUTO_STEP_SHARE` of that floor, clipped to
[`AUTO_MIN_S`, `AUTO_MAX_S`]: deterministic for a request (same request, same budget), at most
half of the step the plan is for, and never so short that the search cannot reach its first
polished plan (the default work limits need ~0.3-0.6 s of CPU at 64 GPUs, measured in
benchmarks/RESULTS.md).
"""

from __future__ import annotations

import math

import numpy as np

from hydraplan.planner.bounds import BoundTables
from hydraplan.planner.cost import ProfileCostModel

AUTO = "auto"
AUTO_STEP_SHARE = 0.5
AUTO_MIN_S = 0.5
AUTO_MAX_S = 60.0


def step_time_floor_s(lengths: np.ndarray, cost: ProfileCostModel, num_gpus: int) -> float:
    """A floor under the pipeline time of any plan of these items on `num_gpus` GPUs."""
    coefs = [cost.coefficients(scheme) for scheme in cost.schemes() if scheme.num_gpus <= num_gpus]
    tables = BoundTables.build(lengths, coefs)
    return tables.pipeline_time_bound_s(range(len(coefs)), num_gpus)


def auto_budget_s(lengths: np.ndarray, cost: ProfileCostModel, num_gpus: int) -> float:
    """`AUTO_STEP_SHARE` of the step-time floor, clipped to [`AUTO_MIN_S`, `AUTO_MAX_S`]."""
    floor_s = step_time_floor_s(lengths, cost, num_gpus)
    if not math.isfinite(floor_s):  # nothing holds an item: the search says so at once
        return AUTO_MIN_S
    return round(float(min(AUTO_MAX_S, max(AUTO_MIN_S, AUTO_STEP_SHARE * floor_s))), 3)


def resolved_budget_s(time_limit_s: float | str, lengths: np.ndarray, cost: ProfileCostModel, num_gpus: int) -> float:
    """A time limit in seconds: as given, or `auto` resolved for these items."""
    return auto_budget_s(lengths, cost, num_gpus) if time_limit_s == AUTO else float(time_limit_s)
