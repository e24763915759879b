"""Exact event simulation of the 1F1B pipeline schedule with uneven micro-batches.

Schedule (Narayanan et al. 2021, PipeDream-Flush / Megatron "1F1B"): stage `j` of `pp` runs
`min(pp - j - 1, m)` warm-up forwards, then alternates one forward and one backward, then drains
the remaining backwards. A forward of micro-batch `i` on stage `j` waits for its forward on stage
`j - 1`; a backward waits for its backward on stage `j + 1`. Every stage of a scheme has the same
cost coefficients, so micro-batch `i` takes `fwd_fraction * t_i` forward and the rest backward on
every stage. Point-to-point transfer time is inside the stage-time coefficient `b`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.planner.cache import WeightedLru
from hydraplan.planner.kernels import one_f_one_b_end_times, one_f_one_b_order
from hydraplan.planner.scheme import ParallelScheme


def stage_operations(stage: int, num_stages: int, num_micro_batches: int) -> list[tuple[bool, int]]:
    """The 1F1B order of one stage as (is_forward, micro_batch) pairs."""
    num_warmup = min(num_stages - stage - 1, num_micro_batches)
    operations = [(True, index) for index in range(num_warmup)]
    for step in range(num_micro_batches - num_warmup):
        operations.append((True, num_warmup + step))
        operations.append((False, step))
    operations += [(False, index) for index in range(num_micro_batches - num_warmup, num_micro_batches)]
    return operations


# The orders of the (pp, m) pairs a solve uses are reused thousands of times; 64 MB holds 2M
# operations (32 bytes each), e.g. every pp <= 16 with m <= 300. Larger orders are rebuilt
# (linear) on each call.
_ORDERS: WeightedLru[tuple[int, int], np.ndarray] = WeightedLru(64 << 20, lambda order: order.nbytes)


def dependency_order(num_stages: int, num_micro_batches: int) -> np.ndarray:
    """Every operation of the schedule as a row (op, previous op on its stage, op it waits for,
    duration slot), in an order where both predecessors come first: a read-only (2 pp m, 4) int64
    array (`kernels.one_f_one_b_order`, in the order of `stage_operations`), kept in a cache
    bounded by bytes.

    Op ids: forward (j, i) is `j*m + i`, backward is `(pp + j)*m + i`; id `2*pp*m` is a sentinel
    that ended at time 0. Duration slot `i` is micro-batch i's forward, `m + i` its backward.
    """
    return _ORDERS.get_or_make((num_stages, num_micro_batches), lambda: _order_array(num_stages, num_micro_batches))


def _order_array(num_stages: int, num_micro_batches: int) -> np.ndarray:
    order = one_f_one_b_order(num_stages, num_micro_batches)
    order.flags.writeable = False
    return order


def simulate_1f1b(stage_times_s: Sequence[float], num_stages: int, fwd_fraction: float) -> float:
    """Time from the first forward to the last backward of one pipeline running 1F1B.

    `stage_times_s[i]` is the forward+backward time of micro-batch `i` on one stage, in execution
    order. Returns 0.0 for no micro-batches.
    """
    num_micro_batches = len(stage_times_s)
    if num_micro_batches == 0:
        return 0.0
    if num_stages == 1:
        return float(sum(stage_times_s))
    end = _end_times(stage_times_s, num_stages, fwd_fraction)
    return float(end[num_stages * num_micro_batches + num_micro_batches - 1])


def _end_times(stage_times_s: Sequence[float], num_stages: int, fwd_fraction: float) -> np.ndarray:
    """End time of every operation (indexed by op id, sentinel last) of the 1F1B schedule: each
    starts when both its predecessors have ended (`kernels.one_f_one_b_end_times`)."""
    times = np.asarray(stage_times_s, dtype=np.float64)
    forwards = fwd_fraction * times
    durations = np.concatenate([forwards, times - forwards])
    return one_f_one_b_end_times(durations, dependency_order(num_stages, len(times)))


@dataclass(frozen=True)
class ScheduledBlock:
    """One operation of the simulated schedule: a forward or a backward of one micro-batch
    (index in execution order) on one PP stage, from `start_s` to `end_s`."""

    stage: int
    micro_batch: int
    is_forward: bool
    start_s: float
    end_s: float


def schedule_1f1b(stage_times_s: Sequence[float], num_stages: int, fwd_fraction: float) -> list[ScheduledBlock]:
    """Every block of the schedule `simulate_1f1b` times, in stage order then 1F1B order.

    The end times are the very numbers `simulate_1f1b` computes (same recurrence, same order), so
    the last backward of stage 0 ends at its result (up to the rounding of a sum for pp == 1,
    where `simulate_1f1b` adds whole stage times instead). A block starts when both its
    predecessors (the previous block on its stage, the block it waits for) have ended.
    """
    num_micro = len(stage_times_s)
    if num_micro == 0:
        return []
    end = _end_times(stage_times_s, num_stages, fwd_fraction).tolist()
    blocks = []
    for op, previous, waits_for, _ in dependency_order(num_stages, num_micro).tolist():
        is_forward = op < num_stages * num_micro
        stage, micro_batch = divmod(op if is_forward else op - num_stages * num_micro, num_micro)
        start_s = max(end[previous], end[waits_for])
        blocks.append(ScheduledBlock(stage, micro_batch, is_forward, start_s, end[op]))
    blocks.sort(key=lambda block: block.stage)  # stable: each stage keeps its 1F1B order
    return blocks


def approximate_1f1b_s(stage_times_s: Sequence[float], num_stages: int) -> float:
    """Cheap estimate used to rank packings: work of stage 0 plus a bubble of pp-1 largest."""
    if not stage_times_s:
        return 0.0
    return float(sum(stage_times_s) + (num_stages - 1) * max(stage_times_s))


# ---------------------------------------------------------------------------------------------
# Interleaved 1F1B (virtual pipeline stages)
# ---------------------------------------------------------------------------------------------
#
# Megatron-Core's interleaved schedule (Narayanan et al., SC'21, section 2.2; the order of
# `megatron/core/pipeline_parallel/schedules.py`, `get_schedule_table` and
# `get_pp_rank_microbatches`): each of the `pp` ranks holds `v` model chunks, rank j's chunk c
# being virtual stage `c * pp + j` of the `v * pp` in layer order. The ranks walk the same table of
# (micro-batch, chunk) pairs: micro-batches in groups of `group` (`microbatch_group_size_per_vp_stage`,
# default pp), each group through chunk 0, then chunk 1, ..., the last group holding what is left.
# Rank j runs `2 (pp - j - 1) + (v - 1) group` warm-up forwards (at most all), then one forward and
# one backward in turn, then the remaining backwards; its k-th backward is the k-th table pair with
# the chunk mirrored (v - 1 - c). A forward waits for the same micro-batch's forward on the virtual
# stage before; a backward for its backward on the virtual stage after, the last one for its own
# forward. Micro-batch i takes `fwd_fraction * t_i / v` forward and the rest of `t_i / v` backward
# on every chunk (`t_i`: its time on one stage of `pp`, the layers split evenly).


def check_interleaved_group(num_stages: int, num_micro_batches: int, group: int) -> None:
    """Megatron-Core's conditions on the group size: `pp <= group <= m`, and the last group, when
    smaller, holds at least pp micro-batches (else it raises, citing dependency bubbles). With the
    default group (pp) the micro-batches must come in a multiple of pp."""
    if not num_stages <= group <= num_micro_batches:
        raise ValueError(
            f"interleaved 1F1B needs pp <= group <= micro-batches: pp {num_stages}, group {group}, "
            f"{num_micro_batches} micro-batches"
        )
    remainder = num_micro_batches % group
    if 0 < remainder < num_stages:
        raise ValueError(
            f"interleaved 1F1B: {num_micro_batches} micro-batches leave a last group of {remainder} "
            f"(group {group}), fewer than pp {num_stages}: Megatron-Core refuses it"
        )


def interleaved_table(num_micro_batches: int, num_chunks: int, group: int) -> list[tuple[int, int]]:
    """The (micro-batch, chunk) pairs every rank walks, in order."""
    table = []
    for first in range(0, num_micro_batches, group):
        members = range(first, min(first + group, num_micro_batches))  # the last group: what is left
        table += [(micro_batch, chunk) for chunk in range(num_chunks) for micro_batch in members]
    return table


def interleaved_operations(
    rank: int, num_stages: int, num_chunks: int, num_micro_batches: int, group: int
) -> list[tuple[bool, int, int]]:
    """One rank's operations as (is_forward, micro_batch, chunk), in execution order."""
    table = interleaved_table(num_micro_batches, num_chunks, group)
    total = len(table)
    warmup = min(total, 2 * (num_stages - rank - 1) + (num_chunks - 1) * group)
    operations = [(True, *table[k]) for k in range(warmup)]
    for k in range(total - warmup):
        operations.append((True, *table[k + warmup]))
        micro_batch, chunk = table[k]
        operations.append((False, micro_batch, num_chunks - 1 - chunk))
    for k in range(total - warmup, total):
        micro_batch, chunk = table[k]
        operations.append((False, micro_batch, num_chunks - 1 - chunk))
    return operations


