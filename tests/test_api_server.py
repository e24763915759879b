"""The real server: `hydraplan serve` (uvicorn) on 127.0.0.1, called over HTTP with httpx, and
checked with the Dockerfile's own HEALTHCHECK command."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from api_support import STARTUP_TIMEOUT_S, dockerfile_healthcheck_command, free_port, plan_body, wait_for

pytestmark = [pytest.mark.service, pytest.mark.slow]


def serve_command(port: int) -> list[str]:
    """`hydraplan serve` exactly as the Dockerfile's CMD runs it (bound to loopback)."""
    arguments = ["serve", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    executable = shutil.which("hydraplan")
    if executable is not None:
        return [executable, *arguments]
    return [
        sys.executable,
        "-c",
        "import sys; from hydraplan.api.cli import main; sys.exit(main())",
        *arguments,
    ]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = free_port()
    environment = {**os.environ, "HYDRAPLAN_API_TOKEN": "test-token", "HYDRAPLAN_LOG_LEVEL": "INFO"}
    process = subprocess.Popen(
        serve_command(port),
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _healthy(base_url) or process.poll() is not None, timeout_s=STARTUP_TIMEOUT_S, interval_s=0.1)
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        yield base_url
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _healthy(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_plan_over_http(server: str) -> None:
    headers = {"Authorization": "Bearer test-token", "X-Request-ID": "over-http"}
    with httpx.Client(base_url=server, headers=headers, timeout=30) as http:
        response = http.post("/v1/plans", json=plan_body())
        assert response.status_code == 200, response.text
        assert response.headers["x-request-id"] == "over-http"
        assert response.json()["input_lengths"] == plan_body()["lengths"]

        session = http.post("/v1/sessions", json={k: v for k, v in plan_body().items() if k != "lengths"})
        assert session.status_code == 201, session.text
        step = http.post(f"{session.headers['location']}/plans", json={"lengths": plan_body()["lengths"]})
        assert step.status_code == 200, step.text

        unauthorised = httpx.get(f"{server}/v1/models", timeout=10)
        assert unauthorised.status_code == 401
        assert unauthorised.headers["content-type"].startswith("application/problem+json")
        assert "hydraplan_http_requests_total" in httpx.get(f"{server}/metrics", timeout=10).text
        assert httpx.get(f"{server}/openapi.json", timeout=10).json()["info"]["title"] == "hydraplan"


def test_dockerfile_healthcheck_command_passes(server: str) -> None:
    port = server.rsplit(":", 1)[1]
    command = [part.replace("8000", port) for part in dockerfile_healthcheck_command()]
    command[0] = sys.executable if command[0] == "python" else command[0]
    assert subprocess.run(command, timeout=30).returncode == 0
