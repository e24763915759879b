"""Exact event simulation of the 1F1B pipeline schedule with uneven micro-batches.

Schedule (Narayanan et al. 2021, PipeDream-Flush / Megatron "1F1B"): stage `j` of `pp` runs
`min(pp - j - 1, m)` warm-up forwards, then alternates one forward and one backward, then drains
the remaining backwards. A forward of micro-batch `i` on stage `j` waits for its forward on stage
`j - 1`; a backward waits for its backward on stage `j + 1`. Every stage of a scheme has the same
cost coefficients, so micro-batch `i` takes `fwd_fraction * t_i` forward and the rest backward on
every stage. Point-to-point transfer time is inside the stage-time coefficient `b`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hydraplan.planner.cache import WeightedLru


def stage_operations(stage: int, num_stages: int, num_micro_batches: int) -> list[tuple[bool, int]]:
    """The 1F1B order of one stage as (is_forward, micro_batch) pairs."""
    num_warmup = min(num_stages - stage - 1, num_micro_batches)
    operations = [(True, index) for index in range(num_warmup)]
    for step in range(num_micro_batches - num_warmup):
        operations.append((True, num_warmup + step))
        operations.append((False, step))
    operations += [(False, index) for index in range(num_micro_batches - num_warmup, num_micro_batches)]
    return operations


# Bytes one cached operation costs: a 4-tuple (88 bytes) of ints (28 bytes each past 256) plus
# its slot in the outer tuple.
_BYTES_PER_OPERATION = 8 + 88 + 4 * 28
# The orders of the (pp, m) pairs a solve uses are reused thousands of times; 64 MB holds ~300K
# operations, e.g. every pp <= 16 with m <= 100. Larger orders are rebuilt (linear) on each call.
_ORDERS: WeightedLru[tuple[int, int], tuple[tuple[int, int, int, int], ...]] = WeightedLru(
    64 << 20, lambda order: _BYTES_PER_OPERATION * len(order)
)


def dependency_order(num_stages: int, num_micro_batches: int) -> tuple[tuple[int, int, int, int], ...]:
    """`_dependency_order`, kept in a cache bounded by bytes."""
    return _ORDERS.get_or_make(
        (num_stages, num_micro_batches), lambda: _dependency_order(num_stages, num_micro_batches)
    )


def _dependency_order(num_stages: int, num_micro_batches: int) -> tuple[tuple[int, int, int, int], ...]:
    """Every operation of the schedule as (op, previous op on its stage, op it waits for, duration
    slot), in an order where both predecessors come first.

    Op ids: forward (j, i) is `j*m + i`, backward is `(pp + j)*m + i`; id `2*pp*m` is a sentinel
    that ended at time 0. Duration slot `i` is micro-batch i's forward, `m + i` its backward. The
    order is found once per (pp, m) by releasing operations as their predecessors finish.
    """
    num_micro = num_micro_batches
    sentinel = 2 * num_stages * num_micro
    per_stage = [_stage_entries(stage, num_stages, num_micro) for stage in range(num_stages)]
    cursor = [0] * num_stages
    done = bytearray(sentinel + 1)
    done[sentinel] = 1
    order: list[tuple[int, int, int, int]] = []
    while len(order) < sentinel:
        released = len(order)
        for stage, entries in enumerate(per_stage):
            position, end = cursor[stage], len(entries)
            while position < end:
                entry = entries[position]
                if not done[entry[2]]:
                    break
                order.append(entry)
                done[entry[0]] = 1
                position += 1
            cursor[stage] = position
        if len(order) == released:  # a schedule whose every next operation waits: a cycle, never 1F1B
            raise RuntimeError(f"1F1B order of pp={num_stages}, m={num_micro}: no operation can run")
    return tuple(order)


def _stage_entries(stage: int, num_stages: int, num_micro: int) -> list[tuple[int, int, int, int]]:
    """(op, previous op on the stage, op it waits for, duration slot) of one stage, in 1F1B order."""
    sentinel = 2 * num_stages * num_micro
    entries = []
    previous = sentinel
    for is_forward, index in stage_operations(stage, num_stages, num_micro):
        if is_forward:
            op = stage * num_micro + index
            waits_for = sentinel if stage == 0 else op - num_micro  # forward of the stage before
            slot = index
        else:
            op = (num_stages + stage) * num_micro + index
            # the last stage's backward follows its own forward, the others the next stage's backward
            waits_for = stage * num_micro + index if stage == num_stages - 1 else op + num_micro
            slot = num_micro + index
        entries.append((op, previous, waits_for, slot))
        previous = op
    return entries


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
    return end[num_stages * num_micro_batches + num_micro_batches - 1]


def _end_times(stage_times_s: Sequence[float], num_stages: int, fwd_fraction: float) -> list[float]:
    """End time of every operation (indexed by op id, sentinel last) of the 1F1B schedule."""
    num_micro_batches = len(stage_times_s)
    durations = [fwd_fraction * time_s for time_s in stage_times_s]
    durations += [time_s - fwd for time_s, fwd in zip(stage_times_s, durations)]
    end = [0.0] * (2 * num_stages * num_micro_batches + 1)
    for op, previous, waits_for, slot in dependency_order(num_stages, num_micro_batches):
        ready = end[previous] if end[previous] > end[waits_for] else end[waits_for]
        end[op] = ready + durations[slot]
    return end


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
    end = _end_times(stage_times_s, num_stages, fwd_fraction)
    blocks = []
    for op, previous, waits_for, _ in dependency_order(num_stages, num_micro):
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
