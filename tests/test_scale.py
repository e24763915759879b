"""The fast paths that keep large batches inside the budget give what the plain definitions give:
count vectors, the fillable check, the gradient sync from counts, greedy dispatch, item splitting."""

from __future__ import annotations

import heapq
import itertools
import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from synthetic import synthetic_profile

from hydraplan.planner.bounds import BoundTables, SyncFloors
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.counts import capped_count_vectors, fillable
from hydraplan.planner.dispatch import _estimate_s, greedy_dispatch
from hydraplan.planner.items import prepare_items
from hydraplan.planner.schemas import OversizePolicy
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.search import runnable_schemes, strategy_sync_s
from hydraplan.planner.strategies import Strategy, count_vectors

SIZES = st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128])


@given(st.lists(SIZES, min_size=1, max_size=4), st.integers(1, 300), st.sampled_from([0, 1, 5, 40, 4000]))
def test_capped_count_vectors_are_count_vectors(sizes, num_gpus, most):
    combo = [ParallelScheme(1, size, 1) for size in sizes]
    every = list(itertools.islice(count_vectors(combo, num_gpus), most + 1))
    assert capped_count_vectors(combo, num_gpus, most) == (None if len(every) > most else every)


def test_capped_count_vectors_at_4096_gpus():
    combo = [ParallelScheme(2, 2, 1), ParallelScheme(4, 1, 2), ParallelScheme(8, 32, 1)]
    vectors = capped_count_vectors(combo, 4096, 4000)
    assert vectors == list(count_vectors(combo, 4096)) and len(vectors) == 3825
    assert capped_count_vectors([ParallelScheme(1, 1, 1), ParallelScheme(2, 1, 1)], 4096, 4000) == [
        (2 * count, 2048 - count) for count in range(1, 2048)
    ]
    assert capped_count_vectors(combo[:1] + [ParallelScheme(1, 1, 1), ParallelScheme(2, 1, 1)], 4096, 4000) is None


@given(st.lists(SIZES, min_size=1, max_size=3), st.integers(1, 700))
def test_fillable_is_the_exact_cover_check(sizes, num_gpus):
    remainder = num_gpus - sum(sizes)
    reachable = [True] + [False] * max(remainder, 0)
    for value in range(1, remainder + 1):
        reachable[value] = any(size <= value and reachable[value - size] for size in sizes)
    assert fillable(tuple(sorted(sizes)), num_gpus) == (remainder >= 0 and reachable[remainder])
    assert fillable(tuple(np.array(sorted(sizes))), num_gpus) == fillable(tuple(sorted(sizes)), num_gpus)


def test_strategy_sync_from_counts_is_the_cost_models():
    rng = np.random.default_rng(0)
    for profile in (synthetic_profile(max_gpus=64), synthetic_profile(max_gpus=64, grad_sync_s=0.02)):
        cost = ProfileCostModel(profile)
        schemes = cost.schemes()
        for _ in range(50):
            picked = rng.choice(len(schemes), size=int(rng.integers(1, 4)), replace=False)
            strategy = Strategy.of([(schemes[index], int(rng.integers(1, 9))) for index in picked])
            assert strategy_sync_s(cost, strategy) == cost.grad_sync_s(strategy.pipeline_schemes())


def reference_greedy(lengths: np.ndarray, coefs) -> list[list[int]]:
    """Greedy dispatch as written in its docstring, with `_estimate_s` (no empty-pipeline fix)."""
    totals = [[0.0, 0.0, 0.0, 0] for _ in coefs]  # work, tokens, largest item, items
    items: list[list[int]] = [[] for _ in coefs]
    heaps: dict = {}
    for index, coef in enumerate(coefs):
        heaps.setdefault(coef, []).append((0.0, index))
    for item in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        length = float(lengths[item])
        best = None
        for coef, heap in heaps.items():
            if length > coef.capacity_tokens:
                continue
            pipeline = heap[0][1]
            work, tokens, largest, count = totals[pipeline]
            added = coef.a * length * length + coef.b * length
            after = _estimate_s(coef, work + added, tokens + length, max(largest, added), count + 1)
            if best is None or after < best[0] or (after == best[0] and pipeline < best[1]):
                best = (after, pipeline, coef, added)
        after, pipeline, coef, added = best
        totals[pipeline] = [
            totals[pipeline][0] + added,
            totals[pipeline][1] + length,
            max(totals[pipeline][2], added),
            totals[pipeline][3] + 1,
        ]
        items[pipeline].append(item)
        heapq.heapreplace(heaps[coef], (after, pipeline))
    return [sorted(pipeline) for pipeline in items]


