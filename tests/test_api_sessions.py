"""Planning sessions: create, plan step by step (one batch or k), read, expire, delete, 409."""

from __future__ import annotations

import threading
import time

import pytest
from api_support import TINY_LENGTHS, assert_problem, client_fixture, make_client, session_body  # noqa: F401

import hydraplan.api.service.planning
from hydraplan.planner.schemas import Plan

pytestmark = pytest.mark.service


def create_session(test_client, **overrides) -> str:
    response = test_client.post("/v1/sessions", json=session_body(**overrides))
    assert response.status_code == 201, response.text
    session_id = response.json()["session_id"]
    assert response.headers["location"] == f"/v1/sessions/{session_id}"
    return session_id


def test_session_plans_step_by_step(client) -> None:
    session_id = create_session(client)
    first = client.post(f"/v1/sessions/{session_id}/plans", json={"lengths": TINY_LENGTHS})
    assert first.status_code == 200, first.text
    plan = Plan.model_validate(first.json())
    assert plan.input_lengths == TINY_LENGTHS

    second = client.post(f"/v1/sessions/{session_id}/plans", json={"lengths": TINY_LENGTHS[:40]})
    assert second.status_code == 200, second.text

    view = client.get(f"/v1/sessions/{session_id}").json()
    assert view["num_plans"] == 2
    assert view["last_plan_id"] == second.json()["plan_id"]
    assert view["last_strategy"] == second.json()["strategy"]
    assert view["config"]["num_gpus"] == 8


def test_session_passes_the_previous_plan(client, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each solve after the first receives the strategy of the plan before it (strategy-switch
    context: the planner uses nothing else of the previous plan)."""
    seen: list[str | None] = []
    real_solve = hydraplan.api.service.planning.solve

    def recording_solve(request, profile, baselines=(), previous_plan=None, cancel=None):
        assert previous_plan is None
        seen.append(request.previous_strategy)
        return real_solve(request, profile, baselines=baselines, cancel=cancel)

    monkeypatch.setattr(hydraplan.api.service.planning, "solve", recording_solve)
    session_id = create_session(client)
    batches = [TINY_LENGTHS, TINY_LENGTHS[:30], TINY_LENGTHS[10:50]]
    response = client.post(f"/v1/sessions/{session_id}/plans", json={"batches": batches})
    assert response.status_code == 200, response.text
    plans = response.json()["plans"]
    assert [plan["input_lengths"] for plan in plans] == batches
    assert seen == [None, plans[0]["strategy"], plans[1]["strategy"]]
    view = client.get(f"/v1/sessions/{session_id}").json()
    assert (view["last_plan_id"], view["last_strategy"]) == (plans[2]["plan_id"], plans[2]["strategy"])

    client.post(f"/v1/sessions/{session_id}/plans", json={"lengths": TINY_LENGTHS[:20]})
    assert seen[-1] == plans[2]["strategy"]


def test_session_validates_its_configuration(client) -> None:
    assert_problem(client.post("/v1/sessions", json=session_body(model="gpt-9")), 404, "gpt-9")
    assert_problem(client.post("/v1/sessions", json=session_body(num_gpus=12)), 422, "gpus_per_node")
    problem = assert_problem(client.post("/v1/sessions", json={**session_body(), "lengths": [1]}), 422, "lengths")
    assert problem["errors"][0]["loc"] == ["body", "lengths"]


def test_session_plan_errors(client) -> None:
    session_id = create_session(client)
    url = f"/v1/sessions/{session_id}/plans"
    assert_problem(client.post(url, json={}), 422, "exactly one of lengths or batches")
    assert_problem(client.post(url, json={"lengths": [1], "batches": [[1]]}), 422, "exactly one")
    assert_problem(client.post(url, json={"batches": [TINY_LENGTHS, [2**30]]}), 422, "batches[1]")
    assert_problem(client.post("/v1/sessions/ses-missing/plans", json={"lengths": [5]}), 404, "ses-missing")
    with make_client(max_session_batches=2, max_sequences=100) as limited:
        limited_id = create_session(limited)
        limited_url = f"/v1/sessions/{limited_id}/plans"
        assert_problem(limited.post(limited_url, json={"batches": [[5]] * 3}), 422, "limit of 2")
        assert_problem(
            limited.post(limited_url, json={"batches": [TINY_LENGTHS, TINY_LENGTHS]}),
            413,
            "128 sequences",
        )
    view = client.get(f"/v1/sessions/{session_id}").json()
    assert view["num_plans"] == 0  # failed calls leave the session as it was


def test_session_expires_when_idle() -> None:
    with make_client(session_idle_timeout_s=0.3) as short:
        session_id = create_session(short)
        time.sleep(0.15)
        assert short.get(f"/v1/sessions/{session_id}").status_code == 200  # restarts the timer
        time.sleep(0.2)
        assert short.get(f"/v1/sessions/{session_id}").status_code == 200
        time.sleep(0.45)
        assert_problem(short.get(f"/v1/sessions/{session_id}"), 404, "unknown or expired")
        assert_problem(short.post(f"/v1/sessions/{session_id}/plans", json={"lengths": [5]}), 404)


def test_delete_session(client) -> None:
    session_id = create_session(client)
    assert client.delete(f"/v1/sessions/{session_id}").status_code == 204
    assert_problem(client.get(f"/v1/sessions/{session_id}"), 404)
    assert_problem(client.delete(f"/v1/sessions/{session_id}"), 404)


def test_concurrent_plan_on_one_session_is_409(client, monkeypatch: pytest.MonkeyPatch) -> None:
    started, release = threading.Event(), threading.Event()
    real_solve = hydraplan.api.service.planning.solve

    def slow_solve(request, profile, baselines=(), previous_plan=None, cancel=None):
        started.set()
        release.wait(10)
        return real_solve(request, profile, baselines=baselines, cancel=cancel)

    monkeypatch.setattr(hydraplan.api.service.planning, "solve", slow_solve)
    session_id = create_session(client)
    url = f"/v1/sessions/{session_id}/plans"
    results: list[int] = []
    first = threading.Thread(
        target=lambda: results.append(client.post(url, json={"lengths": TINY_LENGTHS}).status_code)
    )
    first.start()
    assert started.wait(10)
    assert_problem(client.post(url, json={"lengths": TINY_LENGTHS}), 409, "already planning")
    release.set()
    first.join(10)
    assert results == [200]
    monkeypatch.setattr(hydraplan.api.service.planning, "solve", real_solve)
    assert client.post(url, json={"lengths": TINY_LENGTHS}).status_code == 200  # lock released


def test_a_session_costs_the_strategy_switch(client) -> None:
    """No patching: through a session the second plan carries the first one's strategy as its
    previous strategy, and a strategy change is charged (switch cost > 0, objective = step +
    switch), as the checker recomputes it."""
    from hydraplan.planner.check import check_plan

    session_id = create_session(client, options={"time_limit_s": 0.3, "seed": 0})
    small = client.post(f"/v1/sessions/{session_id}/plans", json={"lengths": [300, 500]}).json()
    large = client.post(f"/v1/sessions/{session_id}/plans", json={"lengths": TINY_LENGTHS * 6}).json()
    first, second = Plan.model_validate(small), Plan.model_validate(large)
    assert second.previous_strategy == first.strategy
    assert check_plan(second) == []
    assert second.strategy != first.strategy  # two pipelines for two sequences, eight for 384
    assert first.switch_cost_s == 0.0 and second.switch_cost_s > 0
    assert second.objective_s == pytest.approx(second.step_time_s + second.switch_cost_s)
