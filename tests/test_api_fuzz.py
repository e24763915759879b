"""Hypothesis fuzz of the request bodies: a valid body of each kind with one value replaced by
something hostile (huge or negative numbers, Infinity, NaN, 1e308, booleans, strings, nulls,
long lists, nested objects) answers 2xx or 4xx, never 5xx other than deliberate load shedding,
and answers quickly."""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest
from api_support import TINY_LENGTHS, make_client, plan_body, session_body
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.service, pytest.mark.slow]
DEADLINE_S = 3.0  # a 0.3 s solve plus parsing, on a loaded 2-core machine

SCALARS = st.one_of(
    st.integers(min_value=1, max_value=64),  # plausible values reach the planner too
    st.floats(min_value=0, max_value=10),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 10**12, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, float("inf"), float("-inf"), float("nan"), 5e-324, -0.0]),
    st.booleans(),
    st.none(),
    st.text(max_size=40),
    st.sampled_from(["", "x" * 5000, "10000000x<1,1,1>", "1x<8,1,1>", "<1,1,1>", "\u0000", "1e9"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=8,
)


def bodies(client: Any) -> dict[str, dict[str, Any]]:
    """A valid body for each POST endpoint, made once."""
    plan = client.post("/v1/plans", json=plan_body()).json()
    return {
        "/v1/plans": plan_body(previous_strategy="8x<1,1,1>", baselines=["megatron"]),
        "/v1/estimate": {**plan_body(), "strategy": [{"tp": 1, "pp": 1, "cp": 1, "num_pipelines": 8}]},
        "/v1/sessions": session_body(),
        "/v1/plans/check": {"plan": plan, "lengths": list(TINY_LENGTHS), "num_gpus": 8},
        "/v1/jobs": {"kind": "sweep", "base": plan_body(), "vary": {"num_gpus": [8]}},
        "/v1/profiles": plan["cost_profile"],
    }


def paths_of(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside `value` (dict keys and list indices), the root excluded."""
    found = []
    if isinstance(value, dict):
        for key, child in value.items():
            found.append((*prefix, key))
            found.extend(paths_of(child, (*prefix, key)))
    elif isinstance(value, list):
        for index, child in enumerate(value[:3]):
            found.append((*prefix, index))
            found.extend(paths_of(child, (*prefix, index)))
    return found


def replaced(body: Any, path: tuple, value: Any) -> Any:
    mutated = copy.deepcopy(body)
    target = mutated
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return mutated


@pytest.fixture(scope="module")
def fuzz_client():
    with make_client(max_sync_time_limit_s=0.3, max_num_gpus=16, max_sweep_items=2, max_pending_jobs=2) as client:
        yield client, bodies(client)


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_hostile_values_never_break_the_service(fuzz_client, data) -> None:
    client, valid = fuzz_client
    endpoint = data.draw(st.sampled_from(sorted(valid)), label="endpoint")
    body = valid[endpoint]
    path = data.draw(st.sampled_from(paths_of(body)), label="path")
    value = data.draw(VALUES, label="value")
    text = json.dumps(replaced(body, path, value))  # writes NaN / Infinity literals as Python does
    started = time.perf_counter()
    response = client.post(endpoint, content=text, headers={"content-type": "application/json"})
    elapsed_s = time.perf_counter() - started
    assert response.status_code < 500 or response.status_code == 503, (endpoint, path, value, response.text[:300])
    assert elapsed_s < DEADLINE_S, (endpoint, path, value, elapsed_s)
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith("application/problem+json")