@given(st.lists(st.integers(1, 20_000), min_size=8, max_size=120), st.integers(0, 10_000))
def test_greedy_dispatch_follows_its_estimate(lengths, seed):
    cost = ProfileCostModel(synthetic_profile(max_gpus=64))
    rng = np.random.default_rng(seed)
    schemes = [cost.coefficients(s) for s in cost.schemes()]
    picked = rng.choice(len(schemes), size=int(rng.integers(1, 4)), replace=False)
    coefs = [schemes[index] for index in picked for _ in range(int(rng.integers(1, 4)))]
    array = np.asarray(lengths, dtype=np.int64)
    array = array[array <= max(coef.capacity_tokens for coef in coefs)]
    assignment = greedy_dispatch(array, coefs)
    expected = reference_greedy(array, coefs)
    if assignment is not None and all(expected):  # no pipeline left empty: the greedy's own result
        assert [pipeline.tolist() for pipeline in assignment] == expected


@given(st.lists(st.integers(1, 200), min_size=1, max_size=40), st.integers(1, 60), st.sampled_from(["split", "drop"]))
def test_item_splitting_matches_its_definition(lengths, capacity, policy):
    try:
        items = prepare_items(lengths, capacity, OversizePolicy(policy))
    except ValueError:
        assert policy == "drop" and all(length > capacity for length in lengths)
        return
    expected = [
        (sequence, offset, min(capacity, length - offset))
        for sequence, length in enumerate(lengths)
        if length <= capacity or policy == "split"
        for offset in (range(0, length, capacity) if length > capacity else [0])
    ]
    assert list(zip(items.sequence_ids.tolist(), items.offsets.tolist(), items.lengths.tolist())) == expected
    assert items.lengths.dtype == np.int64 and items.offsets.dtype == np.int64
    oversize = tuple(index for index, length in enumerate(lengths) if length > capacity)
    assert (items.split_sequence_ids if policy == "split" else items.dropped_sequence_ids) == oversize
    assert math.isclose(items.num_tokens, sum(length for _, _, length in expected))


def test_sync_floors_of_many_blocks_are_those_of_each():
    cost = ProfileCostModel(synthetic_profile(max_gpus=64))
    coefs = [cost.coefficients(scheme) for scheme in cost.schemes()]
    floors = SyncFloors(cost, coefs, 64)
    rng = np.random.default_rng(3)
    prefixes = [()] + [
        tuple(sorted(rng.choice(len(coefs), size=size, replace=False).tolist())) for size in (1, 2, 1, 2)
    ]
    block_of = rng.integers(0, len(prefixes), size=200)
    children = rng.integers(0, len(coefs), size=200)
    together = floors.extended_blocks(prefixes, block_of, children)
    alone = [floors.extended(prefixes[block], np.array([child]))[0] for block, child in zip(block_of, children)]
    assert together.tolist() == alone


def test_set_bound_blocks_from_a_first_column_are_the_later_blocks():
    cost = ProfileCostModel(synthetic_profile(max_gpus=64))
    tables = BoundTables.build(np.random.default_rng(0).integers(100, 20_000, 300), runnable_schemes(cost, 64))
    for max_schemes in (1, 2, 3):
        every = list(tables.set_bound_blocks(max_schemes, 64))
        for first in (1, 3, 10):
            later = list(tables.set_bound_blocks(max_schemes, 64, first_column=first))
            expected = [block for block in every if block[0] and block[0][0] >= first]
            assert [block[0] for block in later] == [block[0] for block in expected]
            for (_, children, bounds), (_, want_children, want_bounds) in zip(later, expected):
                assert np.array_equal(children, want_children) and np.array_equal(bounds, want_bounds)
