"""Probes (`search.PROBE_EVERY`): the best-estimated strategy is solved ahead during the first
expansions, kept aside, and used only when the search reaches it in its own order (or when the
clock cuts the search). Counts, not clocks: the clock stands still or drops at a chosen call."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import synthetic_profile, wikipedia_like_batch

import hydraplan.planner.search as search_module
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.schemas import SolverBackend
from hydraplan.planner.search import Clock, SearchSettings, search

NUM_GPUS = 64
COST = ProfileCostModel(synthetic_profile(max_gpus=NUM_GPUS))
# seed 1: 129 scheme sets are expanded before the search proper's first solve, and the winning
# strategy is the best estimate after the first 24
LENGTHS = np.asarray(wikipedia_like_batch(600_000, seed=1), dtype=np.int64)


def settings(max_solved: int = 16) -> SearchSettings:
    return SearchSettings(SolverBackend.GREEDY, max_schemes=3, max_strategies_solved=max_solved, seed=0, thorough=False)


def standing_still() -> Clock:
    return Clock(remaining_s=lambda: 100.0, cancelled=lambda: False)


def traced_search(monkeypatch, probe_every: int, max_solved: int = 16, clock: Clock | None = None):
    """(result, solves as (expansions so far, strategy text) in call order)."""
    monkeypatch.setattr(search_module, "PROBE_EVERY", probe_every)
    solves: list[tuple[int, str]] = []
    expansions = [0]
    first_solution, expand_next = search_module._first_solution, search_module.Frontier.expand_next

    def counted_solution(strategy, *args, **kwargs):
        solves.append((expansions[0], str(strategy)))
        return first_solution(strategy, *args, **kwargs)

    def counted_expansion(self, *args, **kwargs):
        expansions[0] += 1
        return expand_next(self, *args, **kwargs)

    monkeypatch.setattr(search_module, "_first_solution", counted_solution)
    monkeypatch.setattr(search_module.Frontier, "expand_next", counted_expansion)
    result = search(LENGTHS, COST, NUM_GPUS, settings(max_solved), clock or standing_still(), 2.0)
    monkeypatch.undo()
    return result, solves


def same_plan(a, b) -> bool:
    return (
        a.best.strategy == b.best.strategy
        and a.best.objective_s == b.best.objective_s
        and all(np.array_equal(x, y) for x, y in zip(a.best.assignment, b.best.assignment))
        and a.lower_bound_s == b.lower_bound_s
        and a.num_strategies_solved == b.num_strategies_solved
        and a.runners_up == b.runners_up
    )


@pytest.mark.parametrize("max_solved", [6, 10, 16])
def test_probes_reach_the_winner_sooner_and_leave_the_uncut_plan_unchanged(monkeypatch, max_solved):
    plain, plain_solves = traced_search(monkeypatch, 0, max_solved)
    probed, probed_solves = traced_search(monkeypatch, search_module.PROBE_EVERY, max_solved)
    assert not plain.timed_out and not probed.timed_out
    assert same_plan(plain, probed)
    winner = str(probed.best.strategy)
    first_plain = next(expanded for expanded, text in plain_solves if text == winner)
    first_probed = next(expanded for expanded, text in probed_solves if text == winner)
    # without probes the winner waits for every expansion of the first pass (129 here); with them
    # it is solved at the first probe when the search is allowed its default 16 solves (with 6, the
    # winner is another strategy, which no probe picked)
    assert first_plain > 100
    assert first_probed <= first_plain
    if max_solved == 16:
        assert first_probed == search_module.PROBE_EVERY
    # the winner is not solved twice, and at most one probe per PROBE_EVERY expansions is added
    assert [text for _, text in probed_solves].count(winner) == 1
    most_probes = search_module.WorkLimits().max_expansions // search_module.PROBE_EVERY
    assert len(plain_solves) <= len(probed_solves) <= len(plain_solves) + most_probes


def test_a_probe_the_clock_cuts_after_joins_the_solved_candidates(monkeypatch):
    """The clock reaches the deadline right after the first probe: no other strategy is solved,
    and the probed winner is among the candidates (the uncut plan). Without probes the same cut
    leaves the homogeneous incumbents, a slower plan."""
    results = {}
    for probe_every in (0, search_module.PROBE_EVERY):
        left = {"s": 100.0}
        expand_next = search_module.Frontier.expand_next
        expansions = [0]

        def expand_then_drop(self, *args, _expand=expand_next, _left=left, _count=expansions, **kwargs):
            _expand(self, *args, **kwargs)
            _count[0] += 1
            if _count[0] == search_module.PROBE_EVERY + 1:
                _left["s"] = 0.0  # the deadline

        monkeypatch.setattr(search_module.Frontier, "expand_next", expand_then_drop)
        clock = Clock(remaining_s=lambda left=left: left["s"], cancelled=lambda: False)
        results[probe_every], _ = traced_search(monkeypatch, probe_every, clock=clock)
    uncut, _ = traced_search(monkeypatch, search_module.PROBE_EVERY)
    plain, probed = results[0], results[search_module.PROBE_EVERY]
    assert plain.timed_out and probed.timed_out
    assert probed.best.objective_s == uncut.best.objective_s
    assert probed.best.strategy == uncut.best.strategy
    assert plain.best.objective_s > probed.best.objective_s
