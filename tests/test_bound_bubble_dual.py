"""The bubble-floor pieces of the bound code pinned on tiny instances: the dual raise of
`BoundTables._bubble_dual` (its rounds, cutoff, empty-pipeline and longest-item terms), the
micro-batch caps it uses, the longest-item floor, the bubble pricing of set bounds where the
capacity pricing wins, and the coarsened rows. Expected values are worked out here from the
formulas of `planner.bounds`' docstrings; the pipeline floor `g` comes from `planner.bubble_floor`
(its own tests check it) and is inverted here by bisection, and the plans' times from the
independent 1F1B recursion of `planner.reference`."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from hydraplan.planner.bounds import BoundTables, simplex_grid
from hydraplan.planner.bubble_floor import pipeline_time_floor_s
from hydraplan.planner.cost import SchemeCoefficients
from hydraplan.planner.reference import pipeline_time_s
from hydraplan.planner.scheme import ParallelScheme

# a four-stage pipeline of one GPU per stage, a two-stage one of two GPUs per stage that holds
# longer items, and one GPU with a short capacity
FOUR = SchemeCoefficients(ParallelScheme(1, 4, 1), a=1e-9, b=1e-4, c=0.01, fwd_fraction=1 / 3,
                          capacity_tokens=4_000, grad_bytes_per_gpu=1e9)  # fmt: skip
TWO = SchemeCoefficients(ParallelScheme(2, 2, 1), a=2e-9, b=3e-5, c=0.02, fwd_fraction=1 / 3,
                         capacity_tokens=8_000, grad_bytes_per_gpu=1e9)  # fmt: skip
SINGLE = SchemeCoefficients(ParallelScheme(1, 1, 1), a=1e-8, b=1e-4, c=0.01, fwd_fraction=1 / 3,
                            capacity_tokens=1_000, grad_bytes_per_gpu=1e9)  # fmt: skip


def work(coef: SchemeCoefficients, length: float) -> float:
    return coef.a * length * length + coef.b * length


def most_work(coef: SchemeCoefficients, time_s: float, most_micro_batches: int) -> float:
    """G(T), the most work a pipeline of at most `most_micro_batches` micro-batches finishes by
    T, by bisection on the increasing floor g; 0 where even an empty load does not fit."""

    def floor(load: float) -> float:
        return float(pipeline_time_floor_s(coef, load, most_micro_batches))

    if floor(0.0) > time_s:
        return 0.0
    low, high = 0.0, time_s  # g(W) >= W
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if floor(middle) <= time_s else (low, middle)
    return low


def longest_item_floor(coef: SchemeCoefficients, item_s: float) -> float:
    """E_s = c + (pp-1)((1-2f)(c + w(l*)) + f c): the largest micro-batch's path floor."""
    pp, f, c = coef.scheme.pp, coef.fwd_fraction, coef.c
    return c + (pp - 1) * (max(0.0, 1 - 2 * f) * (c + item_s) + f * c)


def one_scheme_dual(coef: SchemeCoefficients, lengths, pipelines, starts, rounds: int = 2) -> list[float]:
    """The bubble dual of `_bubble_dual` for one scheme (its only multiplier is 1), rows of
    pipeline counts at once: from T0, each pipeline carries at most G(T0) and so idles
    K = T0 - G(T0); the one holding the longest item idles (E - K)^+ more, so
    T >= (sum w + n K + (E - K)^+) / n. A round is taken only while some row rises by more
    than a millionth; the caps are `items - pipelines + 1` micro-batches."""
    total = sum(work(coef, length) for length in lengths)
    extra = longest_item_floor(coef, work(coef, max(lengths)))
    bounds = list(starts)
    for _ in range(rounds):
        raised = []
        for n, bound in zip(pipelines, bounds):
            idle = bound - most_work(coef, bound, len(lengths) - n + 1)
            raised.append((total + n * idle + max(extra - idle, 0.0)) / n)
        if not any(new > old * (1 + 1e-6) for new, old in zip(raised, bounds)):
            break
        bounds = [max(old, new) for new, old in zip(raised, bounds)]
    return bounds


