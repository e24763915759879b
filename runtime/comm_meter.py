"""Wall and CPU time of the collectives a rank runs inside one op (TP all-reduces, CP all-gathers).

gloo runs a collective on its own threads while the calling thread waits, so an op's thread CPU
time holds its compute and none of its communication. The parallel layers wrap every collective
in `timed(kind, num_bytes)`; while an op runs under `recording()`, each one appends its bytes, its
wall time and the CPU time the whole process spent during it (`time.process_time`: gloo's threads
copying and reducing; the calling thread sleeps meanwhile) to the op's list, in call order.

Every rank of a TP or CP group calls the same collectives in the same order, so the k-th entries
of the group's ranks are one collective. Its wall time includes waiting for the last rank to
arrive and, with the ranks oversubscribing the cores, waiting to be scheduled again; the CPU time
is the work itself (`runtime.step_timing` uses the mean over the group's ranks, and reports
the largest and the least wall time beside it). Outside `recording()` nothing is kept (the profiler and the
one-process check pay one `None` test per collective).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from hydraplan.runtime import watchdog

__all__ = ["CollectiveRecord", "recording", "timed"]


@dataclass(frozen=True)
class CollectiveRecord:
    """One collective call: what it was, its payload bytes on this rank, its wall and process CPU seconds."""

    kind: str
    num_bytes: int
    wall_s: float
    cpu_s: float


_active: list[CollectiveRecord] | None = None


@contextmanager
def recording() -> Iterator[list[CollectiveRecord]]:
    """Collect the collectives called inside the block (not re-entrant: one op at a time)."""
    global _active
    assert _active is None, "comm_meter.recording is not re-entrant"  # our own invariant
    records: list[CollectiveRecord] = []
    _active = records
    try:
        yield records
    finally:
        _active = None


@contextmanager
def timed(kind: str, num_bytes: int) -> Iterator[None]:
    """Time one collective of `num_bytes` payload bytes when an op is being recorded (and mark the
    rank as waiting for its peers meanwhile: `watchdog.waiting`)."""
    with watchdog.waiting():
        if _active is None:
            yield
            return
        started, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            _active.append(CollectiveRecord(kind, num_bytes, time.perf_counter() - started, time.process_time() - cpu))
