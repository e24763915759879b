"""Progress beats of the ranks, and the watchdogs that stop a run no rank advances any more.

Every rank marks where it is with `beat(step, phase)` (a phase is *entered* when it beats: "start"
is the rank's process up, "join" joining the process group, "setup" the worker before its first
plan; "plan" waits for the step's plan, "switch" re-shards, "compute" runs the 1F1B micro-batches, "sync" the
gradient sync, "loss" the loss all-reduce, "optimizer" the AdamW step). A rank that dies is seen
at once (its process is gone); a rank that hangs is not, and the ranks waiting for it in a
collective hang with it. So:

- under `hydraplan run` (`launch.run_ranks(..., stall_timeout_s=)`), each rank's last beat
  (time, step, phase, and whether it is blocked waiting for a peer: `waiting()`) lives in shared
  memory; the parent stops every rank when none has made progress for `stall_timeout_s` (a rank
  that has not beaten yet counts from the launch, or from the last time its process used CPU:
  start-up is watched too) and names the ranks furthest behind (`describe_stall`): the one that
  stopped before a collective is behind the ones waiting inside it, and among ranks at the same
  place, the ones not waiting for a peer are the stalled ones;
- under `torchrun` (no parent of ours), `LocalWatchdog` is a thread in each rank that exits the
  process (code 1) when its own rank has not beaten for `stall_timeout_s`, naming the rank and
  where it stopped; torchrun then stops the others.

`hold(step, phase)` keeps beating from a thread while a bounded wait runs (rank 0 asking the
planning service, whose retries and timeouts are themselves bounded).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "PHASES",
    "SLOTS_PER_RANK",
    "LocalWatchdog",
    "attach",
    "beat",
    "describe_stall",
    "furthest_behind",
    "hold",
    "last_beat",
    "stalled_for_s",
    "waiting",
]

PHASES = ("start", "join", "setup", "plan", "switch", "compute", "sync", "loss", "optimizer", "measurements", "done")
STARTUP_PHASES = ("start", "join", "setup")  # before the first step: the text names no step
PHASE_TEXT = {
    "start": "starting",
    "join": "joining the process group",
    "setup": "setting up",
    "plan": "waiting for its plan",
    "switch": "re-sharding for a strategy switch",
    "compute": "running its micro-batches",
    "sync": "in the gradient sync",
    "loss": "in the loss all-reduce",
    "optimizer": "in the optimizer step",
    "measurements": "sending the step's measurements to the planner",
    "done": "done",
}
SLOTS_PER_RANK = 4  # monotonic time of the last beat (0: none yet), step, phase index, waiting (0/1)

_shared = None  # the shared array of every rank's slots (multiprocessing.Array of doubles)
_rank = 0
_local: list[float] = [0.0, 0.0, 0.0]  # this process's own last beat (the torchrun watchdog)
_waiting_depth = 0


def attach(shared, rank: int) -> None:
    """Beats of this process go to slot `rank` of `shared` (set once per rank by the launcher)."""
    global _shared, _rank
    _shared, _rank = shared, rank


def beat(step: int, phase: str) -> None:
    """Mark that this rank entered `phase` of `step` now."""
    now = time.monotonic()
    code = float(PHASES.index(phase))
    _local[:] = [now, float(step), code]
    if _shared is not None:
        base = SLOTS_PER_RANK * _rank
        _shared[base : base + SLOTS_PER_RANK] = [now, float(step), code, float(_waiting_depth > 0)]


@contextmanager
def waiting() -> Iterator[None]:
    """Mark this rank as blocked waiting for its peers (a receive, a collective) while the body
    runs: a stalled rank is then told apart from the ranks waiting for it at the same phase."""
    global _waiting_depth
    _waiting_depth += 1
    if _shared is not None:
        _shared[SLOTS_PER_RANK * _rank + 3] = 1.0
    try:
        yield
    finally:
        _waiting_depth -= 1
        if _shared is not None and _waiting_depth == 0:
            _shared[SLOTS_PER_RANK * _rank + 3] = 0.0


def last_beat() -> tuple[float, int, str]:
    """This process's last beat: (monotonic time, step, phase); time 0 before the first."""
    return _local[0], int(_local[1]), PHASES[int(_local[2])]


