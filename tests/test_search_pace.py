"""The search's pace at scale: solves are not starved by expansions (`STRATEGIES_PER_SOLVE`)."""

from __future__ import annotations

import dataclasses

import numpy as np
from synthetic import synthetic_profile, wikipedia_like_batch

from hydraplan.cost_models.analytic import build_profile
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.planner import search
from hydraplan.planner.schemas import PlanRequest, SolverOptions
from hydraplan.planner.solve import solve


def test_no_more_than_the_cap_of_strategies_is_enumerated_between_two_solves(monkeypatch):
    profile = synthetic_profile(max_gpus=64)
    lengths = wikipedia_like_batch(400_000, seed=3)
    request = PlanRequest(
        lengths=lengths, num_gpus=64, gpus_per_node=8, options=SolverOptions(solver="greedy", time_limit_s=60.0)
    )
    frontiers: list[search.Frontier] = []
    enumerated_at_solves: list[int] = []
    original_init, original_first = search.Frontier.__init__, search._first_solution

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        frontiers.append(self)

    def first_solution(strategy, *args, **kwargs):
        enumerated_at_solves.append(len(frontiers[-1].strategies))
        return original_first(strategy, *args, **kwargs)

    monkeypatch.setattr(search.Frontier, "__init__", init)
    monkeypatch.setattr(search, "_first_solution", first_solution)
    uncapped = solve(request, profile)
    counts_uncapped = list(enumerated_at_solves)
    cap = 60
    monkeypatch.setattr(search, "STRATEGIES_PER_SOLVE", cap)
    frontiers.clear()
    enumerated_at_solves.clear()
    capped = solve(request, profile)
    assert not uncapped.solver.cut_by_clock and not capped.solver.cut_by_clock
    # without the cap more than `cap` strategies came between two solves somewhere (else the test
    # would prove nothing); with it, at most `cap` plus the last expanded set's strategies
    assert max(np.diff(counts_uncapped)) > cap
    largest_set = search.MAX_STRATEGIES_PER_SET
    gaps = np.diff(enumerated_at_solves)
    assert (gaps <= cap + largest_set).all()
    assert max(np.diff(enumerated_at_solves)) < max(np.diff(counts_uncapped))
    assert capped.lower_bound_s <= capped.objective_s


def test_the_work_limits_follow_the_budget_up_to_a_cap() -> None:
    defaults = search.WorkLimits()
    assert search.WorkLimits.for_budget(search.WORK_REFERENCE_BUDGET_S) == defaults
    scaled = search.WorkLimits.for_budget(search.WORK_REFERENCE_BUDGET_S * search.MAX_WORK_SCALE)
    assert scaled.max_expansions == defaults.max_expansions * search.MAX_WORK_SCALE
    assert scaled.refine_rounds == defaults.refine_rounds * search.MAX_WORK_SCALE
    assert scaled.polished == defaults.polished * search.MAX_WORK_SCALE  # more strategies polished too
    assert search.WorkLimits.for_budget(600.0) == scaled  # no further
    # the bounds' steps grow faster from twice the reference budget on, never at the default
    assert scaled.bound_steps == defaults.bound_steps * search.MAX_WORK_SCALE * search.DEEPER_BOUND_STEPS_FACTOR
    assert search.WorkLimits.for_budget(search.WORK_REFERENCE_BUDGET_S * 1.5).bound_steps == int(
        defaults.bound_steps * 1.5
    )
    assert (
        search.WorkLimits.for_budget(search.WORK_REFERENCE_BUDGET_S / 2).max_expansions == defaults.max_expansions // 2
    )


def test_expansions_past_the_default_count_go_on_only_while_cheap(monkeypatch) -> None:
    """Beyond `max_expansions`, up to `max_extra_expansions` more sets are expanded, each only
    while the strategies enumerated times the distinct lengths stay below `max_enumerated_rows`
    (both grow with the budget); the clock decides nothing here."""
    profile = build_profile(get_model("llama-32b"), get_gpu("a100-80gb"), 64, 8)
    lengths = wikipedia_like_batch(150_000, seed=5)  # ~150 sequences: cheap expansions
    scaled = search.WorkLimits.for_budget

    def enumerated(work_scale: float, **limits) -> int:
        """Strategies enumerated under the work limits of this scale; a budget the clock never
        reaches (the work scale is what a budget of work_scale x 2 s would give)."""
        time_limit_s = 60.0
        with monkeypatch.context() as patch:
            patch.setattr(search, "MAX_WORK_SCALE", work_scale)
            patch.setattr(search, "STRATEGIES_PER_SOLVE", 10**9)  # expansions stop at their own limits only
            patch.setattr(
                search.WorkLimits,
                "for_budget",
                classmethod(lambda cls, budget_s: dataclasses.replace(scaled(budget_s), **limits)),
            )
            options = SolverOptions(solver="greedy", time_limit_s=time_limit_s)
            plan = solve(PlanRequest(lengths=lengths, num_gpus=64, gpus_per_node=8, options=options), profile)
        assert not plan.solver.cut_by_clock
        return plan.solver.num_strategies

    default_count = enumerated(1.0, max_extra_expansions=0)
    rows_capped = enumerated(1.0, max_enumerated_rows=1)
    extra = enumerated(1.0)
    longer = enumerated(search.MAX_WORK_SCALE)
    assert rows_capped == default_count  # the cap binds at once past the default count
    assert extra > default_count  # cheap extra expansions enumerated more strategies
    assert longer >= extra
