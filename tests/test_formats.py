"""The versioned formats' JSON Schemas: the committed copies (docs/schemas/) equal what the models
produce, real files validate against them, and `hydraplan schema` prints them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest

from hydraplan.api.cli import main
from hydraplan.planner.formats import FORMATS, json_schema
from hydraplan.planner.schemas import PlanRequest, SolverOptions

SCHEMAS = Path(__file__).resolve().parents[1] / "docs" / "schemas"


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_committed_schema_is_current(name: str) -> None:
    """A format change is deliberate: regenerate with UPDATE_SNAPSHOTS=1 (or `hydraplan schema`)."""
    path = SCHEMAS / f"{name}.schema.json"
    current = json_schema(name)
    if os.environ.get("UPDATE_SNAPSHOTS"):
        path.write_text(json.dumps(current, indent=2) + "\n")
    assert json.loads(path.read_text()) == current, f"{path} is stale: run hydraplan schema {name} --out {path}"


def test_real_files_validate_against_their_schemas(user_profile_data: dict) -> None:
    import hydraplan

    plan = hydraplan.plan([4096, 1024, 512, 8192], model="tiny", num_gpus=4, time_limit_s=0.3)
    request = PlanRequest(lengths=[5, 6], num_gpus=8, options=SolverOptions(seed=2))
    for name, document in (
        ("plan", json.loads(plan.model_dump_json())),
        ("profile", json.loads(plan.cost_profile.model_dump_json())),
        ("profile", user_profile_data),
        ("request", json.loads(request.model_dump_json())),
    ):
        jsonschema.validate(document, json.loads((SCHEMAS / f"{name}.schema.json").read_text()))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**json.loads(plan.model_dump_json()), "extra": 1}, json_schema("plan"))


def test_the_schema_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "profile"]) == 0
    assert json.loads(capsys.readouterr().out) == json_schema("profile")
    assert main(["schema", "nope"]) == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown format 'nope'; valid: plan, profile, request, pool"):
        json_schema("nope")
