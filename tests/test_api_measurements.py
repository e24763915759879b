"""A session's closed loop over the API (issue 31): POST /v1/sessions/{id}/measurements refits the
session's profile into versions that plans name; measured peaks lower capacities at once; error
jumps are reported in the session, the next plan and the metrics; bad bodies change nothing."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from api_support import (  # noqa: F401
    TINY_LENGTHS,
    assert_problem,
    client_fixture,
    make_client,
    plan_body,
    redis_url_fixture,
    session_body,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hydraplan.api.service.loop_schemas import MAX_MEASURED_PIPELINES
from hydraplan.planner.schemas import Plan

pytestmark = pytest.mark.service


def open_session(client, **overrides: Any) -> str:
    response = client.post("/v1/sessions", json=session_body(**overrides))
    assert response.status_code == 201, response.text
    return response.json()["session_id"]


def plan_in(client, session_id: str, lengths: list[int] = TINY_LENGTHS, **headers: str) -> Plan:
    response = client.post(f"/v1/sessions/{session_id}/plans", json={"lengths": lengths}, headers=headers)
    assert response.status_code == 200, response.text
    return Plan.model_validate(response.json())


def measurements_of(plan: Plan, *, slow: float = 1.0, peak_bytes: float | None = None) -> dict[str, Any]:
    """A body measuring `plan`'s micro-batches as its own profile predicts them, times `slow`."""
    unit = plan.cost_profile.seconds_per_unit
    entries = {entry.key: entry for entry in plan.cost_profile.schemes}
    pipelines = []
    for pipeline in plan.pipelines:
        scheme = pipeline.scheme
        entry = entries[(scheme.tp, scheme.pp, scheme.cp)]
        micro_batches = []
        for micro_batch in pipeline.micro_batches:
            s1, s2 = sum(micro_batch.lengths), sum(length * length for length in micro_batch.lengths)
            time_s = (entry.a * s2 + entry.b * s1 + entry.c) * unit * slow
            micro_batches.append({"num_tokens": s1, "sum_sq_tokens": s2, "time_s": time_s, "fwd_s": time_s / 3})
        measured: dict[str, Any] = {"scheme": scheme.model_dump(), "micro_batches": micro_batches}
        if peak_bytes is not None:
            measured["peak_memory_bytes"] = [peak_bytes] * len(pipeline.ranks)
        pipelines.append(measured)
    assert plan.session_feedback is not None
    return {"profile_version": plan.session_feedback.profile_version, "pipelines": pipelines}


def post(client, session_id: str, body: Any, **headers: str):
    return client.post(f"/v1/sessions/{session_id}/measurements", json=body, headers=headers)


def test_measurements_advance_the_profile_version_the_next_plan_names(client) -> None:
    session_id = open_session(client)
    first = plan_in(client, session_id)
    assert first.session_feedback is not None and first.session_feedback.profile_version == 0
    response = post(client, session_id, measurements_of(first, slow=1.5))
    assert response.status_code == 200, response.text
    fit = response.json()
    assert fit["version"] == 1 and fit["num_steps"] == 1
    assert fit["errors"][0]["profile_version"] == 0
    assert fit["errors"][0]["median_error"] == pytest.approx(1 / 3, rel=1e-6)  # |1 - 1.5| / 1.5
    (refit,) = fit["schemes"]
    assert refit["b"] > refit["prior_b"]  # slower than the profile: the fit went up, by at most 20%
    assert refit["b"] <= refit["prior_b"] * 1.2 * (1 + 1e-9)
    # every term of every scheme looks 1.5x slow: the shared scales go up, by at most 20% a step
    assert all(1.0 < fit["shared_scales"][term] <= 1.2 * (1 + 1e-9) for term in "abc")
    assert client.get(f"/v1/sessions/{session_id}").json()["fit"] == fit

    second = plan_in(client, session_id)
    assert second.session_feedback.profile_version == 1
    assert second.cost_profile.notes.endswith("refitted online (cost_models.online_fit), version 1")
    entries = {f"<{entry.tp},{entry.pp},{entry.cp}>": entry for entry in second.cost_profile.schemes}
    if refit["scheme"] in entries:  # the slower scheme may lose its place to another: then it is absent
        assert entries[refit["scheme"]].b * second.cost_profile.seconds_per_unit == pytest.approx(refit["b"])
    # the plan made with version 1 is scored against version 1 (its own cost profile, 1.5x off again),
    # not against version 0 (the original profile)
    post(client, session_id, measurements_of(second, slow=1.5))
    errors = client.get(f"/v1/sessions/{session_id}").json()["fit"]["errors"]
    assert [error["profile_version"] for error in errors] == [0, 1]
    assert errors[1]["median_error"] == pytest.approx(1 / 3, rel=1e-6)


