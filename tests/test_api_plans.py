"""POST /v1/plans, /v1/plans/check, /v1/estimate, the catalog and uploaded profiles."""

from __future__ import annotations

import json

import pytest
from api_support import assert_problem, client_fixture, make_client, plan_body, reproducible_body  # noqa: F401

from hydraplan.cost_models.analytic import build_profile
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.planner.check import check_plan, content_plan_id
from hydraplan.planner.schemas import Plan, PlanRequest, SolverOptions
from hydraplan.planner.solve import solve

pytestmark = pytest.mark.service


@pytest.fixture(scope="module")
def tiny_plan() -> dict:
    """One plan of the reproducible body, made once for the module."""
    with make_client() as module_client:
        response = module_client.post("/v1/plans", json=reproducible_body())
    assert response.status_code == 200, response.text
    return response.json()


# ---------------------------------------------------------------------------------------------
# POST /v1/plans
# ---------------------------------------------------------------------------------------------


def test_plan_is_the_libraries_plan(tiny_plan: dict) -> None:
    """The response is the Plan JSON of a direct library call, same plan_id (content hash)."""
    plan = Plan.model_validate(tiny_plan)
    assert check_plan(plan) == [] and not plan.solver.cut_by_clock
    body = reproducible_body()
    request = PlanRequest(
        lengths=body["lengths"],
        num_gpus=8,
        gpus_per_node=8,
        options=SolverOptions(**body["options"]),
    )
    profile = build_profile(get_model("tiny"), get_gpu("h100-sxm-80gb"), 8, 8)
    direct = solve(request, profile)
    assert plan.plan_id == direct.plan_id and plan == direct
    assert plan.input_lengths == body["lengths"]
    assert plan.num_gpus == 8


def test_same_request_same_plan_id(client, tiny_plan: dict) -> None:
    again = client.post("/v1/plans", json=reproducible_body())
    assert again.status_code == 200
    assert again.json() == tiny_plan
    other_seed = client.post("/v1/plans", json=plan_body(options={"time_limit_s": 5.0, "seed": 7}))
    assert other_seed.json()["plan_id"] != tiny_plan["plan_id"]
    assert other_seed.json()["request_hash"] != tiny_plan["request_hash"]


def test_plan_with_inline_specs_and_baseline(client) -> None:
    model = get_model("tiny").model_dump()
    gpu = get_gpu("a100-80gb").model_dump()
    response = client.post("/v1/plans", json=plan_body(model=model, gpu=gpu, baselines=["megatron"]))
    assert response.status_code == 200, response.text
    plan = response.json()
    assert plan["cost_profile"]["gpu"] == "a100-80gb"
    assert [baseline["name"] for baseline in plan["baselines"]] == ["megatron"]


def test_plan_compares_the_interleaved_baselines(client) -> None:
    body = plan_body(model="llama3-8b", num_gpus=16, gpus_per_node=8, baselines=["megatron-vpp", "wlb-vpp"])
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 200, response.text
    assert [baseline["name"] for baseline in response.json()["baselines"]] == ["megatron-vpp", "wlb-vpp"]
    assert all(baseline["error"] is None for baseline in response.json()["baselines"])


def test_virtual_stages_offer_interleaved_schemes_to_the_search(client) -> None:
    """Like `hydraplan plan --virtual-stages`: the analytic profile prices <tp,pp,cp,v> beside the
    plain schemes and the search enumerates them."""
    body = plan_body(model="llama3-8b", num_gpus=16, gpus_per_node=8)
    plain = client.post("/v1/plans", json=body)
    offered = client.post("/v1/plans", json={**body, "virtual_stages": [2, 4]})
    assert plain.status_code == 200 and offered.status_code == 200, offered.text
    assert offered.json()["solver"]["num_schemes"] > plain.json()["solver"]["num_schemes"]
    assert all(pipeline["scheme"].get("v", 1) in (1, 2, 4) for pipeline in offered.json()["pipelines"])


@pytest.mark.parametrize(
    ("update", "fragment"),
    [
        ({"virtual_stages": [0]}, "greater than or equal to 1"),
        ({"virtual_stages": [129]}, "less than or equal to 128"),
        ({"virtual_stages": ["2"]}, "valid integer"),
    ],
)
def test_bad_virtual_stages_are_refused(client, update: dict, fragment: str) -> None:
    problem = assert_problem(client.post("/v1/plans", json=plan_body(**update)), 422, fragment)
    assert problem["errors"][0]["loc"][:2] == ["body", "virtual_stages"]


def test_virtual_stages_need_the_analytic_profile(client, user_profile_data: dict) -> None:
    body = plan_body(profile=user_profile_data, virtual_stages=[2])
    del body["model"], body["gpu"]
    assert_problem(client.post("/v1/plans", json=body), 422, "virtual_stages [2]: applies to the analytic profile")


