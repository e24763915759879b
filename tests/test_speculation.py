"""Speculative strategy solves (`planner.speculation`): what the search gets for a strategy is
the same whether a worker solved it ahead, a worker was lost, or nothing was prefetched."""

from __future__ import annotations

from concurrent.futures import Executor, Future

import numpy as np
import pytest

from hydraplan.cost_models.analytic import build_profile
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.search import solve_strategy
from hydraplan.planner.speculation import IN_FLIGHT_PER_WORKER, SpeculativeSolver, solve_task
from hydraplan.planner.strategies import Strategy


class HeldExecutor(Executor):
    """Futures that stay pending until the test starts or finishes them."""

    def __init__(self) -> None:
        self.submitted: list[tuple[Strategy, Future]] = []

    def submit(self, fn, /, *args, **kwargs):
        future: Future = Future()
        self.submitted.append((args[-1], future))
        return future


def strategies(n: int) -> list[Strategy]:
    """n different strategies of 1- and 2-GPU pipelines on 16 GPUs."""
    return [Strategy.of([(ParallelScheme(1, 1, 1), 16 - 2 * k), (ParallelScheme(2, 1, 1), k)]) for k in range(n)]


@pytest.fixture
def setting():
    profile = build_profile(get_model("llama3-8b"), get_gpu("h100-sxm-80gb"), 16, 8)
    lengths = np.random.default_rng(0).integers(64, 8000, size=40)
    return profile, lengths, ProfileCostModel(profile)


def make(setting, executor, workers=1):
    calls: list[Strategy] = []

    def local(strategy, lengths, cost, previous):
        calls.append(strategy)
        return ("local", str(strategy))

    profile, lengths, cost = setting
    return SpeculativeSolver(executor, workers, profile, lengths, cost, None, local), calls


def test_prefetch_keeps_at_most_its_slots_in_flight(setting) -> None:
    executor = HeldExecutor()
    solver, _ = make(setting, executor, workers=2)
    solver.prefetch(strategies(8))
    assert [s for s, _ in executor.submitted] == strategies(8)[: 2 * IN_FLIGHT_PER_WORKER]
    solver.prefetch(strategies(8))  # all slots still busy, nothing submitted twice
    assert len(executor.submitted) == 2 * IN_FLIGHT_PER_WORKER
    executor.submitted[0][1].set_running_or_notify_cancel()
    executor.submitted[0][1].set_result("done")
    solver.prefetch(strategies(8))  # one slot free again: the next one not yet submitted
    assert [s for s, _ in executor.submitted][-1] == strategies(8)[2 * IN_FLIGHT_PER_WORKER]


def test_a_started_solve_is_taken_and_a_waiting_one_is_solved_here(setting) -> None:
    executor = HeldExecutor()
    solver, calls = make(setting, executor)
    first, second = strategies(2)
    solver.prefetch([first, second])
    (_, started), (_, waiting) = executor.submitted
    started.set_running_or_notify_cancel()
    started.set_result(("worker", str(first)))
    assert solver.solve(first) == ("worker", str(first)) and calls == []
    assert solver.solve(second) == ("local", str(second)) and calls == [second]
    assert waiting.cancelled()  # the worker will not spend time on it
    assert (solver.hits, solver.local) == (1, 1)


def test_a_lost_worker_costs_time_not_the_result(setting) -> None:
    executor = HeldExecutor()
    solver, calls = make(setting, executor)
    (strategy,) = strategies(1)
    solver.prefetch([strategy])
    future = executor.submitted[0][1]
    future.set_running_or_notify_cancel()
    future.set_exception(RuntimeError("worker died"))
    assert solver.solve(strategy) == ("local", str(strategy)) and calls == [strategy]


def test_the_worker_task_solves_exactly_what_the_search_would(setting) -> None:
    """`solve_task` (what a worker runs, from the pickled blob) against `solve_strategy` here."""
    profile, lengths, cost = setting
    solver = SpeculativeSolver(HeldExecutor(), 1, profile, lengths, cost, None, solve_strategy)
    solved = 0
    for strategy in strategies(6):
        there = solve_task(solver._key, solver._blob, strategy)
        here = solve_strategy(strategy, lengths, cost, None)
        assert (there is None) == (here is None)
        if here is not None:
            solved += 1
            assert there.objective_s == here.objective_s
            assert [a.tolist() for a in there.assignment] == [a.tolist() for a in here.assignment]
    assert solved >= 3


def test_the_worker_expands_a_set_exactly_as_the_frontier_does(setting) -> None:
    """`expand_task` (a worker's frontier, rebuilt from the blobs) against `Frontier.expansion`
    here: the same strategies in the same order with the same bounds and estimates, under a
    finite incumbent and none, and without the strategies enumerated before the first expansion."""
    from hydraplan.planner.bounds import BoundTables
    from hydraplan.planner.search import Frontier, runnable_schemes
    from hydraplan.planner.speculation import expand_task

    profile, lengths, cost = setting
    coefs = runnable_schemes(cost, 16)
    frontier = Frontier(BoundTables.build(lengths, coefs), cost, 16)
    pinned = strategies(2)[1]  # a strategy of the set of <1,1,1> and <2,1,1>, enumerated before
    frontier.push_strategies([pinned])
    solver = SpeculativeSolver(HeldExecutor(), 1, profile, lengths, cost, None, solve_strategy)
    solver.bind_frontier(frontier)
    columns = tuple(sorted(frontier.column_of[ParallelScheme(tp, 1, 1)] for tp in (1, 2)))
    compared = 0
    for incumbent_s in (float("inf"), frontier.strategies[0].bound_s * 1.5):
        here = frontier.expansion(columns, 0.0, incumbent_s)
        there = expand_task(solver._key, solver._blob, solver._frontier_blob, columns, 0.0, incumbent_s)
        assert there == here
        assert pinned not in [entry.strategy for entry in here.entries]
        compared += len(here.entries)
    assert compared >= 4