def test_plans_outside_a_session_keep_their_ids(client) -> None:
    """`session_feedback` is left out of plan_id when unset: /v1/plans ids are as before it existed."""
    from api_support import reproducible_body

    plan = Plan.model_validate(client.post("/v1/plans", json=reproducible_body()).json())
    assert plan.session_feedback is None
    content = plan.model_dump(mode="json", exclude={"plan_id", "session_feedback"})
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=False)
    assert plan.plan_id == "hp-" + hashlib.sha256(canonical.encode()).hexdigest()[:20]


def test_a_measured_peak_lowers_the_capacity_at_once_and_the_next_plan_says_so(client) -> None:
    session_id = open_session(client)
    first = plan_in(client, session_id)
    profile = first.cost_profile
    usable = profile.gpu_memory_bytes - profile.memory_reserve_bytes
    response = post(client, session_id, measurements_of(first, peak_bytes=0.98 * usable))
    assert response.status_code == 200, response.text
    (change,) = response.json()["capacity_changes"]
    # near device memory (at least the cut to 90% of the usable memory), and far above the tiny model's
    # predicted peak: the lower of the two capacities wins
    assert change["to_tokens"] <= int(change["from_tokens"] * 0.90 / 0.98)
    assert change["reason"] == "above-predicted-peak" and change["measured_peak_bytes"] == 0.98 * usable
    # the memory model is corrected by the measurement, and the fit shows it (cost_models.online_fit)
    (refit,) = client.get(f"/v1/sessions/{session_id}").json()["fit"]["schemes"]
    assert refit["scheme"] == change["scheme"] and refit["capacity_tokens"] == change["to_tokens"]
    assert refit["activation_scale"] > 1.0 or refit["extra_static_bytes"] > 0.0

    second = plan_in(client, session_id)
    assert [c.model_dump() for c in second.session_feedback.capacity_changes] == [change]
    lowered = {entry.key: entry for entry in second.cost_profile.schemes}
    scheme = first.pipelines[0].scheme
    if (scheme.tp, scheme.pp, scheme.cp) in lowered:
        assert lowered[(scheme.tp, scheme.pp, scheme.cp)].capacity_tokens == change["to_tokens"]
    for pipeline in second.pipelines:
        if (pipeline.scheme.tp, pipeline.scheme.pp, pipeline.scheme.cp) == (scheme.tp, scheme.pp, scheme.cp):
            assert all(sum(mb.lengths) <= change["to_tokens"] for mb in pipeline.micro_batches)
    third = plan_in(client, session_id)
    assert third.session_feedback.capacity_changes == []  # said once, by the plan that first obeyed it
    assert 'hydraplan_session_capacity_lowered_total{reason="above-predicted-peak"} 1.0' in client.get("/metrics").text


def test_an_error_jump_is_reported_in_the_session_the_next_plan_and_the_metrics(client) -> None:
    session_id = open_session(client)
    plan = plan_in(client, session_id)
    for _ in range(4):
        assert post(client, session_id, measurements_of(plan, slow=1.01)).status_code == 200
        plan = plan_in(client, session_id)
    assert plan.session_feedback.error_jumps == []
    assert post(client, session_id, measurements_of(plan, slow=3.0)).status_code == 200
    fit = client.get(f"/v1/sessions/{session_id}").json()["fit"]
    jump = fit["last_error_jump"]
    assert jump is not None and jump["step"] == 5 and jump["median_error"] > 0.5
    assert [event.model_dump() for event in plan_in(client, session_id).session_feedback.error_jumps] == [jump]
    metrics = client.get("/metrics").text
    assert "hydraplan_session_error_jumps_total 1.0" in metrics
    assert "hydraplan_session_fit_error_count 5.0" in metrics