@contextmanager
def hold(step: int, phase: str, every_s: float = 1.0) -> Iterator[None]:
    """Beat `phase` every `every_s` while the body runs (a wait bounded by its own timeouts)."""
    stop = threading.Event()

    def keep_beating() -> None:
        while not stop.wait(every_s):
            beat(step, phase)

    beat(step, phase)
    thread = threading.Thread(target=keep_beating, name="hydraplan-beat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _slots(shared, nproc: int) -> list[tuple[float, int, int]]:
    values = list(shared[: SLOTS_PER_RANK * nproc])
    return [tuple(values[SLOTS_PER_RANK * r : SLOTS_PER_RANK * r + 3]) for r in range(nproc)]


def _waiting_ranks(shared, ranks: list[int]) -> set[int]:
    values = list(shared[: SLOTS_PER_RANK * (max(ranks) + 1)])
    return {rank for rank in ranks if values[SLOTS_PER_RANK * rank + 3] > 0}


def stalled_for_s(shared, ranks: list[int], now: float, alive_at: dict[int, float] | None = None) -> float | None:
    """Seconds since the last progress of any of `ranks`: its last beat, or for a rank that has not
    beaten yet, `alive_at[rank]` (the launcher's last sign of life of its process: the launch, or
    the last time it used CPU); None while there is neither."""
    slots = _slots(shared, max(ranks) + 1) if ranks else []
    alive_at = alive_at or {}
    times = [slots[rank][0] if slots[rank][0] > 0 else alive_at.get(rank, 0.0) for rank in ranks]
    times = [at for at in times if at > 0]
    return now - max(times) if times else None


def furthest_behind(shared, nproc: int) -> tuple[int, str] | None:
    """(step, phase) of the rank furthest behind; None while some rank has not beaten yet."""
    slots = _slots(shared, nproc)
    if any(at == 0 for at, _, _ in slots):
        return None
    step, phase = min((int(step), int(phase)) for _, step, phase in slots)
    return step, PHASES[phase]


def describe_stall(
    shared, ranks: list[int], stalled_s: float, pids: dict[int, int] | None = None
) -> tuple[list[int], str]:
    """The ranks furthest behind among `ranks` (the still-running ones) and one line saying so:
    of the ranks at the earliest (step, phase), those not blocked waiting for a peer, if any
    (the others wait for them). `pids`: each rank's process id, named beside a single culprit."""
    slots = _slots(shared, max(ranks) + 1)
    waiting_now = _waiting_ranks(shared, ranks)

    def position(rank: int) -> tuple[int, int]:
        _, step, phase = slots[rank]
        return (int(step), int(phase)) if slots[rank][0] > 0 else (-1, 0)

    def where(rank: int) -> str:
        step, phase = position(rank)
        if step < 0:
            return "before its first beat"
        name = PHASES[phase]
        return PHASE_TEXT[name] if name in STARTUP_PHASES else f"step {step}, {PHASE_TEXT[name]}"

    behind = min(position(rank) for rank in ranks)
    culprits = [rank for rank in ranks if position(rank) == behind]
    working = [rank for rank in culprits if rank not in waiting_now]
    if working and len(working) < len(culprits):
        culprits = working
    others = [rank for rank in ranks if rank not in culprits]
    named = f"rank {culprits[0]}" if len(culprits) == 1 else f"ranks {culprits}"
    if len(culprits) == 1 and pids and culprits[0] in pids:
        named += f" (pid {pids[culprits[0]]})"
    line = f"{named} made no progress for {stalled_s:.0f} s ({where(culprits[0])})"
    if others:
        waiting = sorted({where(rank) for rank in others})
        line += f"; the other ranks {others} wait for it ({'; '.join(waiting)})"
    return culprits, line


class LocalWatchdog:
    """A thread that exits this process (code 1) when its rank has not beaten for `stall_s`
    (the rank hangs, or waits for one that does); for ranks with no launcher of ours (torchrun)."""

    def __init__(self, rank: int, stall_s: float, poll_s: float = 1.0) -> None:
        self.rank, self.stall_s, self.poll_s = rank, stall_s, poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hydraplan-watchdog", daemon=True)

    def __enter__(self) -> LocalWatchdog:
        if _local[0] == 0.0:
            beat(0, "start")
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            at, step, phase = last_beat()
            idle_s = time.monotonic() - at
            if idle_s > self.stall_s:
                print(
                    f"hydraplan worker: rank {self.rank}: error: no progress for {idle_s:.0f} s "
                    f"(step {step}, {PHASE_TEXT[phase]}): stopping this rank",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(1)
