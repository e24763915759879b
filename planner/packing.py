"""Stage 2: packing one pipeline's items into micro-batches under its capacity.

For a pipeline of `pp` stages whose items carry work `L` (seconds of stage time without the
per-micro-batch overhead `c`), `m` balanced micro-batches take about `L + m*c + (pp-1)*(L/m + c)`
under 1F1B, so the best count is near `m* = sqrt((pp-1) L / c)`, never below what the capacity
forces. We try a few counts around it, balance each with longest-processing-time-first under the
capacity, rank them with the cheap estimate, and settle the best few with the exact simulation
over a few micro-batch orders.

Equal micro-batches are not the best under 1F1B when the forward is shorter than the backward:
sizes that ramp up over the first ~pp micro-batches and taper off at the end cut the bubble by
about a third. For pp > 1 we also pack towards the least-bubble shapes that `planner.bubble_floor`
tabulates (targets per micro-batch, in execution order) and keep whichever simulates fastest.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hydraplan.planner.bubble_floor import peak_shares, ramp_shape, tabulated_floors
from hydraplan.planner.cost import SchemeCoefficients
from hydraplan.planner.kernels import balance_bins, group_by_owner
from hydraplan.planner.simulate import approximate_pipeline_s, pipeline_time_s, simulate_1f1b

NUM_EXACT_CANDIDATES = 2
NUM_RAMPED_COUNTS = 2  # micro-batch counts tried with least-bubble (ramped) sizes
PLATEAU_WINDOW = 2  # and counts this close to the largest whose plateau holds the largest item
LOCAL_SEARCH_SEED = 0
LOCAL_SEARCH_CLOCK_EVERY = 64  # evaluations between clock checks in `improve_packing`
# Pipelines of at most this many items get every packing tried: 6 items have 4,683 ordered
# partitions (the Fubini number), ~0.1 s of simulation; 7 would have 47,293.
EXACT_PACKING_MAX_ITEMS = 6


@dataclass(frozen=True)
class PackedPipeline:
    """Micro-batches (arrays of item indices) in execution order and their simulated time."""

    micro_batches: tuple[np.ndarray, ...]
    stage_times_s: tuple[float, ...]
    time_s: float


EMPTY = PackedPipeline((), (), 0.0)


def pack_pipeline(item_indices: np.ndarray, lengths: np.ndarray, coef: SchemeCoefficients) -> PackedPipeline:
    """Pack the given items (indices into `lengths`) for one pipeline with scheme costs `coef`."""
    if len(item_indices) == 0:
        return EMPTY
    order = by_length_descending(item_indices, lengths)
    sub_lengths = lengths[order].astype(np.float64)
    if sub_lengths.max() > coef.capacity_tokens:
        raise ValueError(f"an item of {int(sub_lengths.max())} tokens exceeds capacity {coef.capacity_tokens}")
    work_s = float(coef.a * (sub_lengths @ sub_lengths) + coef.b * sub_lengths.sum())
    minimum = max(1, math.ceil(float(sub_lengths.sum()) / coef.capacity_tokens))  # forced by the capacity
    scored = []
    for num_micro_batches in _candidate_counts(len(sub_lengths), work_s, minimum, coef):
        if scored and _fewer_wins(coef, work_s, num_micro_batches):
            break
        balanced = balance_lpt(sub_lengths, num_micro_batches, coef)
        if balanced is not None:
            bins, times = balanced
            scored.append((approximate_pipeline_s(times, coef.scheme), num_micro_batches, bins, times))
    if not scored:
        bins = _whole_groups(_first_fit_until_feasible(sub_lengths, coef), coef.scheme)
        times = [coef.micro_batch_time_s(sub_lengths[b]) for b in bins]
        scored.append((approximate_pipeline_s(times, coef.scheme), len(bins), bins, times))
    scored.sort(key=lambda entry: (entry[0], entry[1]))
    best: PackedPipeline | None = None
    for _, _, bins, times in scored[:NUM_EXACT_CANDIDATES]:
        candidate = best_order([order[b] for b in bins], times, coef)
        if best is None or candidate.time_s < best.time_s:
            best = candidate
    for bins, times in _ramped(sub_lengths, work_s, minimum, coef):
        candidate = best_order([order[b] for b in bins], times, coef, keep_order=True)
        if best is None or candidate.time_s < best.time_s:
            best = candidate
    assert best is not None
    return best


def _fewer_wins(coef: SchemeCoefficients, work_s: float, num_micro_batches: int) -> bool:
    """Whether a one-stage pipeline already packed into fewer micro-batches makes packing it into
    `num_micro_batches` pointless. Its time is the sum of its micro-batches' stage times, `W + k c`
    for k non-empty ones (longest-processing-time fills every bin while items remain), so one more
    costs c more, and c is far above the float noise of summing W (~1e-16 W per term) unless it is
    below 1e-9 W: the more micro-batches are never faster and never tie, and the plan is the same.
    At 1,024 GPUs, one-stage pipelines are most of the baselines' packings."""
    return coef.scheme.pp == 1 and coef.scheme.v == 1 and coef.c > 1e-9 * max(work_s, 0.0) and num_micro_batches > 1


