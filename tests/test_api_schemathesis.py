"""Schemathesis against the app's own OpenAPI document: generated requests (a few per operation)
must never get a server error other than a deliberate 503, and every response must conform to the
schema (status code documented, content type, body schema, headers)."""

from __future__ import annotations

import os

import pytest

schemathesis = pytest.importorskip("schemathesis")

from api_support import make_client, test_settings  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from hydraplan.api.service.app import create_app  # noqa: E402

pytestmark = [pytest.mark.service, pytest.mark.slow]

# Small clusters and budgets keep generated requests quick; random lengths far beyond the tiny
# model's capacities are refused by the planner (422), not solved.
APP = create_app(
    test_settings(
        max_sync_time_limit_s=0.3,
        max_num_gpus=16,
        max_sequences=2000,
        max_pending_jobs=2,
        max_sweep_items=2,
    )
)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
# By default: the schema's own examples plus a bounded fuzzing run (5 cases per operation); the
# coverage phase's boundary-value cases are not bounded by max_examples and take minutes. A deeper
# run: SCHEMATHESIS_EXAMPLES=200 SCHEMATHESIS_COVERAGE=1 pytest tests/test_api_schemathesis.py
MAX_EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "5"))
PHASES = ["examples", "fuzzing"] + (["coverage"] if os.environ.get("SCHEMATHESIS_COVERAGE") else [])
schema.config.phases.update(phases=PHASES)


@pytest.fixture(scope="module", autouse=True)
def stop_background_jobs():
    """Generated jobs may ask for long budgets: stop them when the module is done."""
    yield
    APP.state.services.close()


def no_server_error_but_503(ctx, response, case) -> None:
    """5xx only as deliberate load shedding (503 with Retry-After or store down)."""
    status = response.status_code
    assert status < 500 or status == 503, f"{case.method} {case.path} answered {status}"


CHECKS = [
    no_server_error_but_503,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_api_conforms_to_its_schema(case) -> None:
    case.call_and_validate(checks=CHECKS)


def test_schema_is_served_by_a_fresh_app() -> None:
    with make_client() as client:
        assert client.get("/openapi.json").json()["openapi"].startswith("3.")
