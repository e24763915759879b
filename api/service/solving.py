"""Running CPU-heavy solves off the event loop, with bounded concurrency and load shedding.

A request is *admitted* when fewer than `max_concurrent_solves + max_queued_solves` solves are
admitted; it then runs in one of `max_concurrent_solves` worker threads (waiting in the executor's
queue if all are busy). Beyond that the service answers 503 with `Retry-After` at once instead of
queueing without bound. The slot is freed when the solve's thread finishes, not when the request
ends, so a client that gave up cannot make the pool overcommit.

Threads, not processes: the solver's heavy lifting is numpy and HiGHS, which release the GIL for
much of their time, and threads let the `cancel` callback see an in-process flag. Use several
uvicorn workers (`hydraplan serve --workers N`) to use several cores for pure-Python work.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from hydraplan.api.service.metrics import Metrics
from hydraplan.api.service.problems import ProblemError, saturated

ResultT = TypeVar("ResultT")


class SolverPool:
    """A bounded thread pool for solves that refuses work (503) when full."""

    def __init__(self, max_running: int, max_queued: int, retry_after_s: int, metrics: Metrics) -> None:
        self.max_running = max_running
        self.max_admitted = max_running + max_queued
        self.retry_after_s = retry_after_s
        self._metrics = metrics
        self._executor: ThreadPoolExecutor | None = None  # made on first use, again after shutdown
        self._lock = threading.Lock()
        self._admitted = 0
        self._running = 0
        self._cancel_events: set[threading.Event] = set()

    @property
    def admitted(self) -> int:
        return self._admitted

    @property
    def running(self) -> int:
        return self._running

    def check_room(self) -> None:
        """The 503 `run` would raise now, raised before any work (the request guard calls it
        before reading a body); counted as a rejection like one."""
        with self._lock:
            if self._admitted >= self.max_admitted:
                raise self._refusal()

    async def run(self, function: Callable[..., ResultT], *args: Any) -> ResultT:
        """Run `function(*args, cancel=...)` in a worker thread; 503 when the pool is full.

        `cancel()` turns True when the awaiting request is cancelled or the app shuts down, so
        the solver stops early with its incumbent.
        """
        executor = self._admit()
        cancelled = threading.Event()
        context = contextvars.copy_context()  # keeps the request id for log lines in the thread
        future = asyncio.get_running_loop().run_in_executor(
            executor, context.run, self._call, function, cancelled, args
        )
        try:
            return await future
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def shutdown(self) -> None:
        """Ask running solves to stop and drop queued ones (a later `run` starts a new pool)."""
        with self._lock:
            for event in self._cancel_events:
                event.set()
            executor, self._executor = self._executor, None
            self._admitted = self._running  # the queued ones are dropped and never release
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    def _admit(self) -> ThreadPoolExecutor:
        """Take a slot and return the executor to run in; 503 when none is free."""
        with self._lock:
            if self._admitted >= self.max_admitted:
                raise self._refusal()
            self._admitted += 1
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.max_running, thread_name_prefix="hydraplan-solve")
            return self._executor

    def _refusal(self) -> ProblemError:
        self._metrics.rejections.labels(pool="solve").inc()
        return saturated(
            f"all {self.max_running} solver slots and {self.max_admitted - self.max_running} queue places "
            f"are taken; retry in {self.retry_after_s} s",
            self.retry_after_s,
        )

    def _call(self, function: Callable[..., ResultT], cancelled: threading.Event, args: tuple) -> ResultT:
        with self._lock:
            self._cancel_events.add(cancelled)
            self._running += 1
        self._metrics.solves_running.inc()
        try:
            return function(*args, cancel=cancelled.is_set)
        finally:
            self._metrics.solves_running.dec()
            with self._lock:
                self._running -= 1
            self._release(cancelled)

    def _release(self, cancelled: threading.Event) -> None:
        with self._lock:
            self._admitted -= 1
            self._cancel_events.discard(cancelled)
