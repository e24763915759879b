"""The search's pace at scale: solves are not starved by expansions (`STRATEGIES_PER_SOLVE`)."""

from __future__ import annotations

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