_INTERLEAVED_ORDERS: WeightedLru[tuple[int, int, int, int], np.ndarray] = WeightedLru(
    64 << 20, lambda order: order.nbytes
)


def interleaved_dependency_order(num_stages: int, num_chunks: int, num_micro_batches: int, group: int) -> np.ndarray:
    """Every operation as a row (op, previous op on its rank, op it waits for, duration slot) in
    an order where both predecessors come first, for `kernels.one_f_one_b_end_times` (read-only,
    cached by bytes). Op ids over the `s = v * pp` virtual stages: forward (stage, i) is
    `stage * m + i`, backward `(s + stage) * m + i`; `2 s m` is the sentinel that ended at 0.
    Slot i is micro-batch i's forward on one chunk, `m + i` its backward."""
    key = (num_stages, num_chunks, num_micro_batches, group)
    return _INTERLEAVED_ORDERS.get_or_make(key, lambda: _interleaved_rows(*key))


def _interleaved_rows(num_stages: int, num_chunks: int, num_micro: int, group: int) -> np.ndarray:
    virtual = num_chunks * num_stages
    sentinel = 2 * virtual * num_micro
    per_rank = []
    for rank in range(num_stages):
        operations = []
        for forward, micro_batch, chunk in interleaved_operations(rank, num_stages, num_chunks, num_micro, group):
            stage = chunk * num_stages + rank
            if forward:
                op = stage * num_micro + micro_batch
                waits = op - num_micro if stage > 0 else sentinel
                slot = micro_batch
            else:
                op = (virtual + stage) * num_micro + micro_batch
                # the last virtual stage's backward waits for its own forward
                waits = op + num_micro if stage < virtual - 1 else stage * num_micro + micro_batch
                slot = num_micro + micro_batch
            operations.append((op, waits, slot))
        per_rank.append(operations)
    released = np.zeros(sentinel + 1, dtype=bool)
    released[sentinel] = True
    rows: list[tuple[int, int, int, int]] = []
    place = [0] * num_stages
    previous = [sentinel] * num_stages
    while len(rows) < sentinel:
        before = len(rows)
        for rank, operations in enumerate(per_rank):  # release each rank as far as it can go
            while place[rank] < len(operations) and released[operations[place[rank]][1]]:
                op, waits, slot = operations[place[rank]]
                rows.append((op, previous[rank], waits, slot))
                released[op] = True
                previous[rank] = op
                place[rank] += 1
        if len(rows) == before:
            raise RuntimeError(f"interleaved order deadlocks: pp {num_stages}, v {num_chunks}, m {num_micro}")
    order = np.array(rows, dtype=np.int64)
    order.flags.writeable = False
    return order


