"""Interleaved 1F1B (virtual pipeline stages): the simulator (`planner.simulate`) against the
checker's independent reference (`planner.reference`), the closed form for equal micro-batches,
and Megatron-Core's order and conditions (issue 32, item 2)."""

from __future__ import annotations

import random

import pytest

from hydraplan.planner.reference import interleaved_pipeline_time_s
from hydraplan.planner.simulate import (
    check_interleaved_group,
    interleaved_operations,
    interleaved_table,
    simulate_1f1b,
    simulate_interleaved_1f1b,
)


def test_the_table_is_megatrons_documented_example() -> None:
    """`get_schedule_table`'s own example in Megatron-Core: PP 2, group 3, 5 micro-batches, v 2."""
    table = interleaved_table(5, 2, 3)
    assert [micro for micro, _ in table] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [chunk for _, chunk in table] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


@pytest.mark.parametrize(("stages", "chunks", "micro", "group"), [(4, 2, 8, 4), (3, 3, 7, 3), (2, 4, 5, 3)])
def test_every_rank_runs_each_forward_and_backward_once_forward_first(stages, chunks, micro, group) -> None:
    for rank in range(stages):
        operations = interleaved_operations(rank, stages, chunks, micro, group)
        assert sorted(operations) == sorted(
            (kind, i, c) for kind in (True, False) for i in range(micro) for c in range(chunks)
        )
        place = {operation: index for index, operation in enumerate(operations)}
        assert all(place[(True, i, c)] < place[(False, i, c)] for i in range(micro) for c in range(chunks))


def test_a_schedule_worked_by_hand() -> None:
    """PP 2, v 2, two micro-batches of stage time 2 and 4, forward half: per chunk the forwards
    and backwards take 0.5 and 1.0. Rank 0 (virtual stages 0 and 2) warms up with all four
    forwards, rank 1 (stages 1 and 3) with two. Worked by hand, the ends are:
    rank 0: F0@0 0.5, F1@0 1.5, F0@2 2.0, F1@2 3.5, B0@2 4.0, B1@2 6.5, B0@0 7.0, B1@0 8.5;
    rank 1: F0@1 1.0, F1@1 2.5, F0@3 3.0, B0@3 3.5, F1@3 4.5, B1@3 5.5, B0@1 6.0, B1@1 7.5."""
    assert simulate_interleaved_1f1b([2.0, 4.0], 2, 2, 0.5) == pytest.approx(8.5, rel=1e-12)
    assert interleaved_pipeline_time_s([2.0, 4.0], 2, 2, 0.5, 2) == pytest.approx(8.5, rel=1e-12)


@pytest.mark.parametrize(("stages", "chunks"), [(2, 2), (4, 2), (4, 4), (8, 3)])
@pytest.mark.parametrize("rounds", [1, 2, 5])
def test_equal_micro_batches_take_the_closed_form(stages, chunks, rounds) -> None:
    """Narayanan et al. (SC'21): with m equal micro-batches of stage time t the interleaved
    schedule takes (m + (pp - 1) / v) t, against (m + pp - 1) t for plain 1F1B."""
    micro, time_s = stages * rounds, 0.7
    expected = (micro + (stages - 1) / chunks) * time_s
    assert simulate_interleaved_1f1b([time_s] * micro, stages, chunks, 1 / 3) == pytest.approx(expected, rel=1e-12)
    assert simulate_1f1b([time_s] * micro, stages, 1 / 3) == pytest.approx((micro + stages - 1) * time_s, rel=1e-12)


def test_the_simulator_equals_the_reference_on_random_uneven_instances() -> None:
    rng = random.Random(7)
    compared = 0
    while compared < 150:
        stages, chunks = rng.randint(2, 5), rng.randint(2, 4)
        micro = stages * rng.randint(1, 4) + rng.choice([0, 0, stages, stages + 1])
        group = rng.choice([stages, min(micro, stages + rng.randint(1, 3))])
        try:
            check_interleaved_group(stages, micro, group)
        except ValueError:
            continue
        times = [rng.uniform(0.05, 4.0) for _ in range(micro)]
        fwd = rng.uniform(0.2, 0.5)
        simulated = simulate_interleaved_1f1b(times, stages, chunks, fwd, group)
        assert simulated == pytest.approx(interleaved_pipeline_time_s(times, stages, chunks, fwd, group), rel=1e-12)
        assert simulated >= sum(times) - 1e-9  # a rank runs every micro-batch on all its chunks
        compared += 1


def test_one_chunk_is_plain_1f1b() -> None:
    times = [0.3, 1.2, 0.8, 0.5, 2.0]
    assert simulate_interleaved_1f1b(times, 3, 1, 0.4) == simulate_1f1b(times, 3, 0.4)


@pytest.mark.parametrize(
    ("stages", "micro", "group", "named"),
    [(4, 6, 4, "last group of 2"), (4, 3, 4, "group 4, 3 micro-batches"), (4, 8, 2, "group 2"), (4, 8, 9, "group 9")],
)
def test_megatrons_conditions_on_the_group_are_refused_with_the_values(stages, micro, group, named) -> None:
    with pytest.raises(ValueError, match=named):
        simulate_interleaved_1f1b([1.0] * micro, stages, 2, 1 / 3, group)


@pytest.mark.parametrize(
    ("stages", "chunks", "rounds"), [(2, 2, 1), (2, 2, 3), (4, 2, 2), (3, 3, 2), (4, 4, 1), (5, 2, 4)]
)
def test_the_memory_models_in_flight_counts_are_the_schedules_peak(stages, chunks, rounds) -> None:
    """What `cost_models.pipeline_layout` charges each rank's memory with (micro-batches in
    flight per chunk at the rank's peak) is what the simulated order holds at its fullest."""
    from hydraplan.cost_models.pipeline_layout import in_flight_micro_batches

    micro = stages * rounds
    expected = in_flight_micro_batches(stages, chunks, micro)
    for rank in range(stages):
        held, fullest = [0] * chunks, [0] * chunks
        for forward, _, chunk in interleaved_operations(rank, stages, chunks, micro, stages):
            held[chunk] += 1 if forward else -1
            if sum(held) > sum(fullest):
                fullest = list(held)
        assert fullest == expected[rank], f"rank {rank}"
