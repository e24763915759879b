"""Issue 29's defects, the second round of attacks and faults, replayed against a real uvicorn
with two workers under its supervisor (which kills a worker that misses its 5 s health ping),
a token, `--root-path /api` and a Redis server of the module's own: what a client sees is
asserted (status, a latency bound where the issue asks for one, no 5xx but 503, jobs ending with
their best plan, worker PIDs unchanged, memory bounded).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from api_support import Server, plan_body, running_redis, session_body, wait_for
from attack_support import (
    QUICK_S,
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
BODY_READ_S = 15.0  # how long the two-worker server waits for a body (408 after)
HOLD_SLACK_S = 8.0  # what the checks after two held bodies may take before the first hold's BODY_READ_S ends


@pytest.fixture(scope="module")
def redis_server() -> Iterator[tuple[str, subprocess.Popen]]:
    """A Redis of this module's own: the pause tests stop it."""
    with running_redis() as running:
        yield running


@pytest.fixture(scope="module")
def two_workers(redis_server: tuple[str, subprocess.Popen]) -> Iterator[Server]:
    """A server of two uvicorn workers under the supervisor that kills a worker which does not
    answer its health ping within 5 s (issue 29): its worker PIDs must never change."""
    running = start_server(redis_server[0], "attacks-2:", workers=2, max_body_read_s=BODY_READ_S)
    yield running
    running.stop()


def test_check_refuses_a_huge_previous_strategy_as_plans_does(two_workers: Server) -> None:
    """The checker places the previous strategy's pipelines rank by rank: a count of 10^7 is
    refused from the text, with the bounds POST /v1/plans applies, in well under a second."""
    client = two_workers.client()
    workers = two_workers.worker_pids()
    plan = small_plan(client)
    for strategy, named in (
        ("10000000x<1,1,1>", "10000000x<1,1,1>"),
        (" + ".join(["65536x<1,1,1>"] * 60), "3932160 GPUs"),
        ("9x<1,1,1>", "9 GPUs"),
    ):
        body = {"plan": {**plan, "previous_strategy": strategy}}
        response, elapsed_s = timed(client, "POST", "/v1/plans/check", json=body)
        assert_quick_problem(response, elapsed_s, 422, "plan.previous_strategy", named)
        refused, plans_s = timed(client, "POST", "/v1/plans", json=plan_body(previous_strategy=strategy))
        assert_quick_problem(refused, plans_s, 422, "previous_strategy")
    # the server's own limits on the cluster and the sequences apply to a checked plan too
    for edit, status, named in (
        ({"num_gpus": 32768}, 422, "plan.num_gpus 32768 exceeds this server's limit of 16384"),
        ({"input_lengths": [1] * 200_001}, 413, "200001 sequences exceed this server's limit of 200000"),
    ):
        response, elapsed_s = timed(client, "POST", "/v1/plans/check", json={"plan": {**plan, **edit}})
        assert_quick_problem(response, elapsed_s, status, named)
    assert two_workers.worker_pids() == workers