def _time_s(stage_times_s: list[float], coef: SchemeCoefficients) -> float:
    """The pipeline's simulated time: 1F1B, or interleaved 1F1B for v > 1 (`simulate.pipeline_time_s`)."""
    if coef.scheme.v == 1:
        return simulate_1f1b(stage_times_s, coef.scheme.pp, coef.fwd_fraction)
    return pipeline_time_s(stage_times_s, coef.scheme, coef.fwd_fraction)


def _ramped(
    sub_lengths: np.ndarray, work_s: float, minimum: int, coef: SchemeCoefficients
) -> list[tuple[list[list[int]], list[float]]]:
    """Packings whose micro-batch sizes follow the least-bubble shapes of `planner.bubble_floor`
    (ramping up, a plateau, tapering off), for the micro-batch counts whose floor
    `(W + m c)(1 + rho_m)` is least; empty for pp = 1 or untabulated schemes.

    When the largest item is longer than those counts' plateau it overshoots its slot, and the
    counts near the most micro-batches whose plateau still holds it are tried instead (a longer
    ramp, fewer and larger micro-batches). Measured over every pp > 1 packing of five 8B, 32B and
    70B solves: one of those won 482 of 502, by 3% (median) over the next best."""
    if coef.scheme.pp == 1 or coef.scheme.v > 1:  # the shapes are 1F1B's
        return []
    floors = tabulated_floors(coef.scheme.pp, coef.fwd_fraction)
    if floors is None:
        return []
    counts = np.arange(minimum, min(len(sub_lengths), len(floors)) + 1)
    if len(counts) == 0:
        return []
    floor_s = (work_s + counts * coef.c) * (1 + np.asarray(floors)[counts - 1])
    chosen = counts[np.argsort(floor_s, kind="stable")[:NUM_RAMPED_COUNTS]].tolist()
    largest_s = float(coef.work_s(sub_lengths[:1])[0])  # items come longest first
    plateaus_s = peak_shares(coef.scheme.pp, coef.fwd_fraction)[counts - 1] * (work_s + counts * coef.c) - coef.c
    holding = counts[plateaus_s >= largest_s]
    if len(holding) and max(chosen) > holding[-1]:
        most = int(holding[-1])
        window = range(most - PLATEAU_WINDOW, most + PLATEAU_WINDOW + 1)
        chosen = [count for count in window if counts[0] <= count <= counts[-1]]
    packings = []
    for count in chosen:
        shape = ramp_shape(coef.scheme.pp, coef.fwd_fraction, count)
        targets = shape * (work_s + count * coef.c) - coef.c
        packed = balance_to_targets(sub_lengths, targets, coef)
        if packed is not None:
            packings.append(packed)
    return packings


def balance_to_targets(
    sub_lengths: np.ndarray, targets_s: np.ndarray, coef: SchemeCoefficients
) -> tuple[list[list[int]], list[float]] | None:
    """Longest first, each item to the bin furthest below its target work that has room (the
    lowest bin on ties); bins keep their order. Returns the non-empty bins and their stage times,
    None if an item finds no room. The loop is `kernels.balance_bins`."""
    sub_lengths = np.ascontiguousarray(sub_lengths, dtype=np.float64)
    works = coef.a * sub_lengths * sub_lengths + coef.b * sub_lengths
    targets = np.ascontiguousarray(targets_s, dtype=np.float64)
    owner, loads, placed = balance_bins(sub_lengths, works, targets, float(coef.capacity_tokens))
    if not placed:
        return None
    if len(owner) == 0:
        return [], []
    bins = group_by_owner(owner, len(targets))
    used = [index for index, members in enumerate(bins) if members]
    return [bins[index] for index in used], (loads[used] + coef.c).tolist()


