"""The exact 1F1B simulation against closed forms and an independent reference simulator."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydraplan.planner.simulate import approximate_1f1b_s, schedule_1f1b, simulate_1f1b, stage_operations


def reference_1f1b(times: list[float], num_stages: int, fwd_fraction: float) -> float:
    """Event-driven reference: repeatedly start any operation whose predecessors have ended."""
    num = len(times)
    if num == 0:
        return 0.0
    ends: dict[tuple[str, int, int], float] = {}
    queues = [stage_operations(j, num_stages, num) for j in range(num_stages)]
    free = [0.0] * num_stages
    while any(queues):
        for stage in range(num_stages):
            while queues[stage]:
                forward, index = queues[stage][0]
                if forward:
                    dependency = ("F", stage - 1, index) if stage else None
                elif stage == num_stages - 1:
                    dependency = ("F", stage, index)
                else:
                    dependency = ("B", stage + 1, index)
                if dependency is not None and dependency not in ends:
                    break
                ready = ends.get(dependency, 0.0) if dependency else 0.0
                duration = times[index] * (fwd_fraction if forward else 1 - fwd_fraction)
                free[stage] = max(free[stage], ready) + duration
                ends[("F" if forward else "B", stage, index)] = free[stage]
                queues[stage].pop(0)
    return max(ends[("B", 0, index)] for index in range(num))


def test_stage_operations_follow_1f1b():
    assert stage_operations(0, 4, 6) == [
        (True, 0),
        (True, 1),
        (True, 2),
        (True, 3),
        (False, 0),
        (True, 4),
        (False, 1),
        (True, 5),
        (False, 2),
        (False, 3),
        (False, 4),
        (False, 5),
    ]
    assert stage_operations(3, 4, 2) == [(True, 0), (False, 0), (True, 1), (False, 1)]
    assert stage_operations(0, 4, 2) == [(True, 0), (True, 1), (False, 0), (False, 1)]


# (300, 2) and (2, 300): more operations per stage, and more stages, than CPython keeps as shared small ints
@pytest.mark.parametrize("num_micro_batches,num_stages", [(8, 4), (2, 4), (1, 8), (16, 1), (5, 5), (300, 2), (2, 300)])
def test_uniform_micro_batches_take_m_plus_pp_minus_one_slots(num_micro_batches, num_stages):
    time_s = simulate_1f1b([0.5] * num_micro_batches, num_stages, 1 / 3)
    assert time_s == pytest.approx((num_micro_batches + num_stages - 1) * 0.5)


def test_uneven_micro_batches_worked_example():
    # pp=2, fwd 1/3: mb0 (3 s) then three 1 s micro-batches, computed by hand:
    # stage0 F0 0-1, F1 1-1.33; stage1 F0 1-2, B0 2-4; stage0 B0 4-6, F2 6-6.33 ...
    assert simulate_1f1b([3.0, 1.0, 1.0, 1.0], 2, 1 / 3) == pytest.approx(9.0)


def test_empty_pipeline_takes_no_time():
    assert simulate_1f1b([], 4, 1 / 3) == 0.0
    assert approximate_1f1b_s([], 4) == 0.0


def test_the_packing_estimate_is_the_work_plus_pp_minus_one_largest():
    """`approximate_1f1b_s` ranks packings: stage work plus a bubble of pp - 1 largest stage times
    (no test pinned it down before: its mutants survived the mutation run)."""
    assert approximate_1f1b_s([1.0, 2.0, 3.0], 3) == 6.0 + 2 * 3.0
    assert approximate_1f1b_s([1.0, 2.0, 3.0], 1) == 6.0  # one stage: no bubble


@settings(max_examples=150, deadline=None)
@given(
    times=st.lists(st.floats(min_value=1e-4, max_value=10.0), min_size=1, max_size=24),
    num_stages=st.integers(min_value=1, max_value=8),
    fwd_fraction=st.floats(min_value=0.1, max_value=0.9),
)
def test_simulation_matches_reference_and_bounds(times, num_stages, fwd_fraction):
    time_s = simulate_1f1b(times, num_stages, fwd_fraction)
    assert time_s == pytest.approx(reference_1f1b(times, num_stages, fwd_fraction), rel=1e-9)
    # stage 0 runs every operation; each micro-batch crosses all stages forwards and backwards
    assert time_s >= sum(times) * (1 - 1e-12)
    assert time_s >= num_stages * max(times) * (1 - 1e-12)
    # and 1F1B never needs more than the GPipe-style (m + pp - 1) * max slots
    assert time_s <= (len(times) + num_stages - 1) * max(times) * (1 + 1e-9)


def test_schedule_worked_example_blocks():
    # the hand-computed example above: pp=2, fwd 1/3, micro-batches of 3, 1, 1, 1 s
    blocks = {
        (b.is_forward, b.stage, b.micro_batch): (b.start_s, b.end_s) for b in schedule_1f1b([3.0, 1, 1, 1], 2, 1 / 3)
    }
    assert blocks[(True, 0, 0)] == pytest.approx((0.0, 1.0))
    assert blocks[(True, 0, 1)] == pytest.approx((1.0, 4 / 3))
    assert blocks[(True, 1, 0)] == pytest.approx((1.0, 2.0))
    assert blocks[(False, 1, 0)] == pytest.approx((2.0, 4.0))
    assert blocks[(False, 0, 0)] == pytest.approx((4.0, 6.0))
    assert blocks[(True, 0, 2)] == pytest.approx((6.0, 6 + 1 / 3))
    assert blocks[(False, 0, 3)][1] == pytest.approx(9.0)
    assert len(blocks) == 16


def test_schedule_of_no_micro_batches_is_empty():
    assert schedule_1f1b([], 4, 1 / 3) == []


@settings(max_examples=120, deadline=None)
@given(
    times=st.lists(st.floats(min_value=1e-4, max_value=10.0), min_size=1, max_size=16),
    num_stages=st.integers(min_value=1, max_value=6),
    fwd_fraction=st.floats(min_value=0.1, max_value=0.9),
)
def test_schedule_blocks_are_the_simulation(times, num_stages, fwd_fraction):
    blocks = schedule_1f1b(times, num_stages, fwd_fraction)
    assert len(blocks) == 2 * num_stages * len(times)
    makespan = simulate_1f1b(times, num_stages, fwd_fraction)
    assert max(block.end_s for block in blocks) == pytest.approx(makespan, rel=1e-12)
    ends = {}
    for stage in range(num_stages):
        on_stage = [block for block in blocks if block.stage == stage]
        # the stage runs its operations in 1F1B order, one at a time, each as long as its share
        assert [(b.is_forward, b.micro_batch) for b in on_stage] == stage_operations(stage, num_stages, len(times))
        for before, after in zip(on_stage, on_stage[1:]):
            assert after.start_s >= before.end_s
        for block in on_stage:
            share = fwd_fraction if block.is_forward else 1 - fwd_fraction
            assert block.end_s - block.start_s == pytest.approx(times[block.micro_batch] * share, rel=1e-9, abs=1e-15)
            ends[(block.is_forward, stage, block.micro_batch)] = block
    for (is_forward, stage, index), block in ends.items():
        if is_forward and stage > 0:
            assert block.start_s >= ends[(True, stage - 1, index)].end_s
        if not is_forward:
            waited = ends[(True, stage, index)] if stage == num_stages - 1 else ends[(False, stage + 1, index)]
            assert block.start_s >= waited.end_s
    # and a block waits only as long as its predecessors make it: the schedule is tight
    assert min(block.start_s for block in blocks) == 0.0