def stretched_plan(plan: dict, num_stages: int, num_micro_batches: int) -> dict:
    """The plan with its first pipeline given `num_stages` stages (its profile gets the scheme)
    and `num_micro_batches` copies of its first micro-batch: an invalid plan whose 1F1B schedule
    the checker still simulates in full (2 x stages x micro-batches operations)."""
    stretched = json.loads(json.dumps(plan))
    pipeline = stretched["pipelines"][0]
    pipeline["scheme"]["pp"] = num_stages
    pipeline["micro_batches"] = pipeline["micro_batches"][:1] * num_micro_batches
    profile = stretched["cost_profile"]
    profile["num_layers"] = 4096
    profile["schemes"].append({**profile["schemes"][0], "pp": num_stages})
    return stretched


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU time the processes have used so far."""
    ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return ticks / os.sysconf("SC_CLK_TCK")


def test_the_largest_checks_leave_health_fast_and_workers_alive(two_workers: Server) -> None:
    """Eight of the largest checks the server accepts at once: each costs a bounded CPU time,
    /healthz keeps answering within QUICK_S, no 5xx but 503, and no worker is killed (issue 29)."""
    from concurrent.futures import ThreadPoolExecutor

    client = two_workers.client()
    workers = two_workers.worker_pids()
    plan = small_plan(client)
    others = sum(2 * pipeline["scheme"]["pp"] * len(pipeline["micro_batches"]) for pipeline in plan["pipelines"][1:])
    num_micro_batches = (200_000 - others) // 2000  # 1000 stages: the default limit's largest check
    too_many = stretched_plan(plan, 1000, num_micro_batches + 1)
    response, elapsed_s = timed(client, "POST", "/v1/plans/check", json={"plan": too_many})
    operations = others + 2000 * (num_micro_batches + 1)
    assert_quick_problem(response, elapsed_s, 422, f"{operations} 1F1B operations", "limit of 200000")
    largest = {"plan": stretched_plan(plan, 1000, num_micro_batches)}
    started_cpu_s = cpu_seconds(workers)

    def check(_: int) -> int:
        with two_workers.client() as checker:
            return checker.post("/v1/plans/check", json=largest, timeout=120).status_code

    health_s = []
    with ThreadPoolExecutor(8) as pool:
        statuses = pool.map(check, range(8))
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            response, elapsed_s = timed(client, "GET", "/healthz")
            assert response.status_code == 200
            health_s.append(elapsed_s)
            time.sleep(0.05)
        statuses = list(statuses)
    assert set(statuses) <= {200, 503} and 200 in statuses, statuses
    assert max(health_s) < QUICK_S, f"/healthz took up to {max(health_s):.2f} s"
    used_cpu_s = cpu_seconds(workers) - started_cpu_s
    assert used_cpu_s < 3.0 * statuses.count(200) + 2, f"{used_cpu_s:.1f} s of CPU for {statuses.count(200)} checks"
    assert two_workers.worker_pids() == workers


def timed_job_body(time_limit_s: float) -> dict:
    """long_job_body's search, ended by its time limit: a plan job running `time_limit_s`."""
    body = long_job_body()
    body["request"]["options"]["time_limit_s"] = time_limit_s
    return body


def sweep_body(num_items: int, time_limit_s: float) -> dict:
    """A sweep of `num_items` plans that each search for `time_limit_s`."""
    options = {"time_limit_s": time_limit_s, "max_strategies_solved": 100000}
    return {"kind": "sweep", "base": plan_body(options=options), "vary": {"num_gpus": [8] * num_items}}


@pytest.mark.parametrize("pause_s", [3.0, 12.0])
def test_a_redis_pause_loses_no_job_and_no_plan(redis_server: tuple[str, subprocess.Popen], pause_s: float) -> None:
    """Redis stopped (SIGSTOP) for 3 s and for 12 s, longer than the 10 s leases, while a plan
    job and a sweep run on two workers: reads answer 200 or 503, never another 5xx; no job is ever
    seen failed; both end succeeded, the plan with its result, the sweep with every item; no
    worker is replaced (issue 29 item 3)."""
    redis_url, redis_process = redis_server
    server = start_server(redis_url, f"pause-{time.monotonic_ns()}:", workers=2, lease_ttl_s=10)
    try:
        client = server.client()
        workers = server.worker_pids()
        plan_job = client.post("/v1/jobs", json=timed_job_body(pause_s + 6)).json()
        sweep = client.post("/v1/jobs", json=sweep_body(6, (pause_s + 6) / 4)).json()
        job_ids = [plan_job["job_id"], sweep["job_id"]]
        wait_for(lambda: client.get(f"/v1/jobs/{job_ids[1]}").json()["progress"]["done"] >= 1, 60)
        seen: list[tuple[int, str | None]] = []

        def look() -> list[dict | None]:
            views = []
            for job_id in job_ids:
                response = client.get(f"/v1/jobs/{job_id}", timeout=10)
                view = response.json() if response.status_code == 200 else None
                seen.append((response.status_code, view and view["status"]))
                views.append(view)
            return views

        redis_process.send_signal(signal.SIGSTOP)
        try:
            resume_at = time.monotonic() + pause_s
            while time.monotonic() < resume_at:
                look()
                assert client.get("/healthz").status_code == 200
                time.sleep(0.2)
        finally:
            redis_process.send_signal(signal.SIGCONT)
        finished = wait_for(
            lambda: (
                (views := look())
                and all(view and view["status"] in ("succeeded", "failed") for view in views)
                and views
            ),
            timeout_s=90,
            interval_s=0.2,
        )
        assert {status for status, _ in seen} <= {200, 503}, sorted(set(seen))
        assert "failed" not in {job_status for _, job_status in seen}, seen
        plan_view, sweep_view = finished
        assert plan_view["status"] == "succeeded" and plan_view["result"]["plan_id"], plan_view["status"]
        assert sweep_view["status"] == "succeeded", sweep_view
        assert sweep_view["progress"] == {"done": 6, "total": 6}
        assert [item["index"] for item in sweep_view["items"]] == list(range(6))
        assert all(item["plan"] is not None for item in sweep_view["items"])
        assert server.worker_pids() == workers
    finally:
        server.stop()


