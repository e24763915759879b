"""Packing: the local search keeps every item, respects the capacity, reports exact times, is
deterministic, and beats sorted packings where a few large items meet many small ones; the
heuristic packer's pyramid orders and plateau counts beat them too."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from hydraplan.planner import packing
from hydraplan.planner.cost import ProfileCostModel, SchemeCoefficients
from hydraplan.planner.packing import (
    PackedPipeline,
    _whole_groups,
    balance_lpt,
    balance_to_targets,
    by_length_descending,
    improve_packing,
    pack_pipeline,
    pyramid_order,
)
from hydraplan.planner.refine import polish_packings
from hydraplan.planner.schemas import CostProfile, SchemeCost
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.search import solve_strategy
from hydraplan.planner.simulate import simulate_1f1b
from hydraplan.planner.strategies import parse_strategy


def _coef(pp: int) -> SchemeCoefficients:
    scheme = SchemeCost(tp=1, pp=pp, cp=1, a=1e-9, b=1e-5, c=1e-3, capacity_tokens=4000)
    return ProfileCostModel(CostProfile(num_layers=8, schemes=[scheme])).coefficients(
        parse_strategy(f"1x<1,{pp},1>").schemes[0]
    )


def _mixed_batch(seed: int) -> np.ndarray:
    """Eight items of 2.5K-4K tokens (a capacity holds one) and ten of 100-600."""
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.integers(2500, 4000, 8), rng.integers(100, 600, 10)])


@pytest.mark.parametrize(("pp", "seed"), [(2, 0), (2, 1), (4, 2), (4, 3)])
def test_improve_packing_keeps_items_and_capacity_and_reports_exact_times(pp, seed):
    coef, lengths = _coef(pp), _mixed_batch(seed)
    start = pack_pipeline(np.arange(len(lengths)), lengths, coef)
    better = improve_packing(start, lengths, coef, 1500, lambda: False)
    assert Counter(int(i) for batch in better.micro_batches for i in batch) == Counter(range(len(lengths)))
    assert all(lengths[batch].sum() <= coef.capacity_tokens for batch in better.micro_batches)
    assert better.stage_times_s == pytest.approx([coef.micro_batch_time_s(lengths[b]) for b in better.micro_batches])
    assert better.time_s == pytest.approx(simulate_1f1b(list(better.stage_times_s), pp, coef.fwd_fraction))
    assert better.time_s <= start.time_s
    again = improve_packing(start, lengths, coef, 1500, lambda: False)
    assert [b.tolist() for b in again.micro_batches] == [b.tolist() for b in better.micro_batches]


def _best_sorted_packing(lengths: np.ndarray, coef: SchemeCoefficients) -> PackedPipeline:
    """Balanced LPT packings at every micro-batch count, each run largest first or smallest
    first: the fastest (what sorting alone can do)."""
    order = by_length_descending(np.arange(len(lengths)), lengths)
    best = None
    for count in range(1, len(lengths) + 1):
        packed = balance_lpt(lengths[order].astype(np.float64), count, coef)
        if packed is None:
            continue
        bins, times = packed
        by_size = sorted(range(len(times)), key=lambda index: -times[index])
        for ordering in (by_size, by_size[::-1]):
            time_s = simulate_1f1b([times[k] for k in ordering], coef.scheme.pp, coef.fwd_fraction)
            if best is None or time_s < best.time_s:
                micro_batches = tuple(order[bins[k]] for k in ordering)
                best = PackedPipeline(micro_batches, tuple(times[k] for k in ordering), time_s)
    assert best is not None
    return best


def test_improve_packing_beats_sorted_packings_of_a_few_large_items():
    """Measured 7-8% at pp=4 on these batches: a small micro-batch first and last, large ones
    mid-way, which sorted balanced packings do not form from indivisible items."""
    coef = _coef(4)
    for seed in range(4):
        lengths = _mixed_batch(seed)
        start = _best_sorted_packing(lengths, coef)
        better = improve_packing(start, lengths, coef, 1500, lambda: False)
        assert better.time_s < start.time_s * 0.97, seed


@pytest.mark.parametrize("pp", [2, 4])
def test_pack_pipeline_beats_every_sorted_packing_of_a_few_large_items(pp):
    """Pyramid orders and the plateau counts: measured 4-8% faster than the best sorted packing
    over every micro-batch count on these batches."""
    coef = _coef(pp)
    for seed in range(4):
        lengths = _mixed_batch(seed)
        packed = pack_pipeline(np.arange(len(lengths)), lengths, coef)
        assert packed.time_s < _best_sorted_packing(lengths, coef).time_s * 0.97, seed


def test_pyramid_order_rises_to_the_largest_then_falls():
    descending = list(range(10))  # micro-batch k is the k-th largest
    for ratio in (1.0, math.sqrt(2.0), 3.0):
        order = pyramid_order(descending, ratio)
        assert sorted(order) == descending
        peak = order.index(0)
        assert order[: peak + 1] == sorted(order[: peak + 1], reverse=True)  # sizes rise
        assert order[peak:] == sorted(order[peak:])  # then fall
        rising, falling = peak, len(order) - 1 - peak
        assert abs(rising - ratio * falling) <= ratio + 1, (ratio, order)


def test_pack_pipeline_tries_counts_whose_plateau_holds_the_largest_item(monkeypatch):
    """Long-tailed lengths (lognormal, clipped at 8K) on pp=5: the least-bubble counts' plateau is
    far below the largest items. Measured 2.6-10% slower on these batches without the counts whose
    plateau holds them."""
    scheme = SchemeCost(tp=1, pp=5, cp=1, a=1e-9, b=1e-5, c=2e-4, capacity_tokens=16000)
    coef = ProfileCostModel(CostProfile(num_layers=10, schemes=[scheme])).coefficients(
        parse_strategy("1x<1,5,1>").schemes[0]
    )
    batches = [
        np.clip(np.random.default_rng(seed).lognormal(math.log(700), 1.2, 120), 128, 8192).astype(np.int64)
        for seed in range(4)
    ]
    with_window = [pack_pipeline(np.arange(len(b)), b, coef).time_s for b in batches]
    monkeypatch.setattr(packing, "PLATEAU_WINDOW", -1)  # an empty window: the least-bubble counts only
    without = [pack_pipeline(np.arange(len(b)), b, coef).time_s for b in batches]
    for seed, (new, old) in enumerate(zip(with_window, without)):
        assert new < old * 0.98, seed


def test_improve_packing_leaves_single_stage_pipelines_and_stops_on_request():
    lengths = _mixed_batch(0)
    flat = pack_pipeline(np.arange(len(lengths)), lengths, _coef(1))
    assert improve_packing(flat, lengths, _coef(1), 1500, lambda: False) is flat
    deep = pack_pipeline(np.arange(len(lengths)), lengths, _coef(4))
    assert improve_packing(deep, lengths, _coef(4), 1500, lambda: True) is deep


def test_polish_packings_speeds_up_the_slowest_pipeline_and_keeps_the_assignment():
    deep = SchemeCost(tp=1, pp=4, cp=1, a=1e-9, b=1e-5, c=1e-3, capacity_tokens=4000)
    cost = ProfileCostModel(CostProfile(num_layers=8, schemes=[deep]))
    lengths = np.concatenate([_mixed_batch(0), _mixed_batch(1)])
    candidate = solve_strategy(parse_strategy("2x<1,4,1>"), lengths, cost)
    assert candidate is not None
    polished = polish_packings(candidate, lengths, 1500, lambda: False)
    assert polished.step_time_s < candidate.step_time_s
    assert [a.tolist() for a in polished.assignment] == [a.tolist() for a in candidate.assignment]
    for items, packed in zip(polished.assignment, polished.packed):
        assert sorted(int(i) for batch in packed.micro_batches for i in batch) == sorted(items.tolist())


def _balance_by_scanning(sub_lengths, targets_s, coef):
    """Reference for `balance_to_targets`: every bin scanned for every item."""
    loads, tokens = [0.0] * len(targets_s), [0] * len(targets_s)
    bins = [[] for _ in targets_s]
    for position, length in enumerate(sub_lengths.tolist()):
        fitting = [k for k in range(len(bins)) if tokens[k] + length <= coef.capacity_tokens]
        if not fitting:
            return None
        index = min(fitting, key=lambda k: (loads[k] - targets_s[k], k))
        bins[index].append(position)
        tokens[index] += length
        loads[index] += coef.a * length * length + coef.b * length
    used = [k for k in range(len(bins)) if bins[k]]
    return [bins[k] for k in used], [loads[k] + coef.c for k in used]


def test_balance_to_targets_matches_scanning_every_bin_where_the_capacity_binds():
    rng = np.random.default_rng(7)
    for trial in range(60):
        scheme = SchemeCost(tp=1, pp=2, cp=1, a=1e-9, b=1e-5, c=1e-3, capacity_tokens=int(rng.integers(3000, 9000)))
        coef = ProfileCostModel(CostProfile(num_layers=8, schemes=[scheme])).coefficients(
            parse_strategy("1x<1,2,1>").schemes[0]
        )
        lengths = np.sort(rng.integers(100, 3000, int(rng.integers(5, 80))))[::-1].astype(np.float64)
        count = int(rng.integers(1, 30))
        targets = rng.random(count) * 0.02 if trial % 2 else np.zeros(count)
        expected = _balance_by_scanning(lengths, targets, coef)
        assert balance_to_targets(lengths, targets, coef) == expected, trial
        if expected is not None:
            assert all(lengths[b].sum() <= coef.capacity_tokens for b in expected[0])


def test_a_fallback_packing_of_an_interleaved_pipeline_is_split_into_whole_groups_of_pp() -> None:
    """First fit leaves a count the interleaved schedule refuses (not a multiple of pp): bins are
    split, one item out of the fullest at a time, until it runs; too few items stay as they are."""
    scheme = ParallelScheme(1, 4, 1, 2)
    split = _whole_groups([[0, 1, 2], [3, 4], [5]], scheme)
    assert len(split) == 4 and sorted(item for members in split for item in members) == list(range(6))
    assert _whole_groups([[0], [1], [2]], scheme) == [[0], [1], [2]]  # 3 items cannot fill 4 bins
    assert _whole_groups([[0, 1], [2]], ParallelScheme(1, 4, 1)) == [[0, 1], [2]]  # plain 1F1B: any count


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("c", [0.0, 1e-12, 2e-3])
def test_a_one_stage_pipeline_packed_into_fewer_micro_batches_skips_one_more_and_packs_the_same(
    monkeypatch, seed, c
) -> None:
    # one more micro-batch only adds c to a one-stage pipeline: it is not balanced at all where c is
    # far above the float noise of the work's sum (the packing is the same as with it tried); a c of 0
    # or of noise size leaves both tried, as before
    rng = np.random.default_rng(seed)
    lengths = rng.integers(50, 3_000, size=int(rng.integers(3, 40)))
    coef = SchemeCoefficients(ParallelScheme(1, 1, 1), 1e-9, 1e-5, c, 0.3, int(rng.integers(3_000, 9_000)), 0.0)
    items = np.arange(len(lengths), dtype=np.int64)
    counts_tried: list[int] = []
    real_balance = packing.balance_lpt
    monkeypatch.setattr(packing, "balance_lpt", lambda *args: counts_tried.append(args[1]) or real_balance(*args))
    fast = packing.pack_pipeline(items, lengths, coef)
    fast_counts = list(counts_tried)
    monkeypatch.setattr(packing, "_fewer_wins", lambda *args: False)
    counts_tried.clear()
    both = packing.pack_pipeline(items, lengths, coef)
    assert fast.time_s == both.time_s and fast.stage_times_s == both.stage_times_s
    assert [b.tolist() for b in fast.micro_batches] == [b.tolist() for b in both.micro_batches]
    assert len(counts_tried) == 2  # these batches always have two counts to try (minimum, minimum + 1)
    assert fast_counts == (counts_tried[:1] if c == 2e-3 else counts_tried)
