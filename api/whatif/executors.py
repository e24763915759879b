"""Where a sweep's configurations run: in this process, a local process pool (the default), or Ray.

Every executor runs the same task, `engine.evaluate_row(index, configuration)`, and hands each row
to `on_row` as soon as it is finished (in any order; the tables sort by index). An interrupt stops
the pool (running configurations are abandoned, finished rows are already written).
"""

from __future__ import annotations

import multiprocessing
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Protocol

from hydraplan.api.files import InputError
from hydraplan.api.whatif.engine import evaluate_row
from hydraplan.api.whatif.schemas import Configuration, WhatifRow

Task = tuple[int, Configuration]
OnRow = Callable[[WhatifRow], None]
RAY_MISSING = "--executor ray needs Ray: pip install 'hydraplan[whatif]'"
RAY_CONNECT_TIMEOUT_S = 3.0
SOLVER_MODULES = ("highspy", "ortools", "pulp")


class Executor(Protocol):
    """Runs tasks and reports each finished row; the only thing a sweep asks of a backend."""

    name: str

    def run(self, tasks: Sequence[Task], on_row: OnRow) -> None: ...


class InlineExecutor:
    """One configuration after the other in this process (tests, debugging, `--workers 1`)."""

    name = "inline"

    def run(self, tasks: Sequence[Task], on_row: OnRow) -> None:
        for index, configuration in tasks:
            on_row(evaluate_row(index, configuration))


def _warm_up() -> None:
    """Import the solver libraries once per worker, before its first configuration."""
    from hydraplan.planner.schemas import SolverBackend
    from hydraplan.planner.solve import load_backend

    load_backend(SolverBackend.AUTO)


def _evaluate_task(task: Task) -> WhatifRow:
    return evaluate_row(*task)


def _start_method() -> str:
    """`fork` while this process has loaded no solver library (nothing has started solver threads
    that a fork would copy mid-run): workers start without importing hydraplan again; else `spawn`."""
    loaded = any(name in sys.modules for name in SOLVER_MODULES)
    return "fork" if not loaded and "fork" in multiprocessing.get_all_start_methods() else "spawn"


class LocalPoolExecutor:
    """`num_workers` local worker processes; each imports the solver libraries once."""

    name = "local"

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers

    def run(self, tasks: Sequence[Task], on_row: OnRow) -> None:
        if not tasks:
            return
        context = multiprocessing.get_context(_start_method())
        pool = context.Pool(min(self.num_workers, len(tasks)), initializer=_warm_up)
        try:
            for row in pool.imap_unordered(_evaluate_task, tasks, chunksize=1):
                on_row(row)
            pool.close()
        except BaseException:  # an interrupt or a failure: stop every worker now
            pool.terminate()
            raise
        finally:
            pool.join()


class RayExecutor:
    """The same tasks as Ray tasks: on the cluster at `address`, or on a local Ray instance."""

    name = "ray"

    def __init__(self, address: str | None, num_workers: int) -> None:
        check_ray_address(address)
        self.address = address
        self.num_workers = num_workers

    def run(self, tasks: Sequence[Task], on_row: OnRow) -> None:
        import ray

        started_here = not ray.is_initialized()
        if started_here:
            local = self.address is None
            ray.init(
                address=self.address,
                num_cpus=self.num_workers if local else None,
                include_dashboard=False if local else None,
                log_to_driver=False,
            )
        remote = ray.remote(num_cpus=1)(evaluate_row)
        pending = [remote.remote(index, configuration) for index, configuration in tasks]
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for reference in done:
                    on_row(ray.get(reference))
        finally:
            for reference in pending:
                ray.cancel(reference, force=True)
            if started_here:
                ray.shutdown()


def check_ray_address(address: str | None) -> None:
    """Refuse, before any work, a missing Ray or a `host:port` address nothing answers at."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise InputError(RAY_MISSING) from None
    if address is None or address == "auto":
        return
    target = address.removeprefix("ray://")
    host, _, port_text = target.rpartition(":")
    if not host or not port_text.isdigit():
        raise InputError(f"--ray-address {address}: expected HOST:PORT, ray://HOST:PORT or auto")
    try:
        with socket.create_connection((host, int(port_text)), timeout=RAY_CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InputError(f"--ray-address {address}: cannot reach {host}:{port_text} ({reason})") from None


def make_executor(name: str, num_workers: int, ray_address: str | None) -> Executor:
    """The executor `--executor NAME` names; `--ray-address` only goes with ray."""
    if ray_address is not None and name != "ray":
        raise InputError(f"--ray-address {ray_address}: only used with --executor ray")
    if name == "ray":
        return RayExecutor(ray_address, num_workers)
    if name == "inline" or num_workers == 1:
        return InlineExecutor()
    return LocalPoolExecutor(num_workers)
