"""Issue 10's defects, replayed against a real uvicorn server (run with `--root-path /api` as
behind a proxy that strips that prefix, with a token and a Redis store of its own) as an attacker
or a careless user would send them: each gets a bounded answer in about a second, the server's
memory stays flat, and faults (SIGTERM, SIGKILL, a Redis outage) leave no job or session stuck.
Issue 29's, against two workers: tests/test_api_attacks_workers.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from api_support import TINY_LENGTHS, Server, plan_body, running_redis, session_body, wait_for
from attack_support import (
    LEASE_TTL_S,
    ROOT_PATH,
    TOKEN,
    assert_quick_problem,
    finished_view,
    long_job_body,
    proxied,
    small_plan,
    start_server,
    timed,
)

pytestmark = [pytest.mark.service, pytest.mark.slow]


@pytest.fixture(scope="module")
def redis_server() -> Iterator[tuple[str, subprocess.Popen]]:
    """A Redis of this module's own: the outage test pauses it."""
    with running_redis() as running:
        yield running


@pytest.fixture(scope="module")
def server(redis_server: tuple[str, subprocess.Popen]) -> Iterator[Server]:
    running = start_server(redis_server[0], "attacks:", max_profiles=3, max_sessions=4)
    yield running
    running.stop()


def test_no_token_no_service_under_the_root_path(server: Server) -> None:
    anonymous = server.client(token=None)
    for path in ("/v1/plans", "/v1/jobs", "/v1/sessions", "/v1/profiles", "/v1/estimate", "/v1/plans/check"):
        for url in (path, path.replace("/v1", "/v1/", 1)):
            assert_quick_problem(anonymous.post(url, json=plan_body()), 0, 401)
    assert_quick_problem(anonymous.get("/v1/schemes?model=tiny&gpu=h100-sxm-80gb&num_gpus=8"), 0, 401)
    # a proxy that forwards the prefix too (the old guard's blind spot: the path no longer starts
    # with /v1); with the token the same request is served
    assert_quick_problem(anonymous.post(ROOT_PATH + "/v1/plans", json=plan_body()), 0, 401)
    assert anonymous.get("/healthz").status_code == 200
    assert server.client().post("/v1/plans", json=plan_body()).status_code == 200