def simulate_interleaved_1f1b(
    stage_times_s: Sequence[float], num_stages: int, num_chunks: int, fwd_fraction: float, group: int | None = None
) -> float:
    """Time from the first forward to the last backward of one pipeline running Megatron-Core's
    interleaved 1F1B with `num_chunks` chunks per rank (`stage_times_s[i]`: micro-batch i's
    forward+backward time on one of the `num_stages` stages, in execution order; `group`: the
    micro-batch group size, default pp). One chunk is plain 1F1B (`simulate_1f1b`). Raises
    `ValueError` where Megatron-Core refuses the micro-batch count (`check_interleaved_group`)."""
    if num_chunks == 1 or num_stages == 1:
        return simulate_1f1b(stage_times_s, num_stages, fwd_fraction)
    num_micro = len(stage_times_s)
    if num_micro == 0:
        return 0.0
    group = num_stages if group is None else group
    check_interleaved_group(num_stages, num_micro, group)
    times = np.asarray(stage_times_s, dtype=np.float64) / num_chunks
    forwards = fwd_fraction * times
    durations = np.concatenate([forwards, times - forwards])
    order = interleaved_dependency_order(num_stages, num_chunks, num_micro, group)
    return float(one_f_one_b_end_times(durations, order)[:-1].max())


