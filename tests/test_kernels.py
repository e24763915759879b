"""The compiled kernels (`planner.kernels`) compute exactly what the plain-Python loops they
replaced computed: each reference below is that loop, kept here as the specification, and every
comparison is exact (same floats, same tie-breaks), on random instances with ties and tight
capacities."""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest

from hydraplan.planner.kernels import (
    SCANNED_BINS,
    balance_bins,
    first_fit_shuffles,
    greedy_assign,
    group_by_owner,
    next_fit_starts,
    one_f_one_b_end_times,
    one_f_one_b_order,
    weighted_min_totals,
)
from hydraplan.planner.simulate import stage_operations

# ---------------------------------------------------------------------------------------------
# references: the Python loops of the planner before the kernels
# ---------------------------------------------------------------------------------------------


def reference_balance(lengths: list[float], works: list[float], targets: list[float], capacity: float):
    """A heap of bins by (work still missing, bin), bins too full for the item parked aside."""
    keys = [-target for target in targets]
    heap = [(key, index) for index, key in enumerate(keys)]
    heapq.heapify(heap)
    parked: list[tuple[float, int]] = []
    loads = [0.0] * len(targets)
    tokens = [0.0] * len(targets)
    owner = []
    for length, added in zip(lengths, works):
        while parked and -parked[0][0] >= length:
            _, index = heapq.heappop(parked)
            heapq.heappush(heap, (keys[index], index))
        while heap and tokens[heap[0][1]] + length > capacity:
            _, index = heapq.heappop(heap)
            heapq.heappush(parked, (tokens[index] - capacity, index))
        if not heap:
            return None
        key, index = heap[0]
        owner.append(index)
        tokens[index] += length
        loads[index] += added
        keys[index] = key + added
        heapq.heapreplace(heap, (keys[index], index))
    return owner, loads


def reference_greedy(lengths: np.ndarray, kinds: list[tuple[float, float, float, float, int]], kind_of: list[int]):
    """Per kind a heap of (estimate when it last took an item, pipeline); each item to the best head."""
    heaps = [[(0.0, p) for p, k in enumerate(kind_of) if k == kind] for kind in range(len(kinds))]
    work = [0.0] * len(kind_of)
    tokens = [0.0] * len(kind_of)
    max_item = [0.0] * len(kind_of)
    count = [0] * len(kind_of)
    owner = [-1] * len(lengths)
    for item in np.lexsort((np.arange(len(lengths)), -lengths)).tolist():
        length = float(lengths[item])
        best_after, best = math.inf, None
        for heap, (a, b, c, capacity, bubbles) in zip(heaps, kinds):
            if length > capacity or not heap:
                continue
            pipeline = heap[0][1]
            item_work = a * length * length + b * length
            total = work[pipeline] + item_work
            minimum = max(1, math.ceil((tokens[pipeline] + length) / capacity))
            if bubbles == 0:
                after = total + minimum * c
            else:
                num_items = count[pipeline] + 1
                ideal = math.sqrt(bubbles * total / c) if c > 0 else num_items
                micro = min(max(minimum, num_items), max(minimum, round(ideal)))
                after = total + micro * c + bubbles * (max(total / micro, max_item[pipeline], item_work) + c)
            if after < best_after or (after == best_after and best is not None and pipeline < best[0]):
                best_after, best = after, (pipeline, heap, item_work)
        if best is None:
            continue
        pipeline, heap, item_work = best
        owner[item] = pipeline
        work[pipeline] += item_work
        tokens[pipeline] += length
        max_item[pipeline] = max(max_item[pipeline], item_work)
        count[pipeline] += 1
        heapq.heapreplace(heap, (best_after, pipeline))
    return owner


def reference_order(num_stages: int, num_micro: int) -> list[tuple[int, int, int, int]]:
    """Operations released stage by stage, in rounds, once what they wait for was released."""
    sentinel = 2 * num_stages * num_micro
    per_stage = []
    for stage in range(num_stages):
        entries, previous = [], sentinel
        for is_forward, index in stage_operations(stage, num_stages, num_micro):
            if is_forward:
                op = stage * num_micro + index
                entries.append((op, previous, sentinel if stage == 0 else op - num_micro, index))
            else:
                op = (num_stages + stage) * num_micro + index
                waits = stage * num_micro + index if stage == num_stages - 1 else op + num_micro
                entries.append((op, previous, waits, num_micro + index))
            previous = op
        per_stage.append(entries)
    cursor, done, order = [0] * num_stages, {sentinel}, []
    while len(order) < sentinel:
        for stage, entries in enumerate(per_stage):
            while cursor[stage] < len(entries) and entries[cursor[stage]][2] in done:
                order.append(entries[cursor[stage]])
                done.add(entries[cursor[stage]][0])
                cursor[stage] += 1
    return order


