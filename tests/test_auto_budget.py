"""`time_limit_s: auto` (`planner.budget`): half of the step-time floor, clipped, deterministic,
and reported in the plan."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError
from synthetic import synthetic_profile, wikipedia_like_batch

from hydraplan.planner.budget import AUTO_MAX_S, AUTO_MIN_S, AUTO_STEP_SHARE, auto_budget_s, step_time_floor_s
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.schemas import PlanRequest, SolverOptions
from hydraplan.planner.solve import solve

PROFILE = synthetic_profile(max_gpus=16)
COST = ProfileCostModel(PROFILE)


def test_the_floor_is_below_every_plan() -> None:
    lengths = wikipedia_like_batch(200_000, seed=3)
    floor_s = step_time_floor_s(np.array(lengths), COST, 16)
    for time_limit_s in (0.3, 2.0):
        plan = solve(
            PlanRequest(lengths=lengths, num_gpus=16, options=SolverOptions(time_limit_s=time_limit_s)), PROFILE
        )
        assert 0 < floor_s <= max(p.time_s for p in plan.pipelines)


@pytest.mark.parametrize("num_tokens", [2_000, 200_000, 20_000_000])
def test_auto_is_half_the_floor_clipped(num_tokens: int) -> None:
    lengths = np.array(wikipedia_like_batch(num_tokens, seed=1))
    budget_s = auto_budget_s(lengths, COST, 16)
    expected = min(AUTO_MAX_S, max(AUTO_MIN_S, AUTO_STEP_SHARE * step_time_floor_s(lengths, COST, 16)))
    assert budget_s == pytest.approx(expected, abs=5e-4) and AUTO_MIN_S <= budget_s <= AUTO_MAX_S


def test_scaling_the_batch_scales_the_budget() -> None:
    """Twice the tokens, about twice the floor: the budget follows the step, not a constant."""
    small = auto_budget_s(np.array(wikipedia_like_batch(2_000_000, seed=2)), COST, 16)
    large = auto_budget_s(np.array(wikipedia_like_batch(4_000_000, seed=2)), COST, 16)
    assert AUTO_MIN_S < small < large < AUTO_MAX_S and large == pytest.approx(2 * small, rel=0.2)


def test_an_auto_plan_reports_its_budget_and_is_reproducible() -> None:
    lengths = wikipedia_like_batch(300_000, seed=4)
    request = PlanRequest(lengths=lengths, num_gpus=16, options=SolverOptions(time_limit_s="auto"))
    plan = solve(request, PROFILE)
    assert plan.solver.time_limit_s == auto_budget_s(np.array(lengths), COST, 16)
    again = solve(request, PROFILE)
    if not (plan.solver.cut_by_clock or again.solver.cut_by_clock):
        assert again.plan_id == plan.plan_id
    fixed = solve(request.model_copy(update={"options": SolverOptions(time_limit_s=1.25)}), PROFILE)
    assert fixed.solver.time_limit_s == 1.25


@pytest.mark.parametrize("value", ["fast", 0, -1, 601, float("inf")])
def test_anything_else_is_refused(value) -> None:
    with pytest.raises(ValidationError):
        SolverOptions(time_limit_s=value)
