"""`time_limit_s: auto` through the CLI flags, the what-if spec and the REST API (the budget
itself: tests/test_auto_budget.py)."""

from __future__ import annotations

import json

import pytest
from api_support import assert_problem, make_client, plan_body, session_body
from test_cli import TINY, assert_one_line_error, run

from hydraplan.api.cli import build_parser
from hydraplan.api.service.planning import longest_budget_s
from hydraplan.planner.budget import AUTO_MAX_S, AUTO_MIN_S
from hydraplan.planner.schemas import SolverOptions

TINY_AUTO = [*TINY, "--time-limit-s", "auto"]  # the later flag wins


def assert_auto_budget(plan: dict) -> float:
    budget_s = plan["solver"]["time_limit_s"]
    assert AUTO_MIN_S <= budget_s <= AUTO_MAX_S, plan["solver"]
    return budget_s


def test_plan_with_an_auto_budget_records_the_resolved_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", *TINY_AUTO, "--json", "--progress")
    assert code == 0, err
    budget_s = assert_auto_budget(json.loads(out))
    assert f"on 8 GPUs, budget auto ({budget_s:.1f} s) ... done in " in err, err


@pytest.mark.parametrize("value", ["fast", "-1", "0", "inf"])
def test_a_bad_time_limit_is_one_line_naming_the_flag_and_value(capsys: pytest.CaptureFixture[str], value: str) -> None:
    code, _, err = run(capsys, "plan", *TINY, "--time-limit-s", value)
    message = assert_one_line_error(code, err)
    assert message.startswith("argument --time-limit-s: ") and repr(value) in message, message


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--time-limit-s", "auto"],
        ["strategies", "--time-limit-s", "AUTO"],
        ["run", "--plan-time-limit-s", "auto"],
    ],
)
def test_every_time_limit_flag_takes_auto(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.time_limit_s if argv[0] != "run" else args.plan_time_limit_s) == "auto"


def test_whatif_takes_auto_from_the_flag_and_the_spec_file(tmp_path) -> None:
    from hydraplan.api.cli.whatif import flag_values
    from hydraplan.api.whatif.spec import build_spec, expand

    args = build_parser().parse_args(["whatif", "--time-limit-s", "auto", "--model", "tiny", "--num-gpus", "8"])
    spec, where = build_spec({}, flag_values(args), None)
    assert spec.time_limit_s == "auto"
    configurations = expand(spec, where, 100, confirmed=False)
    assert {configuration.options.time_limit_s for configuration in configurations} == {"auto"}
    from_file, _ = build_spec({"time_limit_s": "auto"}, {}, "study.yaml")
    assert from_file.time_limit_s == "auto"


# ---------------------------------------------------------------------------------------------
# REST
# ---------------------------------------------------------------------------------------------


@pytest.mark.service
def test_post_plans_with_an_auto_budget() -> None:
    with make_client(max_sync_time_limit_s=AUTO_MAX_S) as client:
        response = client.post("/v1/plans", json=plan_body(options={"time_limit_s": "auto", "seed": 0}))
    assert response.status_code == 200, response.text
    assert_auto_budget(response.json())


@pytest.mark.service
def test_a_session_without_options_plans_with_auto() -> None:
    body = session_body()
    del body["options"]
    with make_client(max_sync_time_limit_s=AUTO_MAX_S) as client:
        created = client.post("/v1/sessions", json=body)
        assert created.status_code == 201, created.text
        session_id = created.json()["session_id"]
        assert client.get(f"/v1/sessions/{session_id}").json()["config"]["options"]["time_limit_s"] == "auto"
        planned = client.post(f"/v1/sessions/{session_id}/plans", json={"lengths": plan_body()["lengths"]})
    assert planned.status_code == 200, planned.text
    assert_auto_budget(planned.json())


@pytest.mark.service
def test_the_synchronous_limit_counts_auto_as_its_ceiling() -> None:
    assert longest_budget_s(SolverOptions(time_limit_s="auto")) == AUTO_MAX_S
    assert longest_budget_s(SolverOptions(time_limit_s=3)) == 3.0
    with make_client(max_sync_time_limit_s=AUTO_MAX_S - 1) as client:
        refused = client.post("/v1/plans", json=plan_body(options={"time_limit_s": "auto"}))
        problem = assert_problem(refused, 422, "auto (up to 60 s)", "/v1/jobs")
        assert problem["errors"][0]["loc"] == ["body", "options", "time_limit_s"]
        session = session_body()
        del session["options"]  # a session's default is auto: refused the same way
        assert_problem(client.post("/v1/sessions", json=session), 422, "auto (up to 60 s)")
        assert client.post("/v1/sessions", json=session_body()).status_code == 201  # seconds are fine


@pytest.mark.service
@pytest.mark.parametrize(
    ("value", "expected"), [(0, "greater than 0"), (601, "less than or equal to 600"), ("soon", "")]
)
def test_a_bad_time_limit_is_one_problem_at_the_field(value, expected: str) -> None:
    """Refused by both members of the union (seconds or 'auto'): one error, at the field itself."""
    with make_client() as client:
        response = client.post("/v1/plans", json=plan_body(options={"time_limit_s": value}))
    problem = assert_problem(response, 422, "body.options.time_limit_s: ", expected)
    assert [error["loc"] for error in problem["errors"]] == [["body", "options", "time_limit_s"]]
    assert "more" not in problem["detail"]