def reference_first_fit(
    work: np.ndarray, fits: np.ndarray, kind_of: list[int], order: list[int], give_up=None, least_score=math.inf
):
    """One shuffle of Hydraulis's first fit: the first pipeline within the running maximum, else
    the least estimate after taking the item. Returns (score, choices, steps): the running
    maximum (inf when a pipeline is left empty, or when the shuffle stopped: a pipeline of kind k
    past `give_up[k]`, or the running maximum at `least_score` or more) and the choices of the
    `steps` taken (all unless it stopped)."""
    estimate = [0.0] * len(kind_of)
    running_max, choices = 0.0, []
    for item in order:
        after = [estimate[p] + work[item, k] for p, k in enumerate(kind_of)]
        fitting = [p for p, k in enumerate(kind_of) if fits[item, k]]
        within = [p for p in fitting if after[p] <= running_max]
        chosen = within[0] if within else min(fitting, key=lambda p: (after[p], p))
        estimate[chosen] = after[chosen]
        running_max = max(running_max, after[chosen])
        choices.append(chosen)
        if (give_up is not None and after[chosen] > give_up[kind_of[chosen]]) or running_max >= least_score:
            return math.inf, choices, len(choices)
    return (running_max if len(set(choices)) == len(kind_of) else math.inf), choices, len(choices)


def assert_first_fit_is_the_python_loop(work, fits, kind_of: list[int], shuffles: np.ndarray, give_up) -> None:
    """The kernel against the reference, shuffle by shuffle, with the stops it makes (each
    shuffle's running maximum against the least score of the earlier ones)."""
    scores, choices = first_fit_shuffles(work, fits, np.array(kind_of, dtype=np.int64), shuffles, give_up)
    least_score = math.inf
    for shuffle in range(len(shuffles)):
        expected_score, expected, steps = reference_first_fit(
            work, fits, kind_of, shuffles[shuffle].tolist(), give_up, least_score
        )
        assert choices[shuffle, :steps].tolist() == expected and scores[shuffle] == expected_score
        least_score = min(least_score, expected_score)


# ---------------------------------------------------------------------------------------------
# comparisons
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("trial", range(60))
def test_balance_bins_is_the_heap_loop(trial: int) -> None:
    rng = np.random.default_rng(trial)
    lengths = np.sort(rng.choice([64, 128, 500, 1000, 3000], size=rng.integers(1, 80)))[::-1].astype(np.float64)
    num_bins = int(rng.integers(1, 12))
    targets = rng.choice([0.0, 0.001, 0.002], size=num_bins)  # ties between bins, and not
    capacity = float(rng.choice([3000, 4000, lengths.sum() / num_bins + 3000]))
    assert_balance_is_the_heap_loop(lengths, targets, capacity)


@pytest.mark.parametrize("trial", range(20))
def test_balance_bins_of_many_bins_is_the_heap_loop(trial: int) -> None:
    # above SCANNED_BINS the kernel keeps its bins in heaps, parking the full ones: the same loop
    rng = np.random.default_rng(500 + trial)
    num_bins = int(rng.integers(SCANNED_BINS + 1, 300))
    lengths = np.sort(rng.choice([64, 128, 500, 1000, 3000], size=int(rng.integers(1, 3000))))[::-1]
    lengths = lengths.astype(np.float64)
    targets = rng.choice([0.0, 0.001, 0.002], size=num_bins)
    capacity = float(rng.choice([3000, 4000, lengths.sum() / num_bins + 3000, lengths.sum() / num_bins + 100]))
    assert_balance_is_the_heap_loop(lengths, targets, capacity)


def assert_balance_is_the_heap_loop(lengths: np.ndarray, targets: np.ndarray, capacity: float) -> None:
    """The kernel against the reference on items of work `1e-9 l^2 + 1e-6 l`: the same bins and
    loads, or neither finds room for every item."""
    works = 1e-9 * lengths * lengths + 1e-6 * lengths
    owner, loads, placed = balance_bins(lengths, works, targets, capacity)
    expected = reference_balance(lengths.tolist(), works.tolist(), targets.tolist(), capacity)
    assert placed == (expected is not None)
    if expected is not None:
        assert owner.tolist() == expected[0] and loads.tolist() == expected[1]