def test_hostile_inputs_are_refused_quickly_with_flat_memory(server: Server) -> None:
    client = server.client()
    plan = small_plan(client)
    before = server.rss_bytes()
    huge_pp = json.loads(json.dumps(plan))
    huge_pp["pipelines"][0]["scheme"]["pp"] = 20000
    huge_pp["pipelines"][0]["micro_batches"] = huge_pp["pipelines"][0]["micro_batches"][:1] * 200
    wide_plan = json.loads(json.dumps(plan))
    wide_plan["pipelines"][0]["scheme"]["pp"] = 4000
    wide_plan["pipelines"][0]["micro_batches"] = wide_plan["pipelines"][0]["micro_batches"][:1] * 200
    cases: list[tuple[str, str, dict, int, str]] = [
        ("POST", "/v1/plans", plan_body(previous_strategy="10000000x<1,1,1>"), 422, "65536 GPUs"),
        ("POST", "/v1/plans", plan_body(previous_strategy="1000000000x<1,1,1>"), 422, "GPUs"),
        ("POST", "/v1/plans", plan_body(previous_plan={**plan, "strategy": "10000000x<1,1,1>"}), 422, "GPUs"),
        ("POST", "/v1/plans/check", {"plan": huge_pp}, 422, "less than or equal to 4096"),
        ("POST", "/v1/plans/check", {"plan": wide_plan}, 422, "1F1B operations"),
        ("POST", "/v1/estimate", {**plan_body(), "strategy": [{"tp": 1, "pp": 1, "num_pipelines": 10**9}]}, 422, ""),
        ("POST", "/v1/estimate", {**plan_body(), "strategy": [{"tp": 1, "pp": 1, "num_pipelines": 9}]}, 422, "9 GPUs"),
        ("POST", "/v1/plans", plan_body(gpus_per_node=10**9), 422, "less than or equal to 72"),
        ("POST", "/v1/sessions", session_body(gpus_per_node=10**9), 422, "less than or equal to 72"),
        ("POST", "/v1/plans", plan_body(lengths=[True, 5]), 422, "valid integer"),
        ("POST", "/v1/plans", plan_body(lengths=["5"]), 422, "valid integer"),
        ("POST", "/v1/plans", plan_body(lengths=[10**12], options={"oversize": "split"}), 422, "less than or equal"),
        (
            "POST",
            "/v1/jobs",
            {"kind": "sweep", "base": plan_body(), "vary": {"num_gpus": [8] * 1_000_000}},
            422,
            "at most 1024",
        ),
        ("POST", "/v1/jobs", {"kind": "sweep", "base": plan_body(), "vary": {"num_gpus": [8] * 65}}, 422, "65 items"),
        (
            "POST",
            "/v1/jobs",
            {"kind": "sweep", "base": plan_body(lengths=[100] * 200_000), "vary": {"num_gpus": [8] * 64}},
            413,
            "sequences",
        ),
    ]
    for method, path, body, status, part in cases:
        response, elapsed_s = timed(client, method, path, json=body)
        assert_quick_problem(response, elapsed_s, status, part)
    response, elapsed_s = timed(
        client, "GET", "/v1/schemes?model=tiny&gpu=h100-sxm-80gb&num_gpus=8&gpus_per_node=1000000000"
    )
    assert_quick_problem(response, elapsed_s, 422, "less than or equal to 72")
    # Non-finite and overflowing numbers: JSON's Infinity literal (Python's json writes it) and 1e308
    profile = {
        "num_layers": 4,
        "gpu_memory_bytes": float("inf"),
        "schemes": [{"tp": 1, "pp": 1, "a": 0, "b": 1e-4, "static_bytes": 1e9, "activation_bytes_per_token": 1e5}],
    }
    for body in (
        plan_body(model=None, gpu=None, profile=profile),
        plan_body(
            model=None,
            gpu=None,
            profile={
                **profile,
                "gpu_memory_bytes": 8e10,
                "schemes": [{"tp": 1, "pp": 1, "a": 1e308, "b": 1e-4, "capacity_tokens": 100_000}],
            },
        ),
        plan_body(gpu={**client.get("/v1/gpus").json()["gpus"][0], "memory_bytes": float("inf")}),
    ):
        response, elapsed_s = timed(
            client, "POST", "/v1/plans", content=json.dumps(body), headers={"content-type": "application/json"}
        )
        assert_quick_problem(response, elapsed_s, 422)
    growth = server.rss_bytes() - before
    assert growth < 100 * 2**20, f"the server grew {growth / 2**20:.0f} MiB over {len(cases) + 4} requests"


def test_stored_state_is_capped(server: Server, user_profile_data: dict) -> None:
    client = server.client()
    for index in range(3):
        response = client.post("/v1/profiles", json={**user_profile_data, "notes": f"profile {index}"})
        assert response.status_code == 201, response.text
    again = client.post("/v1/profiles", json={**user_profile_data, "notes": "profile 0"})
    assert again.status_code == 201  # the same profile renews, it takes no new place
    assert_quick_problem(client.post("/v1/profiles", json={**user_profile_data, "notes": "one more"}), 0, 507, "3")
    created = [client.post("/v1/sessions", json=session_body()) for _ in range(4)]
    assert [response.status_code for response in created] == [201] * 4
    assert_quick_problem(client.post("/v1/sessions", json=session_body()), 0, 507, "4 live sessions")
    assert client.delete(proxied(created[0].headers["location"])).status_code == 204
    assert client.post("/v1/sessions", json=session_body()).status_code == 201