def test_dataset_samples_are_admitted_and_capped(two_workers: Server) -> None:
    """Twelve hostile samples at once (64M one-token pieces: 128 MB of JSON each before issue 29)
    are refused before any draw; a draw that makes too many pieces is refused after it; the
    largest allowed samples get 200 or 503; memory stays flat and no worker is killed."""
    from concurrent.futures import ThreadPoolExecutor

    workers = two_workers.worker_pids()
    before = two_workers.rss_bytes()

    def sample(query: str) -> tuple[httpx.Response, float]:
        with two_workers.client() as sampler:
            return timed(sampler, "GET", f"/v1/datasets/wikipedia/sample?{query}")

    with ThreadPoolExecutor(12) as pool:
        hostile = list(pool.map(sample, ["num_tokens=64000000&context_cap=1"] * 12))
    for response, elapsed_s in hostile:
        assert_quick_problem(response, elapsed_s, 413, "num_tokens 64000000", "context_cap 1", "64000000 sequences")
    response, elapsed_s = sample("num_tokens=64000000&context_cap=320")  # >= 200,000 pieces: drawn, then refused
    assert_quick_problem(response, elapsed_s, 413, "context_cap 320 drew", "limit of 200000")
    with ThreadPoolExecutor(12) as pool:
        largest = list(pool.map(sample, ["num_tokens=64000000"] * 12))
    statuses = [response.status_code for response, _ in largest]
    assert set(statuses) <= {200, 503} and 200 in statuses, statuses
    for response, _ in largest:
        if response.status_code == 200:
            assert 0 < len(response.json()["lengths"]) <= 200_000
    growth = two_workers.rss_bytes() - before
    assert growth < 512 * 2**20, f"the server grew {growth / 2**20:.0f} MiB"
    assert two_workers.worker_pids() == workers