def test_a_slow_rank_is_estimated_shown_and_its_pipelines_get_less_work(client) -> None:
    """Rank 3's pipeline measured 3x its prediction three steps in a row: the session holds rank 3
    slow (its fit, a metric), and its next plan names the factor and gives that pipeline less work."""
    session_id = open_session(client, options={"time_limit_s": 0.3, "seed": 0, "strategy_pool": ["8x<1,1,1>"]})
    plan = plan_in(client, session_id)
    before = next(pipeline.num_tokens for pipeline in plan.pipelines if 3 in pipeline.ranks)
    for _ in range(3):
        body = measurements_of(plan)
        for measured, pipeline in zip(body["pipelines"], plan.pipelines):
            slow = 3.0 if 3 in pipeline.ranks else 1.0
            measured["ranks"] = list(pipeline.ranks)
            measured["predicted_s"] = sum(mb["time_s"] for mb in measured["micro_batches"]) * (pipeline.slowdown or 1.0)
            for micro_batch in measured["micro_batches"]:  # the profile's time, on rank 3 three times it
                micro_batch["time_s"] *= slow
                micro_batch["fwd_s"] *= slow
            if pipeline.slowdown is not None:
                measured["slowdown"] = pipeline.slowdown
        response = post(client, session_id, body)
        assert response.status_code == 200, response.text
        plan = plan_in(client, session_id)
    fit = client.get(f"/v1/sessions/{session_id}").json()["fit"]
    assert fit["rank_slowdowns"] == {"3": pytest.approx(3.0)}
    assert plan.rank_slowdowns == {3: pytest.approx(3.0)}
    slowed = next(pipeline for pipeline in plan.pipelines if 3 in pipeline.ranks)
    assert slowed.slowdown == pytest.approx(3.0) and slowed.num_tokens < before
    assert "hydraplan_session_slow_ranks_total 1.0" in client.get("/metrics").text


def test_plan_bodies_with_bad_slowdowns_are_refused_naming_the_value(client) -> None:
    for slowdowns, named in (({"8": 2.0}, "rank 8"), ({"1": 0.5}, "factor 0.5"), ({"x": 2.0}, "x")):
        response = client.post("/v1/plans", json=plan_body(rank_slowdowns=slowdowns))
        assert_problem(response, 422, named)
    bad_body = {**_body(**_good_micro_batch()), "profile_version": 0}
    bad_body["pipelines"][0]["ranks"] = [0, 1]  # a <1,1,1> pipeline has one rank
    session_id = open_session(client)
    assert_problem(post(client, session_id, bad_body), 422, "ranks")


def _good_micro_batch() -> dict[str, Any]:
    return {"num_tokens": 100, "sum_sq_tokens": 5000, "time_s": 0.01}


def _body(**micro_batch: Any) -> dict[str, Any]:
    return {"pipelines": [{"scheme": {"tp": 1, "pp": 1, "cp": 1}, "micro_batches": [micro_batch]}]}