def test_plan_with_inline_profile(client, user_profile_data: dict) -> None:
    body = plan_body(profile=user_profile_data)
    del body["model"], body["gpu"]
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["cost_profile"]["time_unit"] == "ms"


@pytest.mark.parametrize(
    ("update", "drop", "fragment"),
    [
        ({"profile_id": "prof-x"}, (), "give only one of model+gpu, profile or profile_id"),
        ({}, ("gpu",), "model is given but gpu is missing"),
        ({}, ("model", "gpu"), "a cost source is required"),
    ],
)
def test_exactly_one_cost_source(client, update: dict, drop: tuple, fragment: str) -> None:
    body = plan_body(**update)
    for name in drop:
        del body[name]
    problem = assert_problem(client.post("/v1/plans", json=body), 422, fragment)
    assert problem["errors"][0]["loc"] == ["body"]


def test_validation_errors_name_every_field(client) -> None:
    body = plan_body(lengths=[100, 0, 5], num_gpus=0, surprise=1)
    problem = assert_problem(client.post("/v1/plans", json=body), 422, "body.")
    locations = {tuple(error["loc"]) for error in problem["errors"]}
    assert ("body", "lengths", 1) in locations
    assert ("body", "num_gpus") in locations
    assert ("body", "surprise") in locations
    assert problem["type"].endswith("validation")


def test_planners_own_validation_becomes_422(client) -> None:
    problem = assert_problem(
        client.post("/v1/plans", json=plan_body(num_gpus=12)),
        422,
        "not a multiple of gpus_per_node",
    )
    assert problem["errors"][0]["loc"][0] == "body"


def test_unplannable_request_is_422(client) -> None:
    """Fewer sequences than any strategy's pipelines, or a sequence over every capacity."""
    response = client.post("/v1/plans", json=plan_body(lengths=[2**30]))
    assert_problem(response, 422)


def test_planner_value_errors_are_422(client) -> None:
    """Options the planner rejects deep inside (a strategy pool naming a scheme the profile
    lacks, a malformed previous strategy) are the caller's mistake, not a server error."""
    options = {"time_limit_s": 0.3, "strategy_pool": ["2x<4,1,1>"]}
    assert_problem(client.post("/v1/plans", json=plan_body(options=options)), 422, "<4,1,1>")
    problem = assert_problem(client.post("/v1/plans", json=plan_body(previous_strategy="garbage")), 422, "garbage")
    # checked as the body is parsed (planner.schemas.previous_strategy_fits), before any work
    assert problem["errors"][0]["loc"] == ["body", "previous_strategy"]


def test_unknown_model_gpu_and_baseline(client) -> None:
    assert_problem(client.post("/v1/plans", json=plan_body(model="gpt-9")), 404, "model 'gpt-9'", "tiny")
    assert_problem(client.post("/v1/plans", json=plan_body(gpu="tpu")), 404, "gpu 'tpu'", "a100-80gb")
    problem = assert_problem(client.post("/v1/plans", json=plan_body(baselines=["megatron", "nope"])), 422, "'nope'")
    assert problem["errors"][0]["loc"] == ["body", "baselines", 1]


def test_model_that_does_not_fit_is_422(client) -> None:
    response = client.post("/v1/plans", json=plan_body(model="llama3-70b", num_gpus=1, gpus_per_node=8))
    assert_problem(response, 422, "does not fit")


def test_server_limits(client) -> None:
    with make_client(max_sequences=10) as small:
        assert_problem(small.post("/v1/plans", json=plan_body()), 413, "64 sequences", "10")
    assert_problem(client.post("/v1/plans", json=plan_body(num_gpus=128)), 422, "num_gpus 128")
    too_long = plan_body(options={"time_limit_s": 50})
    problem = assert_problem(client.post("/v1/plans", json=too_long), 422, "/v1/jobs")
    assert problem["errors"][0]["loc"] == ["body", "options", "time_limit_s"]


def test_malformed_json_and_wrong_media_type(client) -> None:
    headers = {"content-type": "application/json"}
    problem = assert_problem(
        client.post("/v1/plans", content=b'{"lengths": [1,', headers=headers), 400, "not valid JSON"
    )
    assert problem["type"].endswith("malformed-json")
    assert_problem(
        client.post("/v1/plans", content=b"lengths=1", headers={"content-type": "text/plain"}),
        415,
        "text/plain",
    )
    assert_problem(client.post("/v1/plans", content=b"[]", headers=headers), 422)


def test_unknown_route_and_wrong_method(client) -> None:
    assert_problem(client.get("/v1/nothing-here"), 404, "/v1/nothing-here")
    problem = assert_problem(client.get("/v1/plans"), 405, "GET", "POST")
    assert problem["instance"] == "/v1/plans"