@pytest.mark.parametrize("trial", range(52))
def test_greedy_assign_is_the_heap_loop(trial: int) -> None:
    rng = np.random.default_rng(100 + trial)
    # from trial 40 on, deep heaps: up to 300 pipelines and 600 items, ties of keys on purpose
    many = trial >= 40
    lengths = rng.choice([100, 800, 2000, 6000, 9000], size=rng.integers(1, 600 if many else 150))
    kinds = [
        (float(a), float(b), float(c), float(capacity), int(bubbles))
        for a, b, c, capacity, bubbles in zip(
            rng.choice([1e-9, 3e-9], 3),
            rng.choice([1e-6, 2e-6], 3),
            rng.choice([0.0, 1e-3], 3),
            rng.choice([8000, 10000, 20000], 3),
            rng.choice([0, 1, 3], 3),
        )
    ]
    kind_of = rng.integers(0, len(kinds), size=rng.integers(1, 300 if many else 10)).tolist()
    owner = greedy_assign(
        lengths.astype(np.float64),
        np.lexsort((np.arange(len(lengths)), -lengths)).astype(np.int64),
        np.array(kind_of, dtype=np.int64),
        *(np.array([kind[field] for kind in kinds], dtype=np.float64) for field in range(4)),
        np.array([kind[4] for kind in kinds], dtype=np.int64),
    )
    assert owner.tolist() == reference_greedy(lengths, kinds, kind_of)


def first_fit_case(
    seed: int,
    items: tuple[int, int],
    values: list[float],
    fit_share: float,
    pipelines: tuple[int, int],
    num_shuffles: int,
):
    """A random dispatch problem: works drawn from `values` (ties, on purpose), each item fitting
    each kind with probability `fit_share` and always the first pipeline's kind, pipelines of
    random kinds, and seeded shuffles. Returns (work, fits, kind_of, shuffles, num_kinds)."""
    rng = np.random.default_rng(seed)
    num_items, num_kinds = int(rng.integers(*items)), int(rng.integers(1, 4))
    work = rng.choice(values, size=(num_items, num_kinds))
    fits = rng.random((num_items, num_kinds)) < fit_share
    fits[:, 0] = True
    kind_of = [0, *rng.integers(0, num_kinds, size=int(rng.integers(*pipelines))).tolist()]
    shuffles = np.stack([rng.permutation(num_items) for _ in range(num_shuffles)])
    return work, fits, kind_of, shuffles, num_kinds


@pytest.mark.parametrize("trial", range(30))
def test_first_fit_shuffles_is_the_python_loop(trial: int) -> None:
    work, fits, kind_of, shuffles, num_kinds = first_fit_case(
        200 + trial, (1, 60), [0.5, 1.0, 2.0, 3.5], 0.8, (0, 8), 5
    )
    assert_first_fit_is_the_python_loop(work, fits, kind_of, shuffles, np.full(num_kinds, np.inf))


@pytest.mark.parametrize("trial", range(12))
def test_first_fit_shuffles_is_the_python_loop_on_many_pipelines(trial: int) -> None:
    # many blocks of the kernel's two-level scan (up to 300 pipelines, kinds spread over them or
    # bunched)
    work, fits, kind_of, shuffles, num_kinds = first_fit_case(
        900 + trial, (50, 400), [0.25, 0.5, 1.0, 1.5], 0.7, (1, 300), 3
    )
    if trial % 2:
        kind_of.sort()
    assert_first_fit_is_the_python_loop(work, fits, kind_of, shuffles, np.full(num_kinds, np.inf))


@pytest.mark.parametrize("trial", range(20))
def test_first_fit_shuffles_stops_only_shuffles_that_cannot_be_chosen(trial: int) -> None:
    work, fits, kind_of, shuffles, num_kinds = first_fit_case(
        1300 + trial, (20, 200), [0.25, 0.5, 1.0, 1.5], 0.7, (1, 80), 8
    )
    rng = np.random.default_rng(1300 + trial + 10_000)
    full = [reference_first_fit(work, fits, kind_of, order.tolist()) for order in shuffles]
    winner = min(range(len(full)), key=lambda shuffle: (full[shuffle][0], shuffle))
    # per kind, a threshold of 0.5-1.5x the winner's score without stops: some shuffles stop on it
    give_up = np.array([rng.uniform(0.5, 1.5) * full[winner][0] for _ in range(num_kinds)])
    assert_first_fit_is_the_python_loop(work, fits, kind_of, shuffles, give_up)
    scores, choices = first_fit_shuffles(
        work, fits, np.array(kind_of, dtype=np.int64), shuffles, np.full(num_kinds, np.inf)
    )
    if math.isfinite(full[winner][0]):  # without a threshold the stops keep the same winner
        assert int(np.argmin(scores)) == winner and choices[winner].tolist() == full[winner][1]
    else:
        assert not np.isfinite(scores).any()


