"""The search's pace at scale: solves are not starved by expansions (`STRATEGIES_PER_SOLVE`)."""

from __future__ import annotations

import dataclasses

import numpy as np
from synthetic import synthetic_profile, wikipedia_like_batch

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
    assert search.WorkLimits.for_budget(600.0) == scaled  # no further
    assert (
        search.WorkLimits.for_budget(search.WORK_REFERENCE_BUDGET_S / 2).max_expansions == defaults.max_expansions // 2
    )


def test_a_longer_budget_expands_more_sets_but_not_past_the_enumeration_cap(monkeypatch) -> None:
    """Above the reference budget, expansions beyond MAX_EXPANSIONS go on only while fewer
    strategies than `max_enumerated` are enumerated; the clock decides nothing here."""
    profile = synthetic_profile(max_gpus=64)
    lengths = wikipedia_like_batch(300_000, seed=5)

    def enumerated(time_limit_s: float) -> tuple[int, bool]:
        options = SolverOptions(solver="greedy", time_limit_s=time_limit_s)
        plan = solve(PlanRequest(lengths=lengths, num_gpus=64, gpus_per_node=8, options=options), profile)
        return plan.solver.num_strategies, plan.solver.cut_by_clock

    with monkeypatch.context() as patch:
        patch.setattr(search, "STRATEGIES_PER_SOLVE", 10**9)  # expansions stop at their own limits only
        reference, cut = enumerated(search.WORK_REFERENCE_BUDGET_S * 30)
        assert not cut
        patch.setattr(search, "MAX_WORK_SCALE", 1.0)
        default, cut = enumerated(search.WORK_REFERENCE_BUDGET_S * 30)
        assert not cut
    assert reference > default  # the longer budget's extra expansions enumerated more
    scaled = search.WorkLimits.for_budget  # the cap binds at once past MAX_EXPANSIONS:
    capped_limits = classmethod(lambda cls, budget_s: dataclasses.replace(scaled(budget_s), max_enumerated=1))
    monkeypatch.setattr(search.WorkLimits, "for_budget", capped_limits)
    monkeypatch.setattr(search, "STRATEGIES_PER_SOLVE", 10**9)
    capped, cut = enumerated(search.WORK_REFERENCE_BUDGET_S * 30)
    assert not cut and capped == default