# ---------------------------------------------------------------------------------------------
# POST /v1/plans/check
# ---------------------------------------------------------------------------------------------


def test_check_valid_plan_against_its_request(client, tiny_plan: dict) -> None:
    body = {"plan": tiny_plan, "lengths": plan_body()["lengths"], "num_gpus": 8}
    response = client.post("/v1/plans/check", json=body)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "plan_id": tiny_plan["plan_id"],
        "valid": True,
        "violations": [],
        "verified_bound_s": None,
    }


def test_check_verifies_the_bound_with_a_cost_source(client, tiny_plan: dict) -> None:
    """`bound`: the verifier's bound comes back; a claim raised above it is named; without the
    profile that defines the strategy space it is a 422."""
    body = {"plan": tiny_plan, **reproducible_body(), "bound": True}
    verdict = client.post("/v1/plans/check", json=body).json()
    assert isinstance(verdict["verified_bound_s"], float)
    assert verdict["valid"] == (verdict["verified_bound_s"] >= tiny_plan["lower_bound_s"] * (1 - 1e-6)), verdict
    bare = Plan.model_validate({**tiny_plan, "bound_certificate": None})
    no_certificate = {**tiny_plan, "bound_certificate": None, "plan_id": content_plan_id(bare)}
    verdict = client.post("/v1/plans/check", json={**body, "plan": no_certificate}).json()
    assert verdict["valid"] is False and verdict["verified_bound_s"] is None
    assert "bound: the plan carries no bound certificate" in verdict["violations"]
    problem = assert_problem(client.post("/v1/plans/check", json={"plan": tiny_plan, "bound": True}), 422)
    assert "verifying the bound needs the profile" in problem["detail"]


def test_check_reports_mismatches_and_violations(client, tiny_plan: dict) -> None:
    lengths = plan_body()["lengths"]
    lengths[3] += 1
    result = client.post("/v1/plans/check", json={"plan": tiny_plan, "lengths": lengths, "num_gpus": 16})
    assert result.status_code == 200
    verdict = result.json()
    assert verdict["valid"] is False
    assert any("sequence 3" in violation for violation in verdict["violations"])
    assert any("16" in violation for violation in verdict["violations"])

    broken = json.loads(json.dumps(tiny_plan))
    broken["step_time_s"] *= 0.5
    verdict = client.post("/v1/plans/check", json={"plan": broken}).json()
    assert verdict["valid"] is False and verdict["violations"]


def test_check_against_the_whole_request_and_its_cost_source(client, tiny_plan: dict) -> None:
    """With `options` the body is the request the plan answers: with its cost source (the
    profile it was planned with) the plan's request_hash is checked too, and an edited one named."""
    body = {"plan": tiny_plan, **reproducible_body()}
    assert client.post("/v1/plans/check", json=body).json()["violations"] == []
    tampered = {**tiny_plan, "request_hash": "rq-00000000000000000000"}
    verdict = client.post("/v1/plans/check", json={**body, "plan": tampered}).json()
    assert (
        verdict["valid"] is False
        and (
            f"request_hash 'rq-00000000000000000000' is not the hash of the request and profile, "
            f"{tiny_plan['request_hash']!r}"
        )
        in verdict["violations"]
    )
    another_seed = {**body, "options": {**body["options"], "seed": 1}}
    violations = client.post("/v1/plans/check", json=another_seed).json()["violations"]
    assert len(violations) == 1 and violations[0].startswith("request_hash ")
    looser = {**body, "options": {**body["options"], "gap_tolerance": 0.5}}
    violations = client.post("/v1/plans/check", json=looser).json()["violations"]
    assert "solver.gap_tolerance 0.01 is not the request's gap_tolerance 0.5" in violations
    previous = client.post("/v1/plans/check", json={**body, "previous_strategy": "8x<1,1,1>"}).json()["violations"]
    assert "previous_strategy None is not the request's '8x<1,1,1>'" in previous


def test_check_refuses_options_without_the_batch(client, tiny_plan: dict) -> None:
    problem = assert_problem(client.post("/v1/plans/check", json={"plan": tiny_plan, "options": {}}), 422)
    assert "give lengths and num_gpus too" in problem["detail"]
    body = {"plan": tiny_plan, "lengths": [1, 2], "num_gpus": 12, "options": {}}
    problem = assert_problem(client.post("/v1/plans/check", json=body), 422)
    assert problem["errors"][0]["loc"] == ["body", "num_gpus"] or "multiple of gpus_per_node" in problem["detail"]


def test_check_against_another_profile(client, tiny_plan: dict) -> None:
    """Recomputing times with a slower GPU's profile disagrees with the plan's own times."""
    body = {"plan": tiny_plan, "model": "tiny", "gpu": "a100-40gb"}
    verdict = client.post("/v1/plans/check", json=body).json()
    assert verdict["valid"] is False


