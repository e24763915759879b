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

import numpy as np

from hydraplan.planner.cache import WeightedLru
from hydraplan.planner.kernels import one_f_one_b_end_times, one_f_one_b_order


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
