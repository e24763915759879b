"""Faults on a rank: an out-of-memory named by its micro-batch, and the hooks that break a rank on
purpose for the fault tests.

`oom_guard(op, assignment, index)` wraps one forward or backward of `pipeline_exec`: a
`torch.OutOfMemoryError` (or a `RuntimeError` saying "out of memory", as allocators and older
torch builds raise it) becomes one `MicroBatchOutOfMemoryError` naming the pipeline, its scheme,
the rank and stage, the micro-batch index, its token count and its sequences (split chunks as
`id[start:stop)`); the worker adds the step (`at_step`). The first line of torch's own message is
kept; torch's multi-line allocator report is not.

Test hooks (like `RunSpec.inject_nan_step`): a fault is `(kind, rank, step)`: "exit" ends that
rank's process at the start of that step with `os._exit(EXIT_CODE)` (no exception, no report, no
goodbye to its peers: a crash or a kill); "hang" makes that rank sleep for ever in place of its
part of that step's gradient sync, so the other ranks block in the sync's collective waiting for it;
"stop" sends that rank SIGSTOP in the forward of its first micro-batch of that step (a process
frozen by a debugger, the OOM killer's neighbour, a stuck driver: it neither exits nor beats).

A slowdown (`RunSpec.slowdowns`, `(rank, from_step, factor)`; `benchmarks/closed_loop.py` uses
it) makes that rank's compute `factor` times slower from that step on: after each forward or
backward call of the model, the rank burns `(factor - 1)` times the call's thread CPU
time in a busy loop inside the measured window (`burn_cpu`), so the slowdown shows in the measured
compute as a slower GPU's would (a sleep would not: the runtime measures thread CPU time).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from hydraplan.runtime.assignment import RankAssignment

__all__ = [
    "EXIT_CODE",
    "FAULT_KINDS",
    "MAX_LISTED_SEQUENCES",
    "MicroBatchOutOfMemoryError",
    "inject",
    "is_out_of_memory",
    "oom_guard",
    "burn_cpu",
    "slow_down",
    "slowdown_factor",
]

MAX_LISTED_SEQUENCES = 8


class MicroBatchOutOfMemoryError(RuntimeError):
    """One micro-batch ran out of memory; `str()` is one line (with the step once known)."""

    def __init__(self, where: str, step: int | None = None) -> None:
        self.where, self.step = where, step
        super().__init__(where if step is None else f"step {step}: {where}")

    def at_step(self, step: int) -> MicroBatchOutOfMemoryError:
        return MicroBatchOutOfMemoryError(self.where, step)


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's OOM error, or a RuntimeError whose message says "out of memory"."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def _sequences(assignment: RankAssignment, index: int) -> str:
    work = assignment.micro_batches[index]
    entries = [
        f"{sequence_id}[{offset}:{offset + length})"
        for sequence_id, offset, length in zip(work.sequence_ids, work.offsets, work.lengths)
    ]
    more = len(entries) - MAX_LISTED_SEQUENCES
    listed = ", ".join(entries[:MAX_LISTED_SEQUENCES]) + (f" and {more} more" if more > 0 else "")
    return f"{work.num_tokens} tokens, sequences {listed}"


@contextmanager
def oom_guard(op: str, assignment: RankAssignment, index: int) -> Iterator[None]:
    """Turn an out-of-memory inside the block into a `MicroBatchOutOfMemoryError` (see the module)."""
    try:
        yield
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        if isinstance(exc, MicroBatchOutOfMemoryError) or not is_out_of_memory(exc):
            raise
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        where = (
            f"out of memory in the {'forward' if op == 'F' else 'backward'} of micro-batch {index} of pipeline "
            f"{assignment.pipeline_index} {assignment.scheme} on rank {assignment.rank} "
            f"(stage {assignment.stage}): {_sequences(assignment, index)}: {first_line}"
        )
        raise MicroBatchOutOfMemoryError(where) from None


FAULT_KINDS = ("exit", "hang", "stop")
EXIT_CODE = 17


def inject(faults: Sequence[tuple[str, int, int]], kind: str, rank: int, step: int) -> None:
    """Apply the fault of `kind` planned for (`rank`, `step`), if any."""
    for fault_kind, fault_rank, fault_step in faults:
        assert fault_kind in FAULT_KINDS, fault_kind
        if (fault_kind, fault_rank, fault_step) != (kind, rank, step):
            continue
        if kind == "exit":
            os._exit(EXIT_CODE)
        if kind == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        while True:  # "hang": never returns; the watchdog or the launcher's deadline ends the process
            time.sleep(3600)


def slowdown_factor(slowdowns: Sequence[tuple[int, int, float]], rank: int, step: int) -> float:
    """How many times slower `rank` computes at `step`: the largest factor of the slowdowns
    `(rank, from_step, factor)` in force (1.0 without one)."""
    return max((factor for who, first, factor in slowdowns if who == rank and step >= first), default=1.0)


def slow_down(started_cpu_s: float, slowdown: float) -> None:
    """The slowdown fault: burn `slowdown - 1` times the thread CPU time spent since `started_cpu_s`
    (a model call's), so that the call looks `slowdown` times slower to a thread-CPU clock."""
    if slowdown > 1.0:
        burn_cpu((slowdown - 1.0) * (time.thread_time() - started_cpu_s))


def burn_cpu(seconds: float) -> None:
    """Keep this thread busy for `seconds` of its own CPU time (a busy loop of float work)."""
    deadline = time.thread_time() + seconds
    value = 1.0
    while time.thread_time() < deadline:
        for _ in range(1000):
            value = value * 1.000001 + 1e-9
