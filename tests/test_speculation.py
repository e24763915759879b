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
    return SpeculativeSolver(executor, workers, profile, lengths, cost, None, local, min_task_s=0.0), calls


def test_cheap_tasks_are_not_sent_ahead(setting) -> None:
    """Solves and expansions go to a worker only once one of their kind took `min_task_s` here."""
    executor = HeldExecutor()
    profile, lengths, cost = setting
    solver = SpeculativeSolver(executor, 1, profile, lengths, cost, None, lambda *args: None, min_task_s=60.0)
    solver.prefetch(strategies(3))
    assert executor.submitted == []
    solver.solve(strategies(1)[0])  # timed here: far below a minute
    solver.prefetch(strategies(3))
    assert executor.submitted == []
    eager = SpeculativeSolver(executor, 1, profile, lengths, cost, None, lambda *args: None, min_task_s=0.0)
    eager.solve(strategies(1)[0])
    eager.prefetch(strategies(3))
    assert len(executor.submitted) == 2  # the slots of one worker


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


def test_the_worker_polishes_exactly_as_the_search_does(setting) -> None:
    """`polish_task` (a worker's polish from the blob, under the search's deadline) against
    `search.polish_candidate` here: the same plan, and no cut under a deadline far away."""
    import time

    from hydraplan.planner.schemas import SolverBackend
    from hydraplan.planner.search import Clock, SearchSettings, packed_candidate, polish_candidate
    from hydraplan.planner.speculation import polish_task

    profile, lengths, cost = setting
    settings = SearchSettings(backend=SolverBackend.AUTO, max_schemes=3, max_strategies_solved=16, seed=0)
    solver = SpeculativeSolver(HeldExecutor(), 1, profile, lengths, cost, None, solve_strategy)
    polished = 0
    for strategy in strategies(6):
        screened = solve_strategy(strategy, lengths, cost, None)
        if screened is None:
            continue
        # a poor dispatch to start from, so that the polish has work to do: the shortest items
        # one to each pipeline but the roomiest, which takes all the others
        roomiest = max(range(len(screened.coefs)), key=lambda index: screened.coefs[index].capacity_tokens)
        shortest = iter(np.argsort(lengths, kind="stable").tolist())
        poor = [np.array([next(shortest)]) if index != roomiest else None for index in range(len(screened.coefs))]
        given = {int(items[0]) for items in poor if items is not None}
        poor[roomiest] = np.array([item for item in range(len(lengths)) if item not in given])
        candidate = packed_candidate(strategy, screened.coefs, poor, lengths, cost, None)
        there, cut = polish_task(solver._key, solver._blob, candidate, settings, time.perf_counter() + 600)
        here = polish_candidate(candidate, lengths, cost, settings, Clock(lambda: 600.0, lambda: False))
        assert not cut
        assert there.objective_s == here.objective_s
        assert [a.tolist() for a in there.assignment] == [a.tolist() for a in here.assignment]
        polished += there.objective_s < candidate.objective_s
    assert polished >= 1  # at least one polish changed its candidate, so the comparison has teeth
