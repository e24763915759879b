"""Run a function on local ranks of a fresh torch.distributed process group.

`run_ranks(fn, nproc)` spawns `nproc` processes, each joins one process group (gloo by default, on
a free TCP port of 127.0.0.1), runs `fn(rank, world_size, *args)` and sends its return value back;
the values come back as a list by rank. Ranks die with the launcher: each asks Linux for SIGKILL
when its parent dies (`prctl(PR_SET_PDEATHSIG)`) and, everywhere, a thread polls its parent's
pid and exits the rank once it changed, so a SIGTERM or SIGKILL of the launcher leaves no rank
behind. A rank that raises makes the call raise `RankFailedError`
naming the rank and its exception (the other ranks are stopped); a rank that dies without a word
names its exit code; nothing waits past `timeout_s`. With `stall_timeout_s`, the ranks' progress
beats (`runtime.watchdog.beat`) are watched too, from the launch on (a rank beats when its process
is up and again before joining the group; until its first beat, its process using CPU counts as
progress): when no rank has made progress for that long, every rank is stopped and
`RankStalledError` names the ranks furthest behind and, for one, its pid (a hang is found within
`stall_timeout_s` even when `timeout_s` covers a long run). `on_progress(step, phase)` is called
in the parent, while it waits, each time the rank furthest behind moves on (`hydraplan run`'s
step lines).

`fn` must be picklable (a module-level function): ranks are started with `spawn`, which is safe
with torch's thread pools where `fork` is not. Return values travel pickled by value (tensors
included), never through shared memory that would die with the rank. The `nccl` backend is
accepted when CUDA has a device per rank (`ValueError` before any rank starts otherwise) and binds
rank r to `cuda:r`; it is untested here (no GPU in CI).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

__all__ = ["RankFailedError", "RankStalledError", "RankTimeoutError", "check_backend", "free_port", "run_ranks"]

BACKENDS = ("gloo", "nccl")
FAILURE_GRACE_S = 1.0
PARENT_POLL_S = 0.5
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class RankFailedError(RuntimeError):
    """A rank raised (or died); `rank` and the rank's formatted `traceback_text` are attached."""

    def __init__(self, rank: int, message: str, traceback_text: str = "") -> None:
        super().__init__(f"rank {rank} failed: {message}")
        self.rank = rank
        self.traceback_text = traceback_text


class RankTimeoutError(TimeoutError):
    """Some ranks did not finish within the time limit; `ranks` lists them."""

    def __init__(self, ranks: list[int], timeout_s: float) -> None:
        super().__init__(f"ranks {ranks} did not finish within {timeout_s:g} s (stopped)")
        self.ranks = ranks


class RankStalledError(TimeoutError):
    """No rank made progress for `stall_timeout_s`; `ranks` are the ones furthest behind."""

    def __init__(self, ranks: list[int], message: str) -> None:
        super().__init__(message + " (every rank stopped)")
        self.ranks = ranks


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def check_backend(backend: str, nproc: int) -> None:
    """`ValueError` (one line) unless `backend` can run `nproc` local ranks: NCCL needs CUDA and
    one device per rank (two ranks on one GPU are refused by NCCL itself)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: one of {', '.join(BACKENDS)}")
    if backend != "nccl":
        return
    import torch

    if not torch.cuda.is_available():
        raise ValueError("--backend nccl: no CUDA device is available (torch.cuda.is_available() is False); use gloo")
    if torch.cuda.device_count() < nproc:
        raise ValueError(
            f"--backend nccl: {nproc} ranks need {nproc} CUDA devices, this machine has {torch.cuda.device_count()}"
        )


def _die_with_parent(parent_pid: int) -> None:
    """End this rank when the launcher dies: Linux's parent-death signal, and a thread polling the
    parent pid (other systems, and a launcher that died before the signal was armed)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no libc prctl: the poll below still ends the rank
            pass
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch_parent() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch_parent, name="hydraplan-parent-watch", daemon=True).start()