def by_length_descending(item_indices: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Items sorted longest first (work is increasing in length); ties by index, deterministic."""
    keys = np.lexsort((item_indices, -lengths[item_indices]))
    return item_indices[keys]


def _candidate_counts(num_items: int, work_s: float, minimum: int, coef: SchemeCoefficients) -> list[int]:
    if coef.scheme.pp == 1:
        return sorted({minimum, min(num_items, minimum + 1)})
    scheme = coef.scheme
    # interleaved: the bubble is (pp - 1) / v micro-batches' worth
    ideal = num_items if coef.c <= 0 else math.sqrt((scheme.pp - 1) * work_s / (coef.c * scheme.v))
    raw = [minimum, ideal / 1.5, ideal - 1, ideal, ideal + 1, ideal * 1.5]
    counts = {min(num_items, max(minimum, int(round(value)))) for value in raw}
    if scheme.v > 1:  # a multiple of pp (`simulate.interleaved_count_ok`), at most one item each
        counts = {scheme.pp * math.ceil(count / scheme.pp) for count in counts}
        counts = {count for count in counts if count <= num_items}
    return sorted(counts)


def balance_lpt(
    sub_lengths: np.ndarray, num_bins: int, coef: SchemeCoefficients
) -> tuple[list[list[int]], list[float]] | None:
    """Longest-processing-time-first into `num_bins` bins under the capacity, with each bin's
    stage time; None if some item finds no bin with room.

    `sub_lengths` is sorted longest first. Each item goes to the least loaded bin that still
    has room for it: equal targets for `balance_to_targets`.
    """
    return balance_to_targets(sub_lengths, np.zeros(num_bins), coef)


def _whole_groups(bins: list[list[int]], scheme) -> list[list[int]]:
    """For an interleaved scheme, the bins split (the last item of the fullest bin into a bin of
    its own, which keeps every bin under the capacity) until their count is a multiple of pp, the
    counts its schedule runs (`simulate.interleaved_count_ok`); as they are when there are too few
    items (the pipeline's time is then inf)."""
    if scheme.v == 1:
        return bins
    bins = [list(members) for members in bins]
    while len(bins) % scheme.pp:
        fullest = max(range(len(bins)), key=lambda index: (len(bins[index]), -index))
        if len(bins[fullest]) < 2:
            break
        bins.append([bins[fullest].pop()])
    return bins


def _first_fit_until_feasible(sub_lengths: np.ndarray, coef: SchemeCoefficients) -> list[list[int]]:
    """First-fit decreasing by tokens: always feasible since every item fits alone."""
    bins: list[list[int]] = []
    tokens: list[float] = []
    for position, length in enumerate(sub_lengths.tolist()):
        for index, used in enumerate(tokens):
            if used + length <= coef.capacity_tokens:
                bins[index].append(position)
                tokens[index] += length
                break
        else:
            bins.append([position])
            tokens.append(length)
    return bins


def best_order(
    micro_batches: list[np.ndarray], times: list[float], coef: SchemeCoefficients, keep_order: bool = False
) -> PackedPipeline:
    """Try a few execution orders (the given one too with `keep_order`) under the exact 1F1B
    simulation and keep the fastest.

    Which orders: over the 5,900 packings of four 8B and 32B solves, the given order (ramped
    packings), a pyramid (`pyramid_order`) or the smallest first and then the rest largest first
    was fastest; sorted orders won 8 times, by at most 1%. So only two micro-batches are tried
    both ways."""
    descending = sorted(range(len(times)), key=lambda index: (-times[index], index))
    if coef.scheme.pp == 1:
        orders = [descending]  # one stage: the time is the sum, whatever the order
    elif len(descending) <= 2:
        orders = [descending, descending[::-1]]
    else:
        orders = [pyramid_order(descending, ratio) for ratio in _pyramid_ratios(coef.fwd_fraction)]
        orders.append([descending[-1], *descending[:-1]])
    if keep_order and coef.scheme.pp > 1:
        orders.insert(0, list(range(len(times))))
    best: PackedPipeline | None = None
    for order in orders:
        ordered_times = [times[index] for index in order]
        time_s = _time_s(ordered_times, coef)
        if best is None or time_s < best.time_s:
            best = PackedPipeline(tuple(micro_batches[index] for index in order), tuple(ordered_times), time_s)
    assert best is not None
    return best


def pyramid_order(descending: list[int], up_ratio: float) -> list[int]:
    """Largest in the middle: sizes rise to the largest, then fall. `descending` lists the
    micro-batches largest first; they are dealt in turn to the rising side (about `up_ratio`
    of them for each one on the falling side) or the falling side.

    Why: on stage 0, `pp - 1` forwards of later and backwards of earlier micro-batches run while
    micro-batch k's forward climbs the pipeline and its backward comes back, so
    `T >= S + (pp-1) t_k - (1-f) sum(t_{k-pp+1..k-1}) - f sum(t_{k+1..k+pp-1})` (a path of the
    schedule). Sizes that change slowly keep that small; sorted sizes leave the largest next to
    nothing at one end, a pyramid keeps every side gentle."""
    rising, falling = [descending[0]], []
    for index in descending[1:]:
        if len(rising) <= up_ratio * (len(falling) + 1):
            rising.append(index)
        else:
            falling.append(index)
    return rising[::-1] + falling


def _pyramid_ratios(fwd_fraction: float) -> tuple[float, ...]:
    """A symmetric pyramid, and one whose sides' slopes balance the bound in `pyramid_order`
    at its peak (the rising side weighs 1-f, the falling side f: sides in ratio sqrt((1-f)/f))."""
    if not 0.0 < fwd_fraction < 1.0:
        return (1.0,)
    balanced = math.sqrt((1.0 - fwd_fraction) / fwd_fraction)
    return (1.0,) if abs(balanced - 1.0) < 1e-9 else (1.0, balanced)


def improve_packing(
    packed: PackedPipeline,
    lengths: np.ndarray,
    coef: SchemeCoefficients,
    max_evaluations: int,
    should_stop: Callable[[], bool],
) -> PackedPipeline:
    """Local search on one pipeline's micro-batches under the exact 1F1B simulation.

    Moves: an item to another micro-batch or to a new one, two items of different micro-batches
    swapped, two micro-batches swapped in the execution order. A change is kept when it shortens
    the simulated time. The heuristic packings balance sizes; with a few large items a pp > 1
    pipeline gains from sizes they do not produce (a small micro-batch first, large ones mid-way).
    Deterministic: the moves come from a fixed-seed generator. `should_stop` is checked every
    LOCAL_SEARCH_CLOCK_EVERY evaluations. A pipeline of at most EXACT_PACKING_MAX_ITEMS items
    gets every packing tried instead (`exact_packing`)."""
    num_items = sum(len(batch) for batch in packed.micro_batches)
    if 0 < num_items <= EXACT_PACKING_MAX_ITEMS:
        return exact_packing(packed, lengths, coef, should_stop)
    if coef.scheme.pp == 1 or len(packed.micro_batches) == 0:
        return packed  # one stage: the time is the sum, which only fewer micro-batches shorten
    batches = [[int(item) for item in batch] for batch in packed.micro_batches]
    tokens = [float(lengths[batch].sum()) for batch in batches]
    squares = [float(lengths[batch].astype(np.float64) @ lengths[batch]) for batch in batches]
    best_s = packed.time_s
    rng = np.random.default_rng(LOCAL_SEARCH_SEED)
    for evaluation in range(max_evaluations):
        if evaluation % LOCAL_SEARCH_CLOCK_EVERY == 0 and should_stop():
            break
        trial = _random_move(batches, tokens, squares, lengths, coef.capacity_tokens, rng)
        if trial is None:
            continue
        new_batches, new_tokens, new_squares = trial
        times = [coef.stage_time_s(sq, tok) for sq, tok in zip(new_squares, new_tokens)]
        time_s = _time_s(times, coef)
        if time_s < best_s * (1 - 1e-12):
            batches, tokens, squares, best_s = new_batches, new_tokens, new_squares, time_s
    if best_s >= packed.time_s:
        return packed
    times = [coef.stage_time_s(sq, tok) for sq, tok in zip(squares, tokens)]
    return PackedPipeline(tuple(np.array(batch, dtype=np.int64) for batch in batches), tuple(times), best_s)


def exact_packing(
    packed: PackedPipeline, lengths: np.ndarray, coef: SchemeCoefficients, should_stop: Callable[[], bool]
) -> PackedPipeline:
    """The fastest packing of the pipeline's items: every ordered partition into micro-batches
    under the capacity, simulated (in a fixed order, so deterministic; `should_stop` is checked
    every LOCAL_SEARCH_CLOCK_EVERY partitions and the best so far stands)."""
    items = tuple(sorted(int(item) for batch in packed.micro_batches for item in batch))
    sizes = {item: int(lengths[item]) for item in items}
    best_blocks: tuple[tuple[int, ...], ...] | None = None
    best_s = packed.time_s * (1 - 1e-12)
    for count, blocks in enumerate(_ordered_partitions(items)):
        if count % LOCAL_SEARCH_CLOCK_EVERY == 0 and should_stop():
            break
        if any(sum(sizes[item] for item in block) > coef.capacity_tokens for block in blocks):
            continue
        times = [_block_time_s(block, sizes, coef) for block in blocks]
        time_s = _time_s(times, coef)
        if time_s < best_s:
            best_blocks, best_s = blocks, time_s
    if best_blocks is None:
        return packed
    times = tuple(_block_time_s(block, sizes, coef) for block in best_blocks)
    return PackedPipeline(tuple(np.array(block, dtype=np.int64) for block in best_blocks), times, best_s)


def _block_time_s(block: tuple[int, ...], sizes: dict[int, int], coef: SchemeCoefficients) -> float:
    return coef.stage_time_s(float(sum(sizes[item] ** 2 for item in block)), float(sum(sizes[item] for item in block)))


def _ordered_partitions(items: tuple[int, ...]):
    """Every sequence of disjoint non-empty blocks covering `items`, each exactly once: the first
    block is every non-empty subset in turn, followed by every ordered partition of the rest."""
    if not items:
        yield ()
        return
    for size in range(1, len(items) + 1):
        for block in itertools.combinations(items, size):
            rest = tuple(item for item in items if item not in block)
            for tail in _ordered_partitions(rest):
                yield (block, *tail)


def _random_move(batches, tokens, squares, lengths, capacity, rng):
    """One random move of `improve_packing` as new (batches, tokens, squares), or None when it
    breaks the capacity or changes nothing."""
    count = len(batches)
    kind = rng.random()
    source, target = int(rng.integers(count)), int(rng.integers(count + 1))
    batches, tokens, squares = [list(batch) for batch in batches], list(tokens), list(squares)
    if kind < 0.25:  # reorder
        target %= count
        if source == target:
            return None
        for values in (batches, tokens, squares):
            values[source], values[target] = values[target], values[source]
        return batches, tokens, squares
    item = batches[source].pop(int(rng.integers(len(batches[source]))))
    length = float(lengths[item])
    tokens[source] -= length
    squares[source] -= length * length
    if kind < 0.65:  # move, to a new micro-batch when target == count
        if target == count:
            position = int(rng.integers(count + 1))
            batches.insert(position, [item])
            tokens.insert(position, length)
            squares.insert(position, length * length)
            if position <= source:
                source += 1
        else:
            if target == source or tokens[target] + length > capacity:
                return None
            batches[target].append(item)
            tokens[target] += length
            squares[target] += length * length
    else:  # swap with an item of another micro-batch
        target %= count
        if target == source or not batches[target]:
            return None
        other = batches[target].pop(int(rng.integers(len(batches[target]))))
        other_length = float(lengths[other])
        if tokens[source] + other_length > capacity or tokens[target] - other_length + length > capacity:
            return None
        batches[source].append(other)
        tokens[source] += other_length
        squares[source] += other_length * other_length
        batches[target].append(item)
        tokens[target] += length - other_length
        squares[target] += length * length - other_length * other_length
    if not batches[source]:
        del batches[source], tokens[source], squares[source]
    return batches, tokens, squares
