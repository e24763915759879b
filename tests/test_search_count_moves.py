"""The search at scale: the best solved strategy with many pipelines of a scheme moves GPUs between
its schemes after the search proper (`search._moves`, `search._count_moves`)."""

from __future__ import annotations

import types

import pytest

from hydraplan.planner import search
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.strategies import Strategy

A = ParallelScheme(2, 1, 2)  # 4 GPUs
B = ParallelScheme(1, 1, 2)  # 2 GPUs
C = ParallelScheme(1, 1, 1)  # 1 GPU


def strategy(a: int, b: int, c: int) -> Strategy:
    return Strategy.of({scheme: count for scheme, count in ((A, a), (B, b), (C, c)) if count})


def candidate(plan: Strategy, objective_s: float, origin: str = "search"):
    return types.SimpleNamespace(strategy=plan, objective_s=objective_s, origin=origin)


@pytest.mark.parametrize("step", [1, 2, 16])
def test_moves_keep_the_gpus_and_a_pipeline_of_each_scheme(step):
    start = strategy(92, 68, 520)
    moves = search._moves(start, step)
    assert len(moves) == 6  # every ordered pair of the three schemes
    for move in moves:
        assert move.num_gpus == start.num_gpus and len(move.counts) == 3
        changed = {scheme for scheme, count in move.counts if dict(start.counts)[scheme] != count}
        assert len(changed) == 2  # GPUs go from one scheme to one other, in whole lcm groups
    a_from_c = Strategy.of({A: 92 + step, B: 68, C: 520 - 4 * step})
    assert a_from_c in moves
    # a move that would empty a scheme is left out
    assert all(dict(move.counts)[A] >= 1 for move in search._moves(strategy(2, 68, 520), 2))
    assert len(search._moves(strategy(2, 68, 520), 2)) == 4  # both moves taking two <A> away


def test_count_moves_descend_to_a_better_strategy_within_their_budget():
    # a screen whose objective falls towards 104 <A> pipelines and 60 <B>: the descent from the
    # search's best (92, 68) finds it by large then small steps, under its budget of solves
    calls = []

    def objective(plan: Strategy) -> float:
        counts = dict(plan.counts)
        return 1.8 + 0.001 * abs(counts.get(A, 0) - 104) + 0.0005 * abs(counts.get(B, 0) - 60)

    def first_solution(plan: Strategy):
        calls.append(plan)
        return candidate(plan, objective(plan))

    start = strategy(92, 68, 1024 - 4 * 92 - 2 * 68)
    solved = [candidate(start, objective(start))]
    result = search._count_moves(solved, first_solution, 60, lambda: False)
    assert result[0].strategy == strategy(104, 60, 1024 - 4 * 104 - 2 * 60)
    assert len(calls) <= 60 and len(set(calls)) == len(calls)  # each move solved once
    assert [c.objective_s for c in result] == sorted(c.objective_s for c in result)
    # the budget and the clock both end it
    calls.clear()
    search._count_moves(solved, first_solution, 3, lambda: False)
    assert len(calls) == 3
    calls.clear()
    search._count_moves(solved, first_solution, 60, lambda: True)
    assert not calls


def test_count_moves_start_only_where_a_scheme_runs_many_pipelines_from_the_best_such_strategy():
    calls = []

    def first_solution(plan: Strategy):
        calls.append(plan)
        return candidate(plan, 5.0)  # never better: the start spends the whole budget

    few = [candidate(strategy(4, 10, 4), 1.0)]  # 20 GPUs in all: no scheme of 50 pipelines
    assert search._count_moves(few, first_solution, 10, lambda: False) == few and not calls
    two_sets = [candidate(strategy(92, 68, 520), 1.0), candidate(Strategy.of({A: 100, C: 624}), 1.1)]
    search._count_moves(two_sets, first_solution, 7, lambda: False)
    assert len(calls) == 7 and all(B in dict(p.counts) for p in calls)  # every move from the best set


def test_a_search_with_moves_plans_no_worse_and_solves_the_moves(monkeypatch):
    # an 8B / 64 H100 batch with the threshold lowered so that its strategies qualify: the moves are
    # solved within their work limit, their candidates join the solved ones, and on this batch the
    # plan is no slower than without them (the clock stands still: the work limits decide)
    import hydraplan.planner.solve as solve_module
    from hydraplan.api.datasets import sample_batch
    from hydraplan.cost_models.analytic import build_profile
    from hydraplan.cost_models.catalog import get_gpu, get_model
    from hydraplan.planner.schemas import PlanRequest, SolverOptions

    profile = build_profile(get_model("llama3-8b"), get_gpu("h100-sxm-80gb"), 64, 8)
    lengths = sample_batch("wikipedia", 200_000, 0, 32 * 1024)
    options = SolverOptions(solver="lp", time_limit_s=1.0, seed=0, oversize="split")
    request = PlanRequest(lengths=lengths, num_gpus=64, gpus_per_node=8, options=options)
    monkeypatch.setattr(solve_module, "time", types.SimpleNamespace(perf_counter=lambda: 0.0))
    without = solve_module.solve(request, profile)
    moved = []
    real = search._count_moves

    def spy(solved, first_solution, most, time_up):
        def counted(plan):
            moved.append(plan)
            return first_solution(plan)

        return real(solved, counted, most, time_up)

    monkeypatch.setattr(search, "_count_moves", spy)
    monkeypatch.setattr(search, "MANY_PIPELINES", 4)
    with_moves = solve_module.solve(request, profile)
    assert moved and len(moved) <= search.WorkLimits.for_budget(1.0).count_moves
    assert with_moves.objective_s <= without.objective_s * (1 + 1e-12)
