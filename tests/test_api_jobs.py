"""Background jobs: plan and sweep jobs, polling, cancellation keeping the best result, errors."""

from __future__ import annotations

import threading

import pytest
from api_support import assert_problem, client_fixture, make_client, plan_body, reproducible_body, wait_for  # noqa: F401

import hydraplan.api.service.planning

pytestmark = pytest.mark.service

FINISHED = {"succeeded", "failed", "cancelled"}


def submit(test_client, body: dict) -> str:
    response = test_client.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    accepted = response.json()
    assert accepted["status"] == "queued"
    assert response.headers["location"] == accepted["location"] == f"/v1/jobs/{accepted['job_id']}"
    return accepted["job_id"]


def wait_finished(test_client, job_id: str) -> dict:
    def finished() -> dict | None:
        view = test_client.get(f"/v1/jobs/{job_id}").json()
        return view if view["status"] in FINISHED else None

    return wait_for(finished, timeout_s=20)


def test_plan_job(client) -> None:
    job_id = submit(client, {"kind": "plan", "request": reproducible_body()})
    view = wait_finished(client, job_id)
    assert view["status"] == "succeeded", view
    assert view["progress"] == {"done": 1, "total": 1}
    assert view["result"]["input_lengths"] == plan_body()["lengths"]
    assert view["started_at"] and view["finished_at"]
    direct = client.post("/v1/plans", json=reproducible_body()).json()
    assert view["result"] == direct  # the same plan, byte for byte, from either front door


def test_plan_job_allows_longer_budgets_than_sync(client) -> None:
    """options.time_limit_s above the synchronous limit is fine for a job."""
    body = plan_body(options={"time_limit_s": 6.0})
    assert client.post("/v1/plans", json=body).status_code == 422
    job_id = submit(client, {"kind": "plan", "request": body})
    assert client.get(f"/v1/jobs/{job_id}").status_code == 200


def test_sweep_job(client) -> None:
    body = {
        "kind": "sweep",
        "base": plan_body(),
        "vary": {"num_gpus": [8, 16], "gpu": ["h100-sxm-80gb", "a100-80gb"]},
    }
    view = wait_finished(client, submit(client, body))
    assert view["status"] == "succeeded", view
    assert view["progress"] == {"done": 4, "total": 4}
    items = view["items"]
    assert [(item["num_gpus"], item["gpu"]) for item in items] == [
        (8, "h100-sxm-80gb"),
        (8, "a100-80gb"),
        (16, "h100-sxm-80gb"),
        (16, "a100-80gb"),
    ]
    assert all(item["status"] == "succeeded" and item["plan"]["num_gpus"] == item["num_gpus"] for item in items)


def test_sweep_item_failure_is_recorded(client) -> None:
    """An unplannable item fails with its problem document; the others still run."""
    body = {
        "kind": "sweep",
        "base": plan_body(),
        "vary": {"model": ["tiny", "llama3-70b"], "num_gpus": [1]},
    }
    view = wait_finished(client, submit(client, body))
    assert view["status"] == "succeeded"
    ok, failed = view["items"]
    assert ok["status"] == "succeeded"
    assert failed["status"] == "failed" and failed["plan"] is None
    assert failed["error"]["status"] == 422 and "does not fit" in failed["error"]["detail"]


def test_job_validation_happens_at_submit(client) -> None:
    assert_problem(client.post("/v1/jobs", json={"kind": "dance"}), 422)
    assert_problem(
        client.post("/v1/jobs", json={"kind": "plan", "request": plan_body(model="gpt-9")}),
        404,
        "gpt-9",
    )
    no_vary = {"kind": "sweep", "base": plan_body(), "vary": {}}
    assert_problem(client.post("/v1/jobs", json=no_vary), 422, "at least one of")
    profile_base = plan_body(profile_id="prof-x")
    del profile_base["model"], profile_base["gpu"]
    bad_axis = {"kind": "sweep", "base": profile_base, "vary": {"gpu": ["a100-80gb"]}}
    assert_problem(client.post("/v1/jobs", json=bad_axis), 422, "vary.model and vary.gpu")
    with make_client(max_sweep_items=3) as limited:
        big = {"kind": "sweep", "base": plan_body(), "vary": {"num_gpus": [1, 2, 4, 8]}}
        assert_problem(limited.post("/v1/jobs", json=big), 422, "4 items", "limit of 3")


def test_unknown_job(client) -> None:
    assert_problem(client.get("/v1/jobs/job-nope"), 404, "job-nope")
    assert_problem(client.delete("/v1/jobs/job-nope"), 404, "job-nope")