def test_check_rejects_a_non_plan(client) -> None:
    problem = assert_problem(client.post("/v1/plans/check", json={"plan": {"plan_id": "x"}}), 422)
    assert all(error["loc"][:2] == ["body", "plan"] for error in problem["errors"])


# ---------------------------------------------------------------------------------------------
# POST /v1/estimate
# ---------------------------------------------------------------------------------------------


def test_estimate_fixed_strategy(client) -> None:
    strategy = [
        {"tp": 2, "pp": 1, "cp": 1, "num_pipelines": 2},
        {"tp": 1, "pp": 1, "num_pipelines": 4},
    ]
    response = client.post("/v1/estimate", json=plan_body(strategy=strategy))
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["strategy"] == result["plan"]["strategy"]
    assert sorted(p["scheme"]["tp"] for p in result["pipelines"]) == [1, 1, 1, 1, 2, 2]
    for pipeline in result["pipelines"]:
        assert pipeline["peak_memory_bytes"] is not None and pipeline["peak_memory_bytes"] > 0
        assert pipeline["max_micro_batch_tokens"] <= pipeline["capacity_tokens"]
    assert result["step_time_s"] >= max(p["time_s"] for p in result["pipelines"])


def test_estimate_baseline_and_errors(client) -> None:
    response = client.post("/v1/estimate", json=plan_body(baseline="megatron"))
    assert response.status_code == 200, response.text
    assert_problem(client.post("/v1/estimate", json=plan_body()), 422, "exactly one of strategy or baseline")
    wrong_size = [{"tp": 1, "pp": 1, "num_pipelines": 3}]
    assert_problem(client.post("/v1/estimate", json=plan_body(strategy=wrong_size)), 422, "3 GPUs")
    assert_problem(client.post("/v1/estimate", json=plan_body(baseline="oracle")), 422, "'oracle'")


# ---------------------------------------------------------------------------------------------
# Catalog and profiles
# ---------------------------------------------------------------------------------------------


def test_catalog(client) -> None:
    models = client.get("/v1/models").json()["models"]
    assert "tiny" in {model["name"] for model in models}
    gpus = client.get("/v1/gpus").json()["gpus"]
    assert "h100-sxm-80gb" in {gpu["name"] for gpu in gpus}


def test_schemes(client) -> None:
    response = client.get("/v1/schemes", params={"model": "tiny", "gpu": "h100-sxm-80gb", "num_gpus": 8})
    assert response.status_code == 200, response.text
    listing = response.json()
    assert listing["num_gpus"] == 8 and listing["gpus_per_node"] == 8
    assert "<1,1,1>" in {scheme["scheme"] for scheme in listing["schemes"]}
    assert all(scheme["num_gpus"] <= 8 for scheme in listing["schemes"])
    assert_problem(client.get("/v1/schemes", params={"model": "x", "gpu": "h100-sxm-80gb", "num_gpus": 8}), 404)
    missing = assert_problem(client.get("/v1/schemes", params={"model": "tiny"}), 422)
    assert ["query", "gpu"] in [error["loc"] for error in missing["errors"]]
    assert_problem(
        client.get("/v1/schemes", params={"model": "tiny", "gpu": "h100-sxm-80gb", "num_gpus": 12}),
        422,
        "multiple of gpus_per_node",
    )


def test_upload_profile_then_plan_with_it(client, user_profile_data: dict) -> None:
    created = client.post("/v1/profiles", json=user_profile_data)
    assert created.status_code == 201, created.text
    profile_id = created.json()["profile_id"]
    assert created.headers["location"] == f"/v1/profiles/{profile_id}"
    again = client.post("/v1/profiles", json=user_profile_data)
    assert again.json()["profile_id"] == profile_id  # content-addressed

    stored = client.get(f"/v1/profiles/{profile_id}")
    assert stored.status_code == 200
    assert stored.json()["schemes"][0]["a"] == user_profile_data["schemes"][0]["a"]

    body = plan_body(profile_id=profile_id)
    del body["model"], body["gpu"]
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["cost_profile"]["time_unit"] == "ms"


def test_unknown_and_invalid_profiles(client, user_profile_data: dict) -> None:
    assert_problem(client.get("/v1/profiles/prof-nothing"), 404, "prof-nothing")
    body = plan_body(profile_id="prof-nothing")
    del body["model"], body["gpu"]
    assert_problem(client.post("/v1/plans", json=body), 404, "profile_id 'prof-nothing'")
    broken = dict(user_profile_data, schemes=[dict(user_profile_data["schemes"][2], static_bytes=None)])
    problem = assert_problem(client.post("/v1/profiles", json=broken), 422, "capacity_tokens")
    assert problem["errors"][0]["loc"][0] == "body"