BAD_BODIES = {
    "time as a string": (
        _body(**{**_good_micro_batch(), "time_s": "0.01"}),
        ["pipelines", 0, "micro_batches", 0, "time_s"],
    ),
    "time zero": (_body(**{**_good_micro_batch(), "time_s": 0}), ["pipelines", 0, "micro_batches", 0, "time_s"]),
    "negative time": (_body(**{**_good_micro_batch(), "time_s": -1.0}), ["pipelines", 0, "micro_batches", 0, "time_s"]),
    "time too long": (_body(**{**_good_micro_batch(), "time_s": 1e7}), ["pipelines", 0, "micro_batches", 0, "time_s"]),
    "tokens as a float": (
        _body(**{**_good_micro_batch(), "num_tokens": 100.0}),
        ["pipelines", 0, "micro_batches", 0, "num_tokens"],
    ),
    "tokens as a bool": (
        _body(**{**_good_micro_batch(), "num_tokens": True}),
        ["pipelines", 0, "micro_batches", 0, "num_tokens"],
    ),
    "impossible squares": (_body(**{**_good_micro_batch(), "sum_sq_tokens": 99}), ["pipelines", 0, "micro_batches", 0]),
    "forward over total": (_body(**{**_good_micro_batch(), "fwd_s": 0.02}), ["pipelines", 0, "micro_batches", 0]),
    "unknown field": (
        _body(**{**_good_micro_batch(), "lengths": [100]}),
        ["pipelines", 0, "micro_batches", 0, "lengths"],
    ),
    "no pipeline": ({"pipelines": []}, ["pipelines"]),
    "too many pipelines": (
        {"pipelines": [_body(**_good_micro_batch())["pipelines"][0]] * (MAX_MEASURED_PIPELINES + 1)},
        ["pipelines"],
    ),
    "more peaks than ranks": (
        {"pipelines": [{"scheme": {"tp": 1, "pp": 1, "cp": 1}, "peak_memory_bytes": [1e9, 1e9]}]},
        ["pipelines", 0],
    ),
    "infinite peak": (
        {"pipelines": [{"scheme": {"tp": 1, "pp": 1, "cp": 1}, "peak_memory_bytes": [1e300]}]},
        ["pipelines", 0, "peak_memory_bytes", 0],
    ),
    "nothing measured": ({"pipelines": [{"scheme": {"tp": 1, "pp": 1, "cp": 1}}]}, ["pipelines", 0]),
    "version as a string": ({**_body(**_good_micro_batch()), "profile_version": "0"}, ["profile_version"]),
}


def test_bad_bodies_are_refused_naming_the_value_and_nothing_is_stored(client) -> None:
    session_id = open_session(client)
    for name, (body, where) in BAD_BODIES.items():
        problem = assert_problem(post(client, session_id, body), 422)
        locations = [error["loc"] for error in problem["errors"]]
        assert any(location[: len(where) + 1] == ["body", *where] for location in locations), (name, locations)
    # valid JSON numbers the planner cannot use: an unknown scheme, a version the session never made
    problem = assert_problem(
        post(client, session_id, {"pipelines": [{"scheme": {"tp": 8, "pp": 8, "cp": 8}, "peak_memory_bytes": [1.0]}]}),
        422,
        "<8,8,8>",
    )
    assert problem["errors"][0]["loc"] == ["body", "pipelines", 0, "scheme"]
    assert_problem(post(client, session_id, {**_body(**_good_micro_batch()), "profile_version": 3}), 422, "newer")
    nan = '{"pipelines": [{"scheme": {"tp": 1, "pp": 1, "cp": 1}, "peak_memory_bytes": [NaN]}]}'
    response = client.post(
        f"/v1/sessions/{session_id}/measurements", content=nan, headers={"content-type": "application/json"}
    )
    assert response.status_code in (400, 422), response.text
    fit = client.get(f"/v1/sessions/{session_id}").json()["fit"]
    assert fit["version"] == 0 and fit["num_steps"] == 0 and fit["errors"] == []
    assert plan_in(client, session_id).session_feedback.profile_version == 0