def test_faults_leave_no_job_or_session_stuck(redis_server: tuple[str, subprocess.Popen]) -> None:
    redis_url, redis_process = redis_server
    prefix = f"faults-{time.monotonic_ns()}:"
    first = start_server(redis_url, prefix)
    survivor = start_server(redis_url, prefix)
    try:
        # SIGTERM: the running job records `cancelled` with its best plan before the process exits
        job = first.client().post("/v1/jobs", json=long_job_body()).json()
        wait_for(lambda: survivor.client().get(f"/v1/jobs/{job['job_id']}").json()["status"] == "running", 30)
        time.sleep(1.0)  # let it find an incumbent
        first.stop(signal.SIGTERM)
        view = survivor.client().get(f"/v1/jobs/{job['job_id']}").json()
        assert view["status"] == "cancelled" and view["result"] is not None, view["status"]

        # SIGKILL: the job fails with a reason once its lease expires; the session frees too
        killed = start_server(redis_url, prefix)
        job = killed.client().post("/v1/jobs", json=long_job_body()).json()
        options = {"time_limit_s": 3, "max_strategies_solved": 100000}  # each batch takes its 3 s
        session = killed.client().post("/v1/sessions", json=session_body(options=options)).json()
        session_plans = f"/v1/sessions/{session['session_id']}/plans"
        planning = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _POST_SCRIPT,
                killed.url + session_plans,
                json.dumps({"batches": [TINY_LENGTHS] * 16}),
                TOKEN,
            ],
        )
        wait_for(lambda: survivor.client().get(f"/v1/jobs/{job['job_id']}").json()["status"] == "running", 30)
        import redis

        store = redis.Redis.from_url(redis_url)
        wait_for(lambda: store.exists(f"{prefix}session-lock:{session['session_id']}"), 30)  # the call holds it
        assert survivor.client().post(session_plans, json={"lengths": [100, 200]}).status_code == 409
        killed.stop(signal.SIGKILL)
        planning.wait(timeout=30)
        view = wait_for(lambda: finished_view(survivor, job["job_id"]), timeout_s=10 * LEASE_TTL_S + 5)
        assert view["status"] == "failed" and "worker" in view["error"]["detail"]
        freed = wait_for(
            lambda: (
                (status := survivor.client().post(session_plans, json={"lengths": [100, 200]}).status_code) != 409
                and status
            ),
            timeout_s=10 * LEASE_TTL_S + 10,
        )
        assert freed == 200

        # DELETE asks a live worker to stop: the running solve returns its best plan
        job = survivor.client().post("/v1/jobs", json=long_job_body()).json()
        wait_for(lambda: survivor.client().get(f"/v1/jobs/{job['job_id']}").json()["status"] == "running", 30)
        assert survivor.client().delete(f"/v1/jobs/{job['job_id']}").status_code == 202
        view = wait_for(lambda: finished_view(survivor, job["job_id"]), timeout_s=30)
        assert view["status"] == "cancelled" and view["result"] is not None

        # A 5 s Redis outage under load: 503s while it lasts, then everything answers again
        job = survivor.client().post("/v1/jobs", json={"kind": "plan", "request": plan_body()}).json()
        redis_process.send_signal(signal.SIGSTOP)
        try:
            statuses = _load(survivor, seconds=5.0)
        finally:
            redis_process.send_signal(signal.SIGCONT)
        assert statuses and all(status in (200, 201, 503) for status in statuses), sorted(set(statuses))
        view = wait_for(lambda: finished_view(survivor, job["job_id"]), timeout_s=30)
        assert view["status"] in ("succeeded", "failed"), view
        assert survivor.client().post("/v1/plans", json=plan_body()).status_code == 200
    finally:
        for server in (first, survivor):
            server.stop()


def _load(server: Server, seconds: float) -> list[int]:
    """Statuses of requests sent by 50 threads for `seconds` (plans and session creations)."""
    from concurrent.futures import ThreadPoolExecutor

    deadline = time.monotonic() + seconds

    def client_loop(index: int) -> list[int]:
        seen = []
        with server.client() as client:
            client.timeout = httpx.Timeout(10)
            while time.monotonic() < deadline:
                path, body = ("/v1/sessions", session_body()) if index % 5 == 0 else ("/v1/plans", plan_body())
                try:
                    seen.append(client.post(path, json=body).status_code)
                except httpx.TimeoutException:
                    seen.append(-1)
        return seen

    with ThreadPoolExecutor(50) as pool:
        return [status for statuses in pool.map(client_loop, range(50)) for status in statuses]


_POST_SCRIPT = """
import sys, httpx
try:
    httpx.post(sys.argv[1], content=sys.argv[2], headers={"content-type": "application/json",
               "authorization": "Bearer " + sys.argv[3]}, timeout=60)
except httpx.HTTPError:
    pass
"""
