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