def test_measurements_follow_the_session_owner_rules(tmp_path: Path) -> None:
    tokens = {"alice": "alice-token", "bob": "bob-token"}
    lines = [f"{name} sha256:{hashlib.sha256(token.encode()).hexdigest()}" for name, token in tokens.items()]
    (tmp_path / "tokens").write_text("\n".join(lines) + "\n", encoding="utf-8")
    alice, bob = ({"Authorization": f"Bearer {tokens[name]}"} for name in ("alice", "bob"))
    with make_client(api_tokens_file=str(tmp_path / "tokens")) as client:
        session_id = client.post("/v1/sessions", json=session_body(), headers=alice).json()["session_id"]
        plan = plan_in(client, session_id, **alice)
        body = measurements_of(plan)
        assert_problem(post(client, session_id, body), 401)
        assert_problem(post(client, session_id, body, **bob), 404, "unknown")
        assert client.get(f"/v1/sessions/{session_id}", headers=alice).json()["fit"]["version"] == 0
        assert post(client, session_id, body, **alice).status_code == 200
        assert_problem(post(client, "ses-nope", body, **alice), 404, "unknown")
        assert client.delete(f"/v1/sessions/{session_id}", headers=alice).status_code == 204
        assert_problem(post(client, session_id, body, **alice), 404, "unknown")


def test_the_client_posts_measurements(client) -> None:
    """`Session.post_measurements` (and `measured_micro_batch`), over the in-process app."""
    import hydraplan
    from hydraplan.api.client import measured_micro_batch

    service = hydraplan.Client(http=client)
    session = service.open_session(**session_body())
    plan = session.plan(TINY_LENGTHS)
    pipeline = plan.pipelines[0]
    micro_batches = [measured_micro_batch(mb.lengths, 0.05, fwd_s=0.02) for mb in pipeline.micro_batches]
    assert micro_batches[0]["num_tokens"] == sum(pipeline.micro_batches[0].lengths)
    measured = {"scheme": pipeline.scheme, "micro_batches": micro_batches, "peak_memory_bytes": [1e9]}
    fit = session.post_measurements([measured], profile_version=plan.session_feedback.profile_version)
    assert fit["version"] == 1 and fit["num_steps"] == 1
    assert session.plan(TINY_LENGTHS).session_feedback.profile_version == 1
    with pytest.raises(hydraplan.ServiceError) as refused:
        session.post_measurements([{**measured, "peak_memory_bytes": [-1.0]}])
    assert refused.value.status == 422 and refused.value.field == "body.pipelines.0.peak_memory_bytes.0"
    assert session.view()["fit"]["version"] == 1


def test_a_wrong_session_profile_converges_over_the_api(client) -> None:
    """Issue 31's wrong start, end to end: a session on the bundled CPU profile with its quadratic and
    linear terms scaled by 2 and 0.5, measured by the true profile, plans with a median stage-time
    error <= 10% within 10 posted steps; every plan names the version it was planned with."""
    from hydraplan.cost_models.profile_io import load_profile

    true_profile = load_profile(Path(__file__).resolve().parents[1] / "cost_models" / "data" / "tiny-cpu.json")
    wrong = true_profile.model_copy(
        update={
            "schemes": [
                entry.model_copy(update={"a": entry.a * 2, "b": entry.b * 0.5}) for entry in true_profile.schemes
            ]
        }
    )
    session_id = open_session(
        client,
        model=None,
        gpu=None,
        profile=wrong.model_dump(mode="json"),
        num_gpus=2,
        gpus_per_node=2,
        options={"time_limit_s": 5.0, "seed": 0, "solver": "greedy"},
    )
    truth = {entry.key: entry for entry in true_profile.schemes}
    for step in range(10):
        plan = plan_in(client, session_id, TINY_LENGTHS[step::3])
        assert plan.session_feedback.profile_version == step
        body = measurements_of(plan)
        for measured, pipeline in zip(body["pipelines"], plan.pipelines, strict=True):
            entry = truth[(pipeline.scheme.tp, pipeline.scheme.pp, pipeline.scheme.cp)]
            for micro_batch in measured["micro_batches"]:
                micro_batch["time_s"] = entry.a * micro_batch["sum_sq_tokens"] + entry.b * micro_batch["num_tokens"]
                micro_batch["time_s"] += entry.c
                micro_batch["fwd_s"] = micro_batch["time_s"] * entry.fwd_fraction
        assert post(client, session_id, body).status_code == 200
    errors = [error["median_error"] for error in client.get(f"/v1/sessions/{session_id}").json()["fit"]["errors"]]
    assert errors[0] > 0.2 and errors[-1] <= 0.10, errors