def _rank_main(
    fn: Callable,
    rank: int,
    world_size: int,
    backend: str,
    port: int,
    timeout_s: float,
    num_threads: int | None,
    args,
    progress=None,
    parent_pid: int | None = None,
) -> None:
    """Body of one rank's process: join the group, run `fn`, report `(rank, ok, time, payload)`.

    A failure is reported before the group is torn down, stamped with the time it was caught: the
    ranks whose connections then break report later, so the parent can name the first one.
    """
    if parent_pid is not None:
        _die_with_parent(parent_pid)
    results = args[-1]
    args = args[:-1]
    dist = None
    try:
        import torch
        import torch.distributed as dist

        from hydraplan.runtime import watchdog

        if progress is not None:
            watchdog.attach(progress, rank)
        watchdog.beat(0, "start")
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
        if backend == "nccl":
            torch.cuda.set_device(rank)
        watchdog.beat(0, "join")
        with watchdog.waiting():
            dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))
        value = fn(rank, world_size, *args)
        results.put((rank, True, time.time(), pickle.dumps(value)))
    except BaseException as exc:  # reported to the parent, which raises it with the rank's name
        report = (f"{type(exc).__name__}: {exc}", traceback.format_exc())
        results.put((rank, False, time.time(), pickle.dumps(report)))
    finally:
        if dist is not None and dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(
    fn: Callable[..., Any],
    nproc: int,
    *,
    backend: str = "gloo",
    args: tuple = (),
    timeout_s: float = 120.0,
    num_threads: int | None = 1,
    stall_timeout_s: float | None = None,
    on_progress: Callable[[int, str], None] | None = None,
) -> list[Any]:
    """`[fn(0, nproc, *args), ..., fn(nproc - 1, nproc, *args)]`, each run in its own rank process.

    `num_threads` sets torch's intra-op threads per rank (1 by default: ranks share the cores);
    None leaves torch's default. `stall_timeout_s`: stop when no rank has beaten for this long
    (None: only `timeout_s`). `on_progress(step, phase)`: called in this process whenever the
    rank furthest behind beats a new (step, phase) (`runtime.watchdog.furthest_behind`).
    Raises `RankFailedError`, `RankStalledError` or `RankTimeoutError`.
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc: a positive integer is required, got {nproc!r}")
    check_backend(backend, nproc)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    progress = None
    if stall_timeout_s is not None or on_progress is not None:
        from hydraplan.runtime.watchdog import SLOTS_PER_RANK

        progress = context.Array("d", SLOTS_PER_RANK * nproc)
    processes = [
        context.Process(
            target=_rank_main,
            args=(fn, rank, nproc, backend, port, timeout_s, num_threads, (*args, results), progress, os.getpid()),
            name=f"hydraplan-rank-{rank}",
            daemon=True,
        )
        for rank in range(nproc)
    ]
    for process in processes:
        process.start()
    try:
        values = _collect(processes, results, timeout_s, progress, stall_timeout_s, on_progress)
    except BaseException:
        _stop(processes, wait_s=0.0)  # the others may be blocked in a collective with the failed rank
        raise
    _stop(processes, wait_s=10.0)
    return values


def _collect(
    processes: list,
    results,
    timeout_s: float,
    progress=None,
    stall_timeout_s: float | None = None,
    on_progress: Callable[[int, str], None] | None = None,
) -> list[Any]:
    """Wait for every rank's report; raise on a failure, a silent death, a stall or the deadline."""
    deadline = time.monotonic() + timeout_s
    values: dict[int, Any] = {}
    watch = _ProgressWatch(progress, len(processes), on_progress)
    startup = _StartupClock(processes)
    while len(values) < len(processes):
        watch.poll()
        try:
            report = results.get(timeout=0.1)
        except queue.Empty:
            _check_alive(processes, values)
            if progress is not None and stall_timeout_s is not None:
                running = [r for r in range(len(processes)) if r not in values]
                _check_progress(progress, stall_timeout_s, running, startup)
            if time.monotonic() > deadline:
                missing = [rank for rank in range(len(processes)) if rank not in values]
                raise RankTimeoutError(missing, timeout_s) from None
            continue
        rank, ok, _, payload = report
        if not ok:
            raise _first_failure(report, results, processes, values)
        values[rank] = pickle.loads(payload)
    watch.poll()
    return [values[rank] for rank in range(len(processes))]


