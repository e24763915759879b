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
# on 32 GPUs, seed 2: the winner is probed first and the LP polish improves it (0.6308 -> 0.6305 s)
SMALL_COST = ProfileCostModel(synthetic_profile(max_gpus=32))
SMALL_LENGTHS = np.asarray(wikipedia_like_batch(300_000, seed=2), dtype=np.int64)


def settings(max_solved: int = 16, backend: SolverBackend = SolverBackend.GREEDY) -> SearchSettings:
    return SearchSettings(backend, max_schemes=3, max_strategies_solved=max_solved, seed=0, thorough=False)


def standing_still() -> Clock:
    return Clock(remaining_s=lambda: 100.0, cancelled=lambda: False)


def traced_search(
    monkeypatch,
    probe_every: int,
    max_solved: int = 16,
    clock: Clock | None = None,
    backend: SolverBackend = SolverBackend.GREEDY,
    early_polish: bool = True,
    small: bool = False,
):
    """(result, solves as (expansions so far, strategy text) in call order)."""
    monkeypatch.setattr(search_module, "PROBE_EVERY", probe_every)
    monkeypatch.setattr(search_module, "EARLY_POLISHES", search_module.EARLY_POLISHES if early_polish else 0)
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
    lengths, cost, num_gpus = (SMALL_LENGTHS, SMALL_COST, 32) if small else (LENGTHS, COST, NUM_GPUS)
    result = search(lengths, cost, num_gpus, settings(max_solved, backend), clock or standing_still(), 2.0)
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


class LateClock:
    """Seconds left: 1.8 at the first reading (the search's start), 1.2 from then on: past
    EARLY_POLISH_AFTER_SHARE of the search's time, yet above every reserve at a 2 s budget."""

    def __init__(self) -> None:
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        return 1.8 if self.readings == 1 else 1.2


def dropping_clock(monkeypatch, after_expansions: int, late: bool = False) -> Clock:
    """A clock standing still (or a `LateClock` with `late`), at the deadline from the
    `after_expansions`-th expansion's end on."""
    left = {"s": None}
    before = LateClock() if late else (lambda: 100.0)
    expand_next = search_module.Frontier.expand_next
    count = [0]

    def expand_then_drop(self, *args, **kwargs):
        expand_next(self, *args, **kwargs)
        count[0] += 1
        if count[0] == after_expansions:
            left["s"] = 0.0

    monkeypatch.setattr(search_module.Frontier, "expand_next", expand_then_drop)
    return Clock(remaining_s=lambda: before() if left["s"] is None else left["s"], cancelled=lambda: False)


def test_the_early_polish_leaves_the_uncut_plan_unchanged_and_survives_a_cut(monkeypatch):
    """LP backend, a `LateClock` (past EARLY_POLISH_AFTER_SHARE, yet nothing is cut): with the
    early polish of the best candidate after the first probe, the plan is the same as without it
    (the polish at the end takes the kept one: one polish fewer there); when the clock reaches the
    deadline right after the first probe, the plan is the probed strategy polished, not merely
    screened."""
    polishes = [0]
    polish = search_module.polish_candidate

    def counted_polish(*args, **kwargs):
        polishes[0] += 1
        return polish(*args, **kwargs)

    monkeypatch.setattr(search_module, "polish_candidate", counted_polish)
    counts = {}
    uncut = {}
    for early in (False, True):
        polishes[0] = 0
        late = Clock(remaining_s=LateClock(), cancelled=lambda: False)
        uncut[early], _ = traced_search(
            monkeypatch, search_module.PROBE_EVERY, clock=late, backend=SolverBackend.LP, early_polish=early, small=True
        )
        monkeypatch.setattr(search_module, "polish_candidate", counted_polish)
        counts[early] = polishes[0]
    assert not uncut[True].timed_out and same_plan(uncut[False], uncut[True])
    assert counts[False] == search_module.NUM_POLISHED_BRIEF == counts[True]  # the early one was used
    cut = {}
    for early in (False, True):
        clock = dropping_clock(monkeypatch, search_module.PROBE_EVERY + 1, late=True)
        cut[early], _ = traced_search(
            monkeypatch,
            search_module.PROBE_EVERY,
            clock=clock,
            backend=SolverBackend.LP,
            early_polish=early,
            small=True,
        )
    assert cut[False].timed_out and cut[True].timed_out
    assert cut[False].best.strategy == cut[True].best.strategy == uncut[True].best.strategy
    # without the early polish the deadline leaves the probe's screened candidate; with it, its polish
    assert cut[True].best.objective_s < cut[False].best.objective_s
    assert cut[True].best.objective_s <= uncut[True].best.objective_s * (1 + 1e-9)


def test_no_early_polish_while_the_search_is_within_its_early_share(monkeypatch):
    """The clock standing at 100 s left: no polish ahead (the final polish does them all)."""
    polishes = []
    polish = search_module.polish_candidate

    def counted_polish(candidate, *args, **kwargs):
        polishes.append(len(polishes))
        return polish(candidate, *args, **kwargs)

    monkeypatch.setattr(search_module, "polish_candidate", counted_polish)
    result, _ = traced_search(monkeypatch, search_module.PROBE_EVERY, backend=SolverBackend.LP, small=True)
    assert not result.timed_out
    assert len(polishes) == search_module.NUM_POLISHED_BRIEF