def test_cancel_running_plan_keeps_best_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """DELETE makes the solve's cancel() true; the job ends cancelled with the incumbent."""
    started = threading.Event()
    real_solve = hydraplan.api.service.planning.solve

    def anytime_solve(request, profile, baselines=(), previous_plan=None, cancel=None):
        started.set()
        wait_for(lambda: cancel is not None and cancel(), timeout_s=10)
        return real_solve(request, profile, baselines=baselines)

    monkeypatch.setattr(hydraplan.api.service.planning, "solve", anytime_solve)
    with make_client() as test_client:
        job_id = submit(test_client, {"kind": "plan", "request": plan_body()})
        assert started.wait(10)
        assert test_client.get(f"/v1/jobs/{job_id}").json()["status"] == "running"
        cancelled = test_client.delete(f"/v1/jobs/{job_id}")
        assert cancelled.status_code == 202 and cancelled.json()["cancel_requested"] is True
        view = wait_finished(test_client, job_id)
        assert view["status"] == "cancelled"
        assert view["result"] is not None and view["result"]["input_lengths"] == plan_body()["lengths"]
        assert test_client.delete(f"/v1/jobs/{job_id}").status_code == 204  # finished: deleted
        assert_problem(test_client.get(f"/v1/jobs/{job_id}"), 404, job_id)
        assert_problem(test_client.delete(f"/v1/jobs/{job_id}"), 404, job_id)


def test_cancel_sweep_stops_after_current_item(monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    calls: list[int] = []
    real_solve = hydraplan.api.service.planning.solve

    def gated_solve(request, profile, baselines=(), previous_plan=None, cancel=None):
        calls.append(request.num_gpus)
        gate.wait(10)
        return real_solve(request, profile, baselines=baselines)

    monkeypatch.setattr(hydraplan.api.service.planning, "solve", gated_solve)
    with make_client() as test_client:
        body = {"kind": "sweep", "base": plan_body(), "vary": {"num_gpus": [8, 16, 32]}}
        job_id = submit(test_client, body)
        wait_for(lambda: calls)
        assert test_client.delete(f"/v1/jobs/{job_id}").status_code == 202
        gate.set()
        view = wait_finished(test_client, job_id)
        assert view["status"] == "cancelled"
        assert [item["num_gpus"] for item in view["items"]] == [8]
        assert view["items"][0]["status"] == "succeeded"
        assert calls == [8]


def test_queued_job_cancelled_before_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """With one worker busy, a second job waits queued; cancelling it means it never runs."""
    gate = threading.Event()
    real_solve = hydraplan.api.service.planning.solve

    def gated_solve(request, profile, baselines=(), previous_plan=None, cancel=None):
        gate.wait(10)
        return real_solve(request, profile, baselines=baselines)

    monkeypatch.setattr(hydraplan.api.service.planning, "solve", gated_solve)
    with make_client(job_workers=1) as test_client:
        first = submit(test_client, {"kind": "plan", "request": plan_body()})
        second = submit(test_client, {"kind": "plan", "request": plan_body()})
        assert test_client.get(f"/v1/jobs/{second}").json()["status"] == "queued"
        assert test_client.delete(f"/v1/jobs/{second}").status_code == 202
        gate.set()
        assert wait_finished(test_client, first)["status"] == "succeeded"
        view = wait_finished(test_client, second)
        assert view["status"] == "cancelled" and view["result"] is None and view["started_at"] is None


def test_too_many_pending_jobs_is_503(monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    real_solve = hydraplan.api.service.planning.solve

    def gated_solve(request, profile, baselines=(), previous_plan=None, cancel=None):
        gate.wait(10)
        return real_solve(request, profile, baselines=baselines)

    monkeypatch.setattr(hydraplan.api.service.planning, "solve", gated_solve)
    with make_client(job_workers=1, max_pending_jobs=2, retry_after_s=3) as test_client:
        jobs = [submit(test_client, {"kind": "plan", "request": plan_body()}) for _ in range(2)]
        refused = test_client.post("/v1/jobs", json={"kind": "plan", "request": plan_body()})
        problem = assert_problem(refused, 503, "retry in 3 s")
        assert refused.headers["retry-after"] == "3"
        assert problem["type"].endswith("saturated")
        gate.set()
        for job_id in jobs:
            assert wait_finished(test_client, job_id)["status"] == "succeeded"
        assert test_client.post("/v1/jobs", json={"kind": "plan", "request": plan_body()}).status_code == 202


def test_a_job_the_store_refuses_is_not_left_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    """A store outage while a job is accepted answers 503 and leaves nothing pending behind."""
    from hydraplan.api.service.store import MemoryStore, StoreUnavailable

    with make_client(max_pending_jobs=1) as client:
        real_set = MemoryStore.set

        def failing_set(self, key, value, ttl_s=None, *, only_if_absent=False):
            if key.startswith("job:"):
                raise StoreUnavailable("store down for the test")
            return real_set(self, key, value, ttl_s, only_if_absent=only_if_absent)

        monkeypatch.setattr(MemoryStore, "set", failing_set)
        assert_problem(client.post("/v1/jobs", json={"kind": "plan", "request": plan_body()}), 503, "store down")
        monkeypatch.setattr(MemoryStore, "set", real_set)
        accepted = client.post("/v1/jobs", json={"kind": "plan", "request": plan_body()})
        assert accepted.status_code == 202, accepted.text  # the refused job took no pending place
