"""Strategy pools chosen over sample batches."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import synthetic_profile, wikipedia_like_batch

from hydraplan.planner.errors import PlanningError
from hydraplan.planner.pools import _facility_location, propose_pool
from hydraplan.planner.schemas import PlanRequest, SolverOptions


def test_facility_location_picks_the_rows_that_cover_the_columns():
    times = np.array([[1.0, 9.0, 9.0], [9.0, 1.0, 9.0], [9.0, 9.0, 1.0], [5.0, 5.0, 5.0]])
    assert _facility_location(times, 1) == [3]
    assert sorted(_facility_location(times, 3)) == [0, 1, 2]


def test_pool_is_no_worse_than_its_best_single_strategy_and_no_better_than_unrestricted():
    profile = synthetic_profile(max_gpus=16)
    batches = [wikipedia_like_batch(30_000, seed=seed) for seed in range(4)]
    template = PlanRequest(lengths=[1], num_gpus=16, options=SolverOptions(solver="greedy", max_strategies_solved=6))
    pool = propose_pool(batches, profile, template, pool_size=2)
    assert 1 <= len(pool.members) <= 2 and pool.num_batches == 4
    assert pool.unrestricted_step_time_s <= pool.expected_step_time_s <= pool.best_single_step_time_s + 1e-12
    assert sum(member.share for member in pool.members) == pytest.approx(1.0)
    assert all(member.strategy.num_gpus == 16 for member in pool.members)


def test_pool_rejects_bad_sizes_and_empty_samples():
    template = PlanRequest(lengths=[1], num_gpus=16)
    with pytest.raises(PlanningError, match="pool_size must be >= 1, got 0"):
        propose_pool([[100] * 20], synthetic_profile(max_gpus=16), template, pool_size=0)
    with pytest.raises(PlanningError, match="no sample batches"):
        propose_pool([], synthetic_profile(max_gpus=16), template, pool_size=2)


def test_the_candidates_are_solved_on_the_batches_only_while_the_budget_lasts(monkeypatch):
    # 100,000 sample batches under `--budget-s 1` once ran for hours: the matrix of every candidate
    # on every batch was not under the budget. Now the first row always is solved, the others only
    # while the clock has time left, and the pool is chosen from those rows
    import hydraplan.planner.pools as pools

    profile = synthetic_profile(max_gpus=16)
    batches = [wikipedia_like_batch(30_000, seed=seed) for seed in range(3)]
    template = PlanRequest(lengths=[1], num_gpus=16, options=SolverOptions(solver="greedy", max_strategies_solved=6))
    left = [100.0]
    solved = []
    real = pools._step_time

    def step_time(strategy, lengths, cost):
        solved.append(strategy)
        left[0] = 0.0  # the budget runs out during the first row
        return real(strategy, lengths, cost)

    monkeypatch.setattr(pools, "_step_time", step_time)
    pool = propose_pool(batches, profile, template, pool_size=2, clock=lambda: left[0])
    assert pool.num_candidates > 1 and pool.num_evaluated == 1
    assert len(solved) == len(batches) and len(pool.members) == 1 and pool.members[0].strategy == solved[0]
    # the first row is the first batch's best strategy, which serves every batch
    assert pool.members[0].share == 1.0


def test_more_sample_batches_than_the_limit_are_refused_before_any_search():
    from hydraplan.planner.pools import MAX_POOL_BATCHES

    template = PlanRequest(lengths=[1], num_gpus=16)
    with pytest.raises(PlanningError, match=f"{MAX_POOL_BATCHES + 1} sample batches: at most {MAX_POOL_BATCHES}"):
        propose_pool([[100] * 20] * (MAX_POOL_BATCHES + 1), synthetic_profile(max_gpus=16), template, pool_size=2)
