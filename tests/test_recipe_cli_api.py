"""The training recipe through the front doors: CLI flags and the REST `recipe` field (issue 13)."""

from __future__ import annotations

import json
from pathlib import Path

from api_support import assert_problem, client_fixture, plan_body  # noqa: F401

from hydraplan.api.cli import main
from hydraplan.cost_models import build_profile, get_gpu, get_model


def test_cli_recipe_flags_reach_the_profile(capsys) -> None:
    assert (
        main(
            [
                "profile",
                "--analytic",
                "--model",
                "tiny",
                "--num-gpus",
                "8",
                "--sharding",
                "fsdp",
                "--recompute",
                "full",
                "--grad-dtype",
                "bf16",
                "--dp-sync-exposed",
                "0.25",
            ]
        )
        == 0
    )
    profile = json.loads(capsys.readouterr().out)
    assert profile["recipe"]["sharding"] == "zero3" and profile["recipe"]["recompute"] == "full"
    assert profile["grad_sync_exposed_fraction"] == 0.25
    assert {scheme["fwd_fraction"] for scheme in profile["schemes"]} == {0.25}


def test_cli_refuses_a_bad_recipe_value(capsys) -> None:
    assert main(["schemes", "--model", "tiny", "--num-gpus", "8", "--tp-comm-exposed", "2"]) == 2
    assert "--tp-comm-exposed: '2' must be in [0, 1]" in capsys.readouterr().err
    assert main(["schemes", "--model", "tiny", "--num-gpus", "8", "--sharding", "zero4"]) == 2
    assert "--sharding" in capsys.readouterr().err


def test_api_recipe_changes_the_estimate(client) -> None:
    strategy = [{"tp": 1, "pp": 1, "cp": 1, "num_pipelines": 8}]
    plain = client.post("/v1/estimate", json=plan_body(strategy=strategy))
    hidden = client.post("/v1/estimate", json=plan_body(strategy=strategy, recipe={"dp_sync_exposed": 0.0}))
    assert plain.status_code == 200 and hidden.status_code == 200, hidden.text
    assert plain.json()["plan"]["grad_sync_s"] > 0
    assert hidden.json()["plan"]["grad_sync_s"] == 0


def test_api_refuses_a_recipe_without_model_and_a_bad_value(client) -> None:
    assert_problem(client.post("/v1/plans", json=plan_body(recipe={"sharding": "zero9"})), 422, "sharding")
    inline = {key: value for key, value in plan_body().items() if key not in ("model", "gpu")}
    profile = build_profile(get_model("tiny"), get_gpu("h100-sxm-80gb"), 8, 8)
    inline["profile"] = json.loads(profile.model_dump_json())
    inline["recipe"] = {"recompute": "full"}
    assert_problem(client.post("/v1/plans", json=inline), 422, "recipe applies to the analytic")


def test_cli_recipe_flags_are_refused_where_no_analytic_profile_is_built(capsys) -> None:
    measured = str(Path(__file__).resolve().parents[1] / "cost_models" / "data" / "tiny-cpu.json")
    argv = ["profile", "--calibrate", measured, "--model", "tiny", "--num-gpus", "8", "--grad-dtype", "bf16"]
    assert main(argv) == 2
    assert "apply to --analytic profiles only" in capsys.readouterr().err


def test_cli_recipe_flags_are_refused_with_a_profile_file(tmp_path, capsys) -> None:
    out = tmp_path / "tiny.json"
    assert main(["profile", "--analytic", "--model", "tiny", "--num-gpus", "8", "--out", str(out)]) == 0
    assert main(["schemes", "--profile", str(out), "--sharding", "zero2"]) == 2
    assert "not to a profile file" in capsys.readouterr().err
    assert main(["schemes", "--profile", str(out)]) == 0
