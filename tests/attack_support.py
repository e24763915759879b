"""Shared pieces of the attack and fault tests against a real uvicorn server
(tests/test_api_attacks.py: issue 10's; tests/test_api_attacks_workers.py: issue 29's, on two
workers): the token, the root path, the latency bound, and the helpers both use.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
from api_support import PROBLEM_JSON, Server, plan_body, start_uvicorn

TOKEN = "attack-test-token"
ROOT_PATH = "/api"
QUICK_S = 1.5  # "within 1 s", with slack for a loaded 2-core CI machine
LEASE_TTL_S = 1.0


def start_server(redis_url: str, prefix: str, workers: int = 1, **settings: Any) -> Server:
    """A server with this module's token, store and short leases, under the root path."""
    environment = {
        "HYDRAPLAN_API_TOKEN": TOKEN,
        "HYDRAPLAN_REDIS_URL": redis_url,
        "HYDRAPLAN_REDIS_PREFIX": prefix,
        "HYDRAPLAN_LEASE_TTL_S": str(LEASE_TTL_S),
        "HYDRAPLAN_MAX_CONCURRENT_SOLVES": "2",
        **{f"HYDRAPLAN_{name.upper()}": str(value) for name, value in settings.items()},
    }
    return start_uvicorn(environment, root_path=ROOT_PATH, token=TOKEN, workers=workers)


def assert_quick_problem(response: httpx.Response, elapsed_s: float, status: int, *parts: str) -> dict:
    assert response.status_code == status, response.text[:500]
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    assert elapsed_s < QUICK_S, f"{elapsed_s:.2f} s"
    problem = response.json()
    for part in parts:
        assert part in problem["detail"], problem["detail"]
    return problem


def proxied(location: str) -> str:
    """What the proxy in front of the server forwards for a Location the client follows: the
    path without the root path (the tests talk to uvicorn directly)."""
    assert location.startswith(ROOT_PATH + "/"), location
    return location.removeprefix(ROOT_PATH)


def timed(client: httpx.Client, method: str, path: str, **kwargs: Any) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    response = client.request(method, path, **kwargs)
    return response, time.perf_counter() - started


def small_plan(client: httpx.Client) -> dict:
    response = client.post("/v1/plans", json=plan_body())
    assert response.status_code == 200, response.text
    return response.json()


def long_job_body() -> dict:
    """A plan job that searches for a long time unless cancelled (returns its incumbent then)."""
    lengths = [64 + (index * 7919) % 16000 for index in range(1500)]
    return {
        "kind": "plan",
        "request": {
            "lengths": lengths,
            "num_gpus": 64,
            "model": "llama3-8b",
            "gpu": "h100-sxm-80gb",
            "options": {"time_limit_s": 120, "max_strategies_solved": 100000},
        },
    }


def finished_view(server: Server, job_id: str) -> dict | None:
    """The job's view once it has finished, else None (for `wait_for`)."""
    response = server.client().get(f"/v1/jobs/{job_id}")
    if response.status_code != 200:
        return None
    view = response.json()
    return view if view["status"] in ("succeeded", "failed", "cancelled") else None
