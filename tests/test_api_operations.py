"""Operations: health, readiness, metrics, logs with request ids, auth, limits, load shedding,
settings from the environment, unexpected errors, the OpenAPI snapshot and the Dockerfile."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import threading
from pathlib import Path

import pytest
from api_support import (  # noqa: F401
    ROOT,
    assert_problem,
    client_fixture,
    dockerfile_instructions,
    make_client,
    plan_body,
    test_settings,
    wait_for,
)

import hydraplan.api.service.planning
from hydraplan.api.service.app import create_app
from hydraplan.api.service.observability import JsonFormatter
from hydraplan.api.service.settings import Settings

pytestmark = pytest.mark.service

SNAPSHOT = Path(__file__).parent / "snapshots" / "openapi.json"


# ---------------------------------------------------------------------------------------------
# Health, readiness, metrics, logs
# ---------------------------------------------------------------------------------------------


def test_health_and_readiness(client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz").json()
    assert ready == {"status": "ready", "store": "memory", "solves_running": 0, "solve_slots": 2}


def test_metrics_count_requests_and_plans(client) -> None:
    assert client.post("/v1/plans", json=plan_body()).status_code == 200
    client.get("/v1/jobs/job-nope")
    text = client.get("/metrics").text
    assert 'hydraplan_http_requests_total{method="POST",route="/v1/plans",status="200"} 1.0' in text
    assert 'hydraplan_http_requests_total{method="GET",route="/v1/jobs/{job_id}",status="404"} 1.0' in text
    assert "hydraplan_http_request_duration_seconds_bucket" in text
    assert re.search(r'hydraplan_plans_total\{status="\w+"\} 1\.0', text)
    assert 'hydraplan_solve_duration_seconds_count{origin="plans"} 1.0' in text
    assert "hydraplan_plan_gap_count 1.0" in text
    assert "hydraplan_http_requests_in_flight" in text


def test_metrics_are_per_app() -> None:
    with make_client() as first, make_client() as second:
        first.get("/healthz")
        assert 'route="/healthz"' in first.get("/metrics").text
        assert 'route="/healthz"' not in second.get("/metrics").text


def test_request_id_is_echoed_and_logged(client) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    access = logging.getLogger("hydraplan.access")
    access.addHandler(handler)
    previous_level = access.level
    access.setLevel(logging.INFO)
    try:
        given = client.get("/v1/models", headers={"X-Request-ID": "step-42"})
        generated = client.get("/v1/no-such-thing")
    finally:
        access.removeHandler(handler)
        access.setLevel(previous_level)
    assert given.headers["x-request-id"] == "step-42"
    request_id = generated.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{16}", request_id)
    assert generated.json()["request_id"] == request_id
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["request_id"] for line in lines] == ["step-42", request_id]
    first = lines[0]
    assert first["method"] == "GET" and first["path"] == "/v1/models" and first["status"] == 200
    assert first["route"] == "/v1/models" and first["duration_ms"] >= 0
    assert lines[1]["status"] == 404


def test_insane_request_id_is_replaced(client) -> None:
    response = client.get("/healthz", headers={"X-Request-ID": "x" * 500})
    assert response.headers["x-request-id"] != "x" * 500


# ---------------------------------------------------------------------------------------------
# Auth
# ---------------------------------------------------------------------------------------------


def test_bearer_token_guards_v1_only() -> None:
    with make_client(api_token="s3cret") as guarded:
        missing = guarded.get("/v1/models")
        assert_problem(missing, 401, "missing")
        assert missing.headers["www-authenticate"].startswith("Bearer")
        wrong = guarded.post("/v1/plans", json=plan_body(), headers={"Authorization": "Bearer nope"})
        assert_problem(wrong, 401, "invalid")
        assert 'error="invalid_token"' in wrong.headers["www-authenticate"]
        # Rejected before the body is even parsed: malformed JSON without a token is still 401.
        assert_problem(
            guarded.post("/v1/plans", content=b"{", headers={"content-type": "application/json"}),
            401,
        )
        ok = guarded.get("/v1/models", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        for open_path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
            assert guarded.get(open_path).status_code == 200, open_path
        metrics = guarded.get("/metrics").text
        assert 'route="/v1/models",status="401"' in metrics


# ---------------------------------------------------------------------------------------------
# Limits and load shedding
# ---------------------------------------------------------------------------------------------


def test_body_limit_by_content_length_and_by_stream() -> None:
    with make_client(max_body_bytes=4096) as limited:
        big = plan_body(lengths=[1000] * 2000)
        assert_problem(limited.post("/v1/plans", json=big), 413, "4096 bytes")

        def chunks():
            yield b'{"lengths": ['
            for _ in range(2000):
                yield b"1000,"
            yield b"1]}"

        streamed = limited.post("/v1/plans", content=chunks(), headers={"content-type": "application/json"})
        assert_problem(streamed, 413, "limit of 4096 bytes")
        assert limited.post("/v1/plans", json=plan_body()).status_code == 200


def test_saturated_solver_answers_503_with_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    started, release = threading.Event(), threading.Event()
    real_solve = hydraplan.api.service.planning.solve

    def blocking_solve(request, profile, baselines=(), previous_plan=None, cancel=None):
        started.set()
        release.wait(10)
        return real_solve(request, profile, baselines=baselines, cancel=cancel)

    monkeypatch.setattr(hydraplan.api.service.planning, "solve", blocking_solve)
    with make_client(max_concurrent_solves=1, max_queued_solves=0, retry_after_s=2) as busy:
        statuses: list[int] = []
        worker = threading.Thread(target=lambda: statuses.append(busy.post("/v1/plans", json=plan_body()).status_code))
        worker.start()
        assert started.wait(10)
        # every slot and queue place taken: not ready, so a balancer sends work elsewhere
        assert_problem(busy.get("/readyz"), 503, "1 solver slots")
        refused = busy.post("/v1/plans", json=plan_body())
        assert_problem(refused, 503, "retry in 2 s")
        assert refused.headers["retry-after"] == "2"
        assert busy.post("/v1/estimate", json=plan_body(baseline="megatron")).status_code == 503
        release.set()
        worker.join(10)
        assert statuses == [200]
        assert busy.post("/v1/plans", json=plan_body()).status_code == 200
        assert busy.get("/readyz").json()["solves_running"] == 0
        assert 'hydraplan_rejections_total{pool="solve"} 2.0' in busy.get("/metrics").text


def test_unexpected_error_is_a_problem_500(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_solve(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(hydraplan.api.service.planning, "solve", broken_solve)
    with make_client() as test_client:
        response = test_client.post("/v1/plans", json=plan_body(), headers={"X-Request-ID": "req-500"})
        problem = assert_problem(response, 500, "server log")
        assert problem["request_id"] == "req-500"
        assert "boom" not in response.text  # internals stay in the log


# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------


def test_settings_from_environment() -> None:
    settings = Settings.from_env(
        {
            "HYDRAPLAN_MAX_SEQUENCES": "1000",
            "HYDRAPLAN_API_TOKEN": "t",
            "HYDRAPLAN_SESSION_IDLE_TIMEOUT_S": "0.5",
            "HYDRAPLAN_REDIS_URL": "",
            "OTHER": "ignored",
        }
    )
    assert settings.max_sequences == 1000 and settings.api_token == "t"
    assert settings.session_idle_timeout_s == 0.5 and settings.redis_url is None
    with pytest.raises(ValueError, match="HYDRAPLAN_MAX_SEQUENCES='many'"):
        Settings.from_env({"HYDRAPLAN_MAX_SEQUENCES": "many"})


def test_create_app_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    monkeypatch.setenv("HYDRAPLAN_API_TOKEN", "from-env")
    with TestClient(create_app()) as env_client:
        assert env_client.get("/v1/gpus").status_code == 401
        assert env_client.get("/v1/gpus", headers={"Authorization": "Bearer from-env"}).status_code == 200


# ---------------------------------------------------------------------------------------------
# OpenAPI
# ---------------------------------------------------------------------------------------------


def current_openapi() -> dict:
    document = create_app(test_settings()).openapi()
    return json.loads(json.dumps({**document, "info": {**document["info"], "version": "<version>"}}))


def test_openapi_snapshot() -> None:
    """Interface changes are deliberate: regenerate with UPDATE_SNAPSHOTS=1 and review the diff."""
    document = current_openapi()
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    assert SNAPSHOT.exists(), "run UPDATE_SNAPSHOTS=1 pytest tests/test_api_operations.py"
    assert document == json.loads(SNAPSHOT.read_text(encoding="utf-8")), (
        "the OpenAPI schema changed; if deliberate, regenerate with UPDATE_SNAPSHOTS=1"
    )


def test_openapi_documents_errors_examples_and_security(client) -> None:
    document = client.get("/openapi.json").json()
    operations = {
        (method, path): operation
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
    }
    assert ("post", "/v1/plans") in operations and ("delete", "/v1/jobs/{job_id}") in operations
    for (method, path), operation in operations.items():
        responses = operation["responses"]
        assert "500" in responses
        assert operation.get("summary"), (method, path)
        if path.startswith("/v1"):
            assert {"401", "404", "422", "503"} <= set(responses), (method, path)
            assert operation["security"] == [{"bearerToken": []}]
            assert set(responses["422"]["content"]) == {"application/problem+json"}
        if method == "post":
            assert {"400", "413", "415"} <= set(responses)
    assert "HTTPValidationError" not in document["components"]["schemas"]
    plan_body_schema = document["components"]["schemas"]["PlanBody"]
    assert plan_body_schema["examples"][0]["model"] == "tiny"
    assert "description" in plan_body_schema["properties"]["lengths"]
    assert "SolverOptions" in document["components"]["schemas"]  # the planner's type, unchanged


# ---------------------------------------------------------------------------------------------
# Dockerfile
# ---------------------------------------------------------------------------------------------


def test_dockerfile_is_multi_stage_slim_non_root_with_healthcheck() -> None:
    instructions = dockerfile_instructions()
    stages = [rest for keyword, rest in instructions if keyword == "FROM"]
    assert len(stages) == 2 and all(stage.startswith("python:3.11-slim") for stage in stages)
    assert stages[0].endswith("AS builder")
    runs = " ".join(rest for keyword, rest in instructions if keyword == "RUN")
    # the image installs the wheel `python -m build` makes, as CI builds and checks it
    assert "python -m build --wheel --outdir /dist ." in runs
    assert 'pip wheel --wheel-dir /wheels "$(echo /dist/hydraplan-*.whl)[service]"' in runs
    assert 'pip install --no-cache-dir --no-index --find-links=/wheels "hydraplan[service]"' in runs
    assert "torch" not in runs
    users = [rest for keyword, rest in instructions if keyword == "USER"]
    assert users and users[-1] not in ("root", "0")
    healthcheck = next(rest for keyword, rest in instructions if keyword == "HEALTHCHECK")
    assert "/healthz" in healthcheck and "urllib.request" in healthcheck and "curl" not in healthcheck
    command = next(rest for keyword, rest in instructions if keyword == "CMD")
    assert json.loads(command) == ["hydraplan", "serve", "--host", "0.0.0.0", "--port", "8000"]


def test_app_survives_several_lifespans() -> None:
    """Entering and leaving the app's lifespan twice (ASGI test transports do) keeps it usable."""
    from fastapi.testclient import TestClient

    app = create_app(test_settings())
    for _ in range(2):
        with TestClient(app) as lifespan_client:
            assert lifespan_client.post("/v1/plans", json=plan_body()).status_code == 200
            job = lifespan_client.post("/v1/jobs", json={"kind": "plan", "request": plan_body()})
            assert job.status_code == 202


# ---------------------------------------------------------------------------------------------
# Documentation
# ---------------------------------------------------------------------------------------------

SERVICE_DOC = ROOT / "docs" / "service.md"


def test_service_doc_lists_every_setting() -> None:
    from hydraplan.api.service.settings import env_var

    text = SERVICE_DOC.read_text(encoding="utf-8")
    missing = [env_var(name) for name in Settings.model_fields if f"`{env_var(name)}`" not in text]
    assert missing == []