def bubble_dual(tables: BoundTables, pipelines, starts, cutoffs=None) -> np.ndarray:
    """`_bubble_dual` of scheme 0 alone, on the grid `count_bounds` gives one scheme."""
    counts = np.array([[float(n)] for n in pipelines])
    grid = np.vstack([simplex_grid(1, 12), [[1.0]]])
    cutoffs = np.full(len(starts), math.inf) if cutoffs is None else np.asarray(cutoffs, dtype=np.float64)
    return tables._bubble_dual([0], counts, grid, np.asarray(starts, dtype=np.float64), cutoffs)


def fluid_start(coef: SchemeCoefficients, lengths, n: int) -> float:
    """The fluid bound with the plain 1F1B floor (pp-1) c: a valid start."""
    return (sum(work(coef, length) for length in lengths) + n * (coef.scheme.pp - 1) * coef.c) / n


def best_plan_s(coef: SchemeCoefficients, lengths, n: int) -> float:
    """The least step time of n pipelines of `coef` over the items, by brute force: every split
    into n non-empty pipelines, every order of micro-batches in each (each a set of items within
    the capacity), each timed by the 1F1B recursion of `planner.reference`."""

    def ordered_partitions(items):
        if not items:
            yield []
            return
        for size in range(1, len(items) + 1):
            for first in itertools.combinations(items, size):
                rest = [item for item in items if item not in first]
                for tail in ordered_partitions(rest):
                    yield [first, *tail]

    def best_pipeline(items):
        best = math.inf
        for batches in ordered_partitions(items):
            if any(sum(lengths[i] for i in batch) > coef.capacity_tokens for batch in batches):
                continue
            times = [coef.micro_batch_time_s(np.array([lengths[i] for i in batch])) for batch in batches]
            best = min(best, pipeline_time_s(times, coef.scheme.pp, coef.fwd_fraction))
        return best

    best = math.inf
    for owner in itertools.product(range(n), repeat=len(lengths)):
        if len(set(owner)) < n:
            continue
        groups = [[i for i, o in enumerate(owner) if o == p] for p in range(n)]
        best = min(best, max(best_pipeline(group) for group in groups))
    return best


def test_most_micro_batches_are_items_less_pipelines_plus_one():
    tables = BoundTables.build(np.array([100, 200, 200, 300, 300, 300, 400]), [FOUR, TWO])
    # every pipeline holds at least one of the 7 items: one of them runs at most 7 - n + 1
    counts = np.array([[1, 0], [2, 1], [3, 4], [0, 2]])
    assert tables._most_micro_batches(counts).tolist() == [7, 5, 1, 6]


def test_the_longest_item_floor_by_hand():
    lengths = np.array([100, 200, 1_000, 3_000, 6_000])
    tables = BoundTables.build(lengths, [FOUR, TWO])
    # FOUR holds at most 4,000 tokens: the longest item (the last row) prices it out
    assert tables._longest_item_floor_s(0) == 1e30
    # TWO: c + (pp-1)((1-2f)(c + w(6,000)) + f c) with pp 2, f 1/3
    w = TWO.a * 6_000**2 + TWO.b * 6_000
    expected = 0.02 + (0.02 + w) / 3 + 0.02 / 3
    assert tables._longest_item_floor_s(1) == pytest.approx(expected, rel=1e-12)
    # a table whose longest item fits FOUR: E from that item
    short = BoundTables.build(np.array([100, 300, 2_000, 3_500]), [FOUR, TWO])
    w = FOUR.a * 3_500**2 + FOUR.b * 3_500
    assert short._longest_item_floor_s(0) == pytest.approx(0.01 + 3 * ((0.01 + w) / 3 + 0.01 / 3), rel=1e-12)


def test_the_bubble_dual_by_hand_over_rows_of_different_micro_batch_caps():
    lengths = [100, 200, 300, 1_000]
    tables = BoundTables.build(np.array(lengths), [FOUR])
    pipelines = [1, 2, 3]  # at most 4, 3 and 2 micro-batches in one pipeline
    starts = [fluid_start(FOUR, lengths, n) for n in pipelines]
    expected = one_scheme_dual(FOUR, lengths, pipelines, starts)
    np.testing.assert_allclose(bubble_dual(tables, pipelines, starts), expected, rtol=1e-9)
    # the instance tells the pieces apart: each round raises every row, and so does each cap
    # (a pipeline allowed more micro-batches trades overheads for bubbles better)
    for rounds in (1, 3):
        other = one_scheme_dual(FOUR, lengths, pipelines, starts, rounds=rounds)
        assert all(abs(x - y) > 1e-3 * y for x, y in zip(other, expected))
    assert most_work(FOUR, expected[2], 2) < most_work(FOUR, expected[2], 4) * (1 - 1e-3)
    # and stays below the best plan of each row (brute force over plans, 1F1B by recursion)
    for n, bound in zip(pipelines, expected):
        assert bound <= best_plan_s(FOUR, lengths, n)