class _ProgressWatch:
    """Calls `on_progress` when the rank furthest behind reaches a new (step, phase)."""

    def __init__(self, shared, nproc: int, on_progress: Callable[[int, str], None] | None) -> None:
        self.shared, self.nproc, self.on_progress = shared, nproc, on_progress
        self.last: tuple[int, str] | None = None

    def poll(self) -> None:
        if self.on_progress is None or self.shared is None:
            return
        from hydraplan.runtime.watchdog import furthest_behind

        position = furthest_behind(self.shared, self.nproc)
        if position is not None and position != self.last:
            self.last = position
            self.on_progress(*position)


def _first_failure(
    report: tuple, results, processes: list, values: dict[int, Any], grace_s: float = FAILURE_GRACE_S
) -> RankFailedError:
    """The failure caught first among `report` and those arriving within `grace_s`: when one rank
    raises, its peers' collectives break soon after, and those are not the cause. A rank that died
    without any report (killed, `os._exit`) comes before them all: its peers' broken connections
    can be reported before the parent sees it gone."""
    failures = [report]
    end = time.monotonic() + grace_s
    while (left := end - time.monotonic()) > 0:
        try:
            other = results.get(timeout=left)
        except queue.Empty:
            break
        if not other[1]:
            failures.append(other)
    reported = set(values) | {failure[0] for failure in failures}
    try:
        _check_alive(processes, {rank: None for rank in reported})
    except RankFailedError as died:
        return died
    rank, _, _, payload = min(failures, key=lambda failure: failure[2])
    message, traceback_text = pickle.loads(payload)
    return RankFailedError(rank, message, traceback_text)


class _StartupClock:
    """The launcher's sign of life of each rank before its first beat: the launch, then the last
    time its process's CPU time grew (Linux `/proc/PID/stat`; importing torch takes a while on a
    loaded machine, and a rank stopped or stuck there uses none)."""

    def __init__(self, processes: list) -> None:
        self.processes = processes
        now = time.monotonic()
        self.alive_at = {rank: now for rank in range(len(processes))}
        self.ticks: dict[int, int] = {}

    def poll(self, ranks: list[int]) -> dict[int, float]:
        now = time.monotonic()
        for rank in ranks:
            ticks = _cpu_ticks(self.processes[rank].pid)
            if ticks is not None and ticks != self.ticks.get(rank):
                self.ticks[rank], self.alive_at[rank] = ticks, now
        return self.alive_at

    def pids(self) -> dict[int, int]:
        return {rank: process.pid for rank, process in enumerate(self.processes)}


def _cpu_ticks(pid: int | None) -> int | None:
    """User + system CPU clock ticks of process `pid`, or None where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)
    except (OSError, IndexError, ValueError):
        return None


def _check_progress(progress, stall_timeout_s: float, running: list[int], startup: _StartupClock) -> None:
    """No running rank has made progress for `stall_timeout_s` (from the launch on): a hang."""
    from hydraplan.runtime.watchdog import describe_stall, stalled_for_s

    if not running:
        return
    stalled_s = stalled_for_s(progress, running, time.monotonic(), startup.poll(running))
    if stalled_s is not None and stalled_s > stall_timeout_s:
        raise RankStalledError(*describe_stall(progress, running, stalled_s, startup.pids()))


def _check_alive(processes: list, values: dict[int, Any]) -> None:
    """A rank that exited without reporting failed (killed, or crashed in native code)."""
    for rank, process in enumerate(processes):
        if rank in values or process.is_alive() or process.exitcode is None:
            continue
        if process.exitcode != 0:
            raise RankFailedError(rank, f"exited with code {process.exitcode} without a result")


def _stop(processes: list, wait_s: float) -> None:
    """Give the ranks `wait_s` to exit on their own; terminate, then kill, the ones still running."""
    deadline = time.monotonic() + wait_s
    for process in processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.terminate()
            if hasattr(signal, "SIGCONT"):  # a stopped rank acts on SIGTERM only once continued
                try:
                    os.kill(process.pid, signal.SIGCONT)
                except OSError:
                    pass
            process.join(timeout=5.0)
        if process.is_alive():
            process.kill()
            process.join()