def hold_body(server: Server, declared_bytes: int) -> tuple[socket.socket, bytes]:
    """A POST /v1/plans whose headers declare `declared_bytes` and whose body never comes: the
    socket, and what the server answered within 2 s (nothing while it waits for the body)."""
    host, port = server.url.removeprefix("http://").split(":")
    connection = socket.create_connection((host, int(port)))
    head = (
        f"POST /v1/plans HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {declared_bytes}\r\n\r\n"
    )
    connection.sendall(head.encode())
    connection.settimeout(2)
    answer = b""
    try:
        while True:
            chunk = connection.recv(65536)
            answer += chunk
            head, _, body = answer.partition(b"\r\n\r\n")
            length = next((line for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")), None)
            if not chunk or (length is not None and len(body) >= int(length.split(b":")[1])):
                return connection, answer
    except TimeoutError:
        return connection, answer


def hold_one_each(server: Server, declared_bytes: int, fresh_s: float) -> list[socket.socket]:
    """Two held bodies (`hold_body`), one per worker, the first held no longer than `fresh_s` when the
    second is: the checks after them need both budgets taken, and a hold ends after BODY_READ_S. The
    kernel hands connections to either worker, unevenly (a CI run saw 40 in a row go to the worker
    already holding one, and the first hold ran out before the second came): a round whose first
    hold grew stale is dropped (its connection closed, which frees the budget) and tried again."""
    for _ in range(5):
        holders: list[socket.socket] = []
        first_held = None
        for _ in range(80):
            sent = time.monotonic()
            connection, answer = hold_body(server, declared_bytes)
            if answer:
                assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
                connection.close()
                # the worker that just answered is back waiting first and tends to take the next
                # connection too: let the other's 0.1 s tick bring it back to waiting after it
                time.sleep(0.25)
            else:
                holders.append(connection)
                first_held = sent if first_held is None else first_held
            if len(holders) == 2 or (first_held is not None and time.monotonic() - first_held > fresh_s):
                break
        if len(holders) == 2 and time.monotonic() - first_held <= fresh_s:
            return holders
        for connection in holders:
            connection.close()
        time.sleep(0.5)
    raise AssertionError(f"no round held one body on each worker within {fresh_s} s")


def test_bodies_in_flight_are_bounded_before_they_are_read(two_workers: Server) -> None:
    """Once each worker holds a body as large as its in-flight budget (by Content-Length, not a
    byte of it sent), every other body is refused with 503 and Retry-After without being read;
    /healthz stays quick; a body that never comes is refused with 408 after BODY_READ_S, and the
    budget is free again (issue 29 item 5)."""
    client = two_workers.client()
    workers = two_workers.worker_pids()
    budget = 16 * 2**20  # HYDRAPLAN_MAX_BODY_BYTES, the budget's default
    holders = []
    try:
        holders = hold_one_each(two_workers, budget, fresh_s=BODY_READ_S - HOLD_SLACK_S)
        for _ in range(6):
            connection, answer = hold_body(two_workers, 4096)
            connection.close()
            assert answer.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in answer.lower(), answer[:300]
            assert b"budget of 16777216 bytes" in answer, answer[-300:]
        response, elapsed_s = timed(client, "POST", "/v1/plans", json=plan_body())
        assert_quick_problem(response, elapsed_s, 503, "request bodies in flight")
        response, elapsed_s = timed(client, "GET", "/healthz")
        assert response.status_code == 200 and elapsed_s < QUICK_S
        for connection in holders:  # a body that never comes is given up after BODY_READ_S
            connection.settimeout(BODY_READ_S + 10)
            answer = connection.recv(65536)
            assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
        wait_for(lambda: client.post("/v1/plans", json=plan_body()).status_code == 200, timeout_s=10)
    finally:
        for connection in holders:
            connection.close()
    assert two_workers.worker_pids() == workers


def test_sixteen_junk_bodies_keep_health_quick_and_memory_bounded(two_workers: Server) -> None:
    """Sixteen 10 MB bodies of `{"lengths": [{}, {}, ...]}` at once (4.5 GB and a 15.7 s /healthz
    before issue 29): 422 or 503, never another status; three in four /healthz probes within
    QUICK_S x 2 and every one within QUICK_S x 8; the workers' memory peaks below 2 GiB more than
    before; no worker is killed."""
    from concurrent.futures import ThreadPoolExecutor

    junk = ('{"lengths":[' + ",".join(["{}"] * 3_300_000) + '],"num_gpus":8}').encode()
    workers = two_workers.worker_pids()
    before = two_workers.rss_bytes()
    peak = [before]
    health_s = []

    def post(_: int) -> int:
        with two_workers.client() as poster:
            headers = {"content-type": "application/json"}
            return poster.post("/v1/plans", content=junk, headers=headers, timeout=120).status_code

    with ThreadPoolExecutor(16) as pool:
        posted = [pool.submit(post, index) for index in range(16)]
        with two_workers.client() as prober:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not all(future.done() for future in posted):
                response, elapsed_s = timed(prober, "GET", "/healthz")
                assert response.status_code == 200
                health_s.append(elapsed_s)
                peak.append(two_workers.rss_bytes())
                time.sleep(0.05)
        statuses = [future.result() for future in posted]
    assert set(statuses) <= {422, 503} and 422 in statuses, statuses
    # most probes quick (a loop blocked by parsing makes most of them slow: 15.7 s before issue 29);
    # the slowest one only below a liveness limit: at load 15 on 2 cores one probe took 6.4 s
    ordered = sorted(health_s)
    assert ordered[(3 * len(ordered)) // 4] < 2 * QUICK_S, f"/healthz took {ordered} s"
    assert ordered[-1] < 8 * QUICK_S, f"/healthz took up to {ordered[-1]:.2f} s"
    growth = max(peak) - before
    assert growth < 2 * 2**30, f"the workers grew {growth / 2**20:.0f} MiB"
    assert two_workers.worker_pids() == workers


def test_smaller_things_behind_the_root_path(two_workers: Server, user_profile_data: dict) -> None:
    """Issue 29 item 7: Locations carry the root path; /docs and /redoc load their scripts from
    this server under a CSP; num_gpus and time_limit_s are not coerced from strings ('auto'
    stays); HEAD on a GET route answers like GET without a body."""
    client = two_workers.client()
    session = client.post("/v1/sessions", json=session_body())
    assert session.headers["location"] == f"{ROOT_PATH}/v1/sessions/{session.json()['session_id']}"
    job = client.post("/v1/jobs", json={"kind": "plan", "request": plan_body()})
    assert job.headers["location"] == job.json()["location"] == f"{ROOT_PATH}/v1/jobs/{job.json()['job_id']}"
    profile = client.post("/v1/profiles", json=user_profile_data)
    assert profile.headers["location"] == f"{ROOT_PATH}/v1/profiles/{profile.json()['profile_id']}"
    assert client.delete(proxied(session.headers["location"])).status_code == 204

    anonymous = two_workers.client(token=None)
    for page, assets in (("/docs", ["swagger-ui-bundle.js", "swagger-ui.css"]), ("/redoc", ["redoc.standalone.js"])):
        response = anonymous.get(page)
        assert response.status_code == 200 and "text/html" in response.headers["content-type"]
        assert "http" not in response.text, "a third-party URL in the page"
        policy = response.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy and "https:" not in policy
        for asset in assets:
            assert f'"{ROOT_PATH}/docs/assets/{asset}"' in response.text
            served = anonymous.get(f"/docs/assets/{asset}")
            assert served.status_code == 200 and len(served.content) > 100_000

    for field, body in (
        ("num_gpus", plan_body(num_gpus="8")),
        ("gpus_per_node", plan_body(gpus_per_node="8")),
        ("options.time_limit_s", plan_body(options={"time_limit_s": "0.2"})),
        ("num_gpus", plan_body(num_gpus=8.0)),
    ):
        response, elapsed_s = timed(client, "POST", "/v1/plans", json=body)
        assert_quick_problem(response, elapsed_s, 422, f"body.{field}")
    assert client.post("/v1/plans", json=plan_body(options={"time_limit_s": "auto"})).status_code == 200

    for path, http in (("/healthz", anonymous), ("/v1/models", client), (f"/v1/jobs/{job.json()['job_id']}", client)):
        got, head = http.get(path), http.head(path)
        assert head.status_code == got.status_code == 200, (path, head.status_code)
        assert head.content == b"" and head.headers["content-length"] == str(len(got.content))
    assert client.head("/v1/plans").status_code == 405
    assert anonymous.head("/v1/models").status_code == 401


def test_a_token_no_header_can_carry_is_refused_at_start_up() -> None:
    """A non-ASCII token could never authenticate: `hydraplan serve` refuses it, naming the
    variable and the character's position, never echoing the secret."""
    environment = {**os.environ, "HYDRAPLAN_API_TOKEN": "s3cret-tökén"}
    command = [sys.executable, "-m", "hydraplan.api.cli", "serve", "--port", "9"]
    finished = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120)
    assert finished.returncode != 0
    assert "HYDRAPLAN_API_TOKEN" in finished.stderr and "character 9" in finished.stderr, finished.stderr
    assert "s3cret" not in finished.stderr + finished.stdout


def test_finished_jobs_and_profiles_are_deleted_to_free_their_places(
    redis_server: tuple[str, subprocess.Popen], user_profile_data: dict
) -> None:
    """Full job and profile caps no longer block for a day or a week: DELETE removes a finished
    job with its results and an uploaded profile, and their places are free at once, on any
    worker (issue 29 item 6)."""
    server = start_server(redis_server[0], f"caps-{time.monotonic_ns()}:", workers=2, max_jobs=2, max_profiles=2)
    try:
        client = server.client()
        jobs = [client.post("/v1/jobs", json={"kind": "plan", "request": plan_body()}).json() for _ in range(2)]
        assert_quick_problem(client.post("/v1/jobs", json={"kind": "plan", "request": plan_body()}), 0, 507, "2 jobs")
        for job in jobs:
            wait_for(lambda job=job: finished_view(server, job["job_id"]), timeout_s=60)
            assert client.delete(proxied(job["location"])).status_code == 204
            assert client.get(proxied(job["location"])).status_code == 404
        assert client.post("/v1/jobs", json={"kind": "plan", "request": plan_body()}).status_code == 202
        locations = [
            client.post("/v1/profiles", json={**user_profile_data, "notes": f"profile {index}"}).headers["location"]
            for index in range(2)
        ]
        full = client.post("/v1/profiles", json={**user_profile_data, "notes": "one more"})
        assert_quick_problem(full, 0, 507, "2 uploaded profiles")
        assert client.delete(proxied(locations[0])).status_code == 204
        assert client.get(proxied(locations[0])).status_code == 404
        assert client.post("/v1/profiles", json={**user_profile_data, "notes": "one more"}).status_code == 201
    finally:
        server.stop()


def test_tenants_are_apart_across_workers(redis_server: tuple[str, subprocess.Popen], tmp_path: Any) -> None:
    """With a token file (digests only), a tenant can neither read nor cancel another tenant's job
    or session on any worker (profiles: tests/test_api_tenants.py); the admin sees them; the
    single token beside the file keeps working (issue 29 item 6)."""
    import hashlib

    tokens = {"alice": "alice-secret", "bob": "bob-secret", "ops": "ops-secret"}
    lines = [f"{name} sha256:{hashlib.sha256(token.encode()).hexdigest()}" for name, token in tokens.items()]
    path = tmp_path / "tokens"
    path.write_text("\n".join(lines[:2] + [lines[2] + " admin"]) + "\n", encoding="utf-8")
    server = start_server(redis_server[0], f"tenants-{time.monotonic_ns()}:", workers=2, api_tokens_file=str(path))
    try:
        alice, bob, ops = (server.client(token=tokens[name]) for name in ("alice", "bob", "ops"))
        job = alice.post("/v1/jobs", json=timed_job_body(30)).json()
        session = alice.post("/v1/sessions", json=session_body())
        paths = [proxied(job["location"]), proxied(session.headers["location"])]
        for _ in range(4):  # both workers answer
            for path in paths:
                assert_quick_problem(bob.get(path), 0, 404, "unknown")
                assert ops.get(path).status_code == 200
        assert_quick_problem(bob.delete(paths[0]), 0, 404, "unknown")
        assert alice.get(paths[0]).json()["cancel_requested"] is False
        assert server.client().get(paths[0]).status_code == 200  # the single token: admin `default`
        assert alice.delete(paths[0]).status_code == 202
        view = wait_for(lambda: finished_view(server, job["job_id"]), timeout_s=60)
        assert view["status"] == "cancelled" and view["owner"] == "alice"
    finally:
        server.stop()