def test_the_bubble_dual_leaves_rows_at_or_above_the_cutoff():
    lengths = [100, 200, 300, 1_000]
    tables = BoundTables.build(np.array(lengths), [FOUR])
    start = fluid_start(FOUR, lengths, 1)
    starts = [start, start, start, math.inf]
    cutoffs = [2 * start, start, start / 2, math.inf]
    got = bubble_dual(tables, [1, 1, 1, 1], starts, cutoffs)
    # only the row below its cutoff is raised (and rounds are counted over that row alone)
    assert got[0] == pytest.approx(one_scheme_dual(FOUR, lengths, [1], [start])[0], rel=1e-9)
    assert got[0] > start * 1.1
    assert got[1:].tolist() == [start, start, math.inf]


def test_the_bubble_dual_from_a_start_below_any_pipelines_time():
    # from T0 = 5 ms, below g(0) = 4 c = 40 ms (one micro-batch crossing four stages): no
    # pipeline finishes any work by T0, so each idles all of T0 (K = T0), not more
    lengths = [100, 200, 300, 1_000]
    tables = BoundTables.build(np.array(lengths), [FOUR])
    assert float(pipeline_time_floor_s(FOUR, 0.0, 4)) == pytest.approx(0.04)
    got = bubble_dual(tables, [2], [0.005])
    assert got[0] == pytest.approx(one_scheme_dual(FOUR, lengths, [2], [0.005])[0], rel=1e-9)
    # first round by hand: (sum w + 2 T0 + (E - T0)) / 2
    first = (sum(work(FOUR, x) for x in lengths) + 0.005 + longest_item_floor(FOUR, work(FOUR, 1_000))) / 2
    assert got[0] > first * 1.01  # and the second round raises it again


def test_the_bubble_dual_where_the_idle_time_exceeds_the_longest_items_floor():
    # twelve short items on one pipeline: its bubble floor K is above E of its longest item,
    # so the longest-item term adds nothing (it is (E - K)^+, never negative)
    lengths = [100] * 12
    tables = BoundTables.build(np.array(lengths), [FOUR])
    start = fluid_start(FOUR, lengths, 1)
    extra = longest_item_floor(FOUR, work(FOUR, 100))
    assert start - most_work(FOUR, start, 12) > extra
    got = bubble_dual(tables, [1], [start])
    assert got[0] == pytest.approx(one_scheme_dual(FOUR, lengths, [1], [start])[0], rel=1e-9)


# a two-stage pipeline whose capacity is short against its items: the capacity pricing is dear
NARROW = SchemeCoefficients(ParallelScheme(2, 2, 1), a=2e-9, b=3e-5, c=0.02, fwd_fraction=1 / 3,
                            capacity_tokens=1_000, grad_bytes_per_gpu=1e9)  # fmt: skip


def test_bubble_pricing_keeps_the_capacity_pricing_where_that_is_larger():
    lengths = np.array([800, 900, 900, 950] * 10)
    tables = BoundTables.build(lengths, [SINGLE, NARROW])
    cap_s = 10.0
    # NARROW: items near its capacity pay c l / cap ~ 0.9 c each, more than the bubble's share
    # g w h(T_cap) / T_cap of 40 items' work at T_cap = 10 s
    overhead = float(pipeline_time_floor_s(NARROW, cap_s, 40)) - cap_s
    bubbled = sum(4 * work(NARROW, x) * (1 + overhead / cap_s) for x in lengths.tolist())
    capacity = sum(4 * (work(NARROW, x) + NARROW.c * x / 1_000) for x in lengths.tolist())
    assert 0 < bubbled < capacity * 0.9
    priced = tables.bubble_priced(cap_s)
    np.testing.assert_array_equal(priced.gpu_seconds, tables.gpu_seconds)
    # and a cap at or below zero (no plan finishes by it) leaves the tables as they are
    assert tables.bubble_priced(-1.0) is tables