@pytest.mark.parametrize("num_stages", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("num_micro", [1, 2, 3, 5, 9])
def test_order_and_end_times_are_the_python_recurrence(num_stages: int, num_micro: int) -> None:
    order = one_f_one_b_order(num_stages, num_micro)
    assert [tuple(row) for row in order.tolist()] == reference_order(num_stages, num_micro)
    times = np.random.default_rng(num_stages * 10 + num_micro).uniform(0.5, 2.0, num_micro)
    durations = np.concatenate([times / 3, times - times / 3])
    end = [0.0] * (2 * num_stages * num_micro + 1)
    for op, previous, waits, slot in reference_order(num_stages, num_micro):
        end[op] = max(end[previous], end[waits]) + durations[slot]
    assert one_f_one_b_end_times(durations, order).tolist() == end


def test_group_by_owner_keeps_positions_in_order() -> None:
    assert group_by_owner(np.array([2, 0, 2, 1, 0]), 4) == [[1, 4], [3], [0, 2], []]
    assert group_by_owner(np.array([], dtype=np.int64), 2) == [[], []]


@pytest.mark.parametrize("trial", range(10))
def test_weighted_min_totals_is_the_product_of_the_weighted_minima(trial: int) -> None:
    """The same sums as `multiplicity @ bounds.weighted_min(values, weights)`, up to the order in
    which the rows are added (the bounds allow 1e-6; this is ~1e-15)."""
    from hydraplan.planner.bounds import weighted_min

    rng = np.random.default_rng(300 + trial)
    values = rng.random((int(rng.integers(1, 400)), int(rng.integers(1, 4))))
    values[rng.random(values.shape) < 0.1] = 1e30  # the stand-in of an item that does not fit
    weights = rng.random((int(rng.integers(1, 100)), values.shape[1]))
    multiplicity = rng.integers(1, 5, len(values)).astype(np.float64)
    expected = multiplicity @ weighted_min(values, weights)
    assert weighted_min_totals(values, weights, multiplicity) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("num_points", [1, 3, 4, 5, 8, 11])
def test_weighted_min_totals_adds_each_point_row_by_row_bit_for_bit(num_points: int) -> None:
    """Four grid points at a time, then the rest one by one: every total is the one a plain loop
    gives (each point's sum in row order), bit for bit, whether or not 4 divides the points."""
    rng = np.random.default_rng(num_points)
    values = rng.random((60, 3)) * 1e3
    values[rng.random(values.shape) < 0.1] = 1e30
    weights = rng.random((num_points, 3))
    weights[rng.random(weights.shape) < 0.2] = 0.0
    multiplicity = rng.integers(1, 5, len(values)).astype(np.float64)
    expected = []
    for point in weights.tolist():
        total = 0.0
        for row, count in zip(values.tolist(), multiplicity.tolist()):
            least = row[0] * point[0]
            for value, weight in zip(row[1:], point[1:]):
                if value * weight < least:
                    least = value * weight
            total += count * least
        expected.append(total)
    assert weighted_min_totals(values, weights, multiplicity).tolist() == expected


def test_a_solve_compiles_nothing_after_the_warm_up() -> None:
    """`warm_up` compiles every kernel for the argument types the planner passes, so no plan pays
    for compiling inside its budget: each kernel keeps one signature through solves of the
    bundled analytic profiles (pp > 1, CP, baselines included)."""
    from synthetic import wikipedia_like_batch

    from hydraplan.cost_models.analytic import build_profile
    from hydraplan.cost_models.catalog import get_gpu, get_model
    from hydraplan.planner import kernels
    from hydraplan.planner.schemas import PlanRequest, SolverOptions
    from hydraplan.planner.solve import solve

    kernels.warm_up()
    warmed = {name: list(getattr(kernels, name).signatures) for name in kernels.COMPILED}
    assert all(len(signatures) >= 1 for signatures in warmed.values())
    for model, num_gpus in (("llama3-8b", 32), ("llama3-70b", 64)):
        profile = build_profile(get_model(model), get_gpu("h100-sxm-80gb"), num_gpus, 8)
        lengths = wikipedia_like_batch(300_000, seed=num_gpus)
        solve(
            PlanRequest(lengths=lengths, num_gpus=num_gpus, options=SolverOptions(oversize="split")),
            profile,
            ["hydraulis"],
        )
    assert {name: list(getattr(kernels, name).signatures) for name in kernels.COMPILED} == warmed


@pytest.mark.parametrize("trial", range(20))
def test_next_fit_starts_is_the_arrival_order_loop(trial: int) -> None:
    rng = np.random.default_rng(400 + trial)
    lengths = rng.integers(1, 900, size=rng.integers(1, 200))
    capacity = int(rng.integers(900, 3000))
    starts, used = [], 0
    for index, length in enumerate(lengths.tolist()):  # a new micro-batch when the item does not fit
        if not starts or (used and used + length > capacity):
            starts.append(index)
            used = 0
        used += length
    assert next_fit_starts(lengths.astype(np.float64), float(capacity)).tolist() == starts