def test_concurrent_posts_on_one_session_get_409_and_planning_goes_on(client, monkeypatch) -> None:
    """A refit in progress holds the session's fit lease: a second post is 409, while a plan call is
    served with the last stored version (a refit never blocks planning)."""
    import threading

    import hydraplan.api.service.session_loop as session_loop

    session_id = open_session(client)
    plan = plan_in(client, session_id)
    entered, release = threading.Event(), threading.Event()
    real_apply_step = session_loop.apply_step

    def slow_apply_step(*args: Any, **kwargs: Any):
        entered.set()
        assert release.wait(30)
        return real_apply_step(*args, **kwargs)

    monkeypatch.setattr(session_loop, "apply_step", slow_apply_step)
    answers: list[Any] = []
    first = threading.Thread(target=lambda: answers.append(post(client, session_id, measurements_of(plan))))
    first.start()
    try:
        assert entered.wait(30)
        assert_problem(post(client, session_id, measurements_of(plan)), 409, "already recording")
        assert plan_in(client, session_id).session_feedback.profile_version == 0
    finally:
        release.set()
        first.join(30)
    assert answers[0].status_code == 200 and answers[0].json()["version"] == 1
    assert plan_in(client, session_id).session_feedback.profile_version == 1


def test_the_fit_is_shared_through_redis_and_deleted_with_the_session(redis_url: str) -> None:
    """Two apps on one Redis: a version made on one plans on the other; DELETE drops the fit too."""
    import time

    from hydraplan.api.service.session_loop import fit_key
    from hydraplan.api.service.store import open_store

    prefix = f"loop-{time.monotonic_ns()}:"
    with (
        make_client(redis_url=redis_url, redis_prefix=prefix) as first,
        make_client(redis_url=redis_url, redis_prefix=prefix) as second,
    ):
        session_id = open_session(first)
        plan = plan_in(first, session_id)
        assert post(second, session_id, measurements_of(plan, slow=1.2)).status_code == 200
        assert plan_in(first, session_id).session_feedback.profile_version == 1
        store = open_store(redis_url, prefix)
        try:
            assert store.get(fit_key(session_id)) is not None
            assert first.delete(f"/v1/sessions/{session_id}").status_code == 204
            assert store.get(fit_key(session_id)) is None
        finally:
            store.close()


HOSTILE = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 2**64, 1e308, 5e-324, -0.0, float("nan"), float("inf")]),
    st.booleans(),
    st.none(),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


@pytest.fixture(scope="module")
def fuzzed_session():
    with make_client() as client:
        session_id = open_session(client)
        plan = plan_in(client, session_id)
        body = measurements_of(plan, peak_bytes=1e9)
        body["pipelines"] = body["pipelines"][:1]
        body["pipelines"][0]["micro_batches"] = body["pipelines"][0]["micro_batches"][:2]
        body["collectives"] = [{"op": "all_reduce", "ranks": 8, "bytes": 1024, "seconds": 0.001}]
        yield client, session_id, body


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = []
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        found.append((*prefix, key))
        found.extend(_paths(child, (*prefix, key)))
    return found


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_hostile_values_are_4xx_and_store_nothing(fuzzed_session, data) -> None:
    client, session_id, valid = fuzzed_session
    path = data.draw(st.sampled_from(_paths(valid)), label="path")
    value = data.draw(HOSTILE, label="value")
    body = copy.deepcopy(valid)
    target = body
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    before = client.get(f"/v1/sessions/{session_id}").json()["fit"]
    response = client.post(
        f"/v1/sessions/{session_id}/measurements",
        content=json.dumps(body),  # NaN and Infinity literals as Python writes them
        headers={"content-type": "application/json"},
    )
    assert response.status_code in (200, 400, 422), (path, value, response.text[:300])
    after = client.get(f"/v1/sessions/{session_id}").json()["fit"]
    if response.status_code == 200:  # a value that happens to be valid: one more step recorded
        assert after["num_steps"] == before["num_steps"] + 1, (path, value)
    else:
        assert after == before, (path, value)