def schedule_interleaved_1f1b(
    stage_times_s: Sequence[float], num_stages: int, num_chunks: int, fwd_fraction: float, group: int | None = None
) -> list[ScheduledBlock]:
    """Every block `simulate_interleaved_1f1b` times (one per chunk operation; `stage` is the rank),
    in rank order then execution order; the latest end is its result."""
    num_micro = len(stage_times_s)
    if num_micro == 0:
        return []
    group = num_stages if group is None else group
    check_interleaved_group(num_stages, num_micro, group)
    times = np.asarray(stage_times_s, dtype=np.float64) / num_chunks
    forwards = fwd_fraction * times
    order = interleaved_dependency_order(num_stages, num_chunks, num_micro, group)
    end = one_f_one_b_end_times(np.concatenate([forwards, times - forwards]), order).tolist()
    virtual = num_chunks * num_stages
    blocks = []
    for op, previous, waits_for, _ in order.tolist():
        is_forward = op < virtual * num_micro
        stage, micro_batch = divmod(op if is_forward else op - virtual * num_micro, num_micro)
        start_s = max(end[previous], end[waits_for])
        blocks.append(ScheduledBlock(stage % num_stages, micro_batch, is_forward, start_s, end[op]))
    blocks.sort(key=lambda block: block.stage)  # stable: each rank keeps its order
    return blocks


# ---------------------------------------------------------------------------------------------
# One pipeline of a plan, whichever schedule its scheme runs
# ---------------------------------------------------------------------------------------------
#
# The rule hydraplan plans interleaved pipelines by: Megatron-Core's default group size
# (`microbatch_group_size_per_vp_stage = pp`), so a pipeline with v > 1 runs a multiple of pp
# micro-batches (none at all when idle). Its memory model (rank 0's in-flight count
# `2 (pp - 1) + (v - 1) pp + 1`, `schemas.default_in_flight_micro_batches`) is then the one its
# capacity was derived for; a larger group would hold more. Other counts are priced infinite, so
# the packer never keeps one.


def interleaved_count_ok(scheme: ParallelScheme, num_micro_batches: int) -> bool:
    """Whether a pipeline of this scheme may run this many micro-batches (see above)."""
    return scheme.v == 1 or num_micro_batches % scheme.pp == 0


def pipeline_time_s(stage_times_s: Sequence[float], scheme: ParallelScheme, fwd_fraction: float) -> float:
    """Time of one pipeline: `simulate_1f1b` for v = 1, `simulate_interleaved_1f1b` with groups of
    pp for v > 1 (`stage_times_s[i]`: micro-batch i on one rank, all its chunks); inf for a micro-batch
    count the interleaved rule refuses."""
    if scheme.v == 1:
        return simulate_1f1b(stage_times_s, scheme.pp, fwd_fraction)
    if not interleaved_count_ok(scheme, len(stage_times_s)):
        return math.inf
    return simulate_interleaved_1f1b(stage_times_s, scheme.pp, scheme.v, fwd_fraction, scheme.pp)


def approximate_pipeline_s(stage_times_s: Sequence[float], scheme: ParallelScheme) -> float:
    """`approximate_1f1b_s` with the bubble shrunk v times for an interleaved scheme (Narayanan
    et al. 2021 §2.2.2), inf for a micro-batch count it refuses."""
    if scheme.v == 1:
        return approximate_1f1b_s(stage_times_s, scheme.pp)
    if not interleaved_count_ok(scheme, len(stage_times_s)):
        return math.inf
    if not stage_times_s:
        return 0.0
    return float(sum(stage_times_s) + (scheme.pp - 1) * max(stage_times_s) / scheme.v)