def test_coarsened_rows_start_wherever_a_length_outgrows_its_rows_first():
    # 200 is twice 100: the second length starts a row of its own, and 201 joins it
    tables = BoundTables.build(np.array([100, 200, 201]), [SINGLE, TWO])
    coarse = tables.coarsened(1.02)
    assert coarse.lengths.tolist() == [100, 201]
    assert coarse.work_s[:, 0].tolist() == pytest.approx([work(SINGLE, 100), (SINGLE.a * 200 + SINGLE.b) * 401])


def test_coarsened_rows_split_at_a_capacity_only_where_the_row_crosses_it():
    # SINGLE holds up to 1,000 tokens: 1,005 starts a row, 1,010 is within 2% of it and on the
    # same side of every capacity, so it joins that row (not a row of its own)
    tables = BoundTables.build(np.array([100, 1_005, 1_010]), [SINGLE, TWO])
    coarse = tables.coarsened(1.02)
    assert coarse.lengths.tolist() == [100, 1_010]
    assert coarse.work_s[1, 1] == pytest.approx((TWO.a * 1_005 + TWO.b) * (1_005 + 1_010))
    assert math.isinf(coarse.work_s[1, 0])


def test_coarsened_rows_span_two_percent_by_default():
    # the module's ratio: lengths within 2% of a row's first share it
    tables = BoundTables.build(np.array([100, 101, 103, 104]), [SINGLE, TWO])
    assert tables.coarsened().lengths.tolist() == [101, 104]


def test_coarsened_rows_never_straddle_a_capacity():
    # 1,000 and 1,005 are both within 2% of 990, but SINGLE holds 1,000 tokens and not 1,005: a
    # row [990, 1,005] would price the items SINGLE can hold as if it could not (too high)
    lengths = np.array([990] * 20 + [1_000] * 20 + [1_005])
    tables = BoundTables.build(lengths, [SINGLE, TWO])
    coarse = tables.coarsened(1.02)
    assert coarse.lengths.tolist() == [1_000, 1_005]
    assert coarse.work_s[0, 0] == pytest.approx((SINGLE.a * 990 + SINGLE.b) * 20 * (990 + 1_000))
    # so the coarse area bound stays below the exact one: on one SINGLE GPU and one TWO pipeline
    # (5 GPUs) the short items are cheapest on SINGLE, and the area is above the longest item
    exact = (
        20 * (work(SINGLE, 990) + 0.99 * SINGLE.c)
        + 20 * (work(SINGLE, 1_000) + SINGLE.c)
        + 4 * (work(TWO, 1_005) + TWO.c * 1_005 / 8_000)
    ) / 5
    assert tables.pipeline_time_bound_s([0, 1], 5) == pytest.approx(exact, rel=1e-12)
    assert coarse.pipeline_time_bound_s([0, 1], 5) <= exact


def dual_step(coef: SchemeCoefficients, lengths, n: int, bound: float) -> float:
    """One round of `one_scheme_dual` for one row: the bound it raises `bound` to."""
    idle = bound - most_work(coef, bound, len(lengths) - n + 1)
    extra = longest_item_floor(coef, work(coef, max(lengths)))
    return (sum(work(coef, length) for length in lengths) + n * idle + max(extra - idle, 0.0)) / n


def test_the_bubble_dual_stops_where_a_round_raises_by_a_millionth_at_most():
    # a round that would raise every row by less than a millionth is not taken: from a start
    # just below the dual's fixed point, where a round raises it by half a millionth, the start
    # stays as it is. The raise shrinks as the start rises (each round's idle time K grows
    # slower than the start), so bisection finds that start.
    lengths = [100] * 12
    tables = BoundTables.build(np.array(lengths), [FOUR])
    low, high = fluid_start(FOUR, lengths, 1), 1.0
    assert dual_step(FOUR, lengths, 1, low) > low * (1 + 1e-6) and dual_step(FOUR, lengths, 1, high) < high
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if dual_step(FOUR, lengths, 1, middle) > middle * (1 + 5e-7) else (low, middle)
    start = low
    assert start * (1 + 4e-7) < dual_step(FOUR, lengths, 1, start) < start * (1 + 6e-7)
    assert bubble_dual(tables, [1], [start])[0] == start
