"""The public Python API in `hydraplan/__init__`: its doctest examples, each function's contract
and bad input, and an import that loads nothing heavy."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

import hydraplan

TINY = {"model": "tiny", "num_gpus": 8, "time_limit_s": 0.3}
LENGTHS = [4096, 1024, 512, 8192, 2048, 300, 7000, 128]


def test_the_docstring_examples_run() -> None:
    result = doctest.testmod(hydraplan, raise_on_error=False)
    assert result.attempted >= 5 and result.failed == 0


def test_every_public_name_resolves() -> None:
    for name in hydraplan.__all__:
        assert getattr(hydraplan, name) is not None
    assert hydraplan.Plan.__name__ == "Plan" and issubclass(hydraplan.PlanningError, ValueError)
    with pytest.raises(AttributeError, match="no attribute 'solve'"):
        hydraplan.solve  # noqa: B018  (private by convention: not exported)


def test_plan_takes_numpy_lengths_and_options() -> None:
    plan = hydraplan.plan(np.array(LENGTHS, dtype=np.int64), seed=3, max_schemes=1, **TINY)
    assert plan.input_lengths == LENGTHS and plan.solver.seed == 3
    assert len({str(p.scheme) for p in plan.pipelines}) == 1
    assert hydraplan.check(plan) == []


@pytest.mark.parametrize(
    ("lengths", "message"),
    [([True, 5], "lengths.0"), ([5.0], "lengths.0"), (["5"], "lengths.0"), ([0, 5], "lengths[0] = 0")],
)
def test_bad_lengths_are_refused_naming_the_position(lengths: list, message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        hydraplan.plan(lengths, **TINY)


def test_unknown_names_and_options_are_value_errors() -> None:
    with pytest.raises(ValueError, match="gpt-9"):
        hydraplan.plan(LENGTHS, model="gpt-9", num_gpus=8)
    with pytest.raises(ValidationError, match="time_limit_s"):
        hydraplan.plan(LENGTHS, model="tiny", num_gpus=8, time_limit_s=-1)
    with pytest.raises(ValidationError, match="bogus"):
        hydraplan.plan(LENGTHS, model="tiny", num_gpus=8, bogus=1)


def test_plan_with_a_profile_object_or_file(tmp_path: Path, user_profile_data: dict) -> None:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(user_profile_data))
    from_file = hydraplan.plan_with_profile(LENGTHS * 8, path, num_gpus=8, time_limit_s=0.3)
    from_object = hydraplan.plan_with_profile(
        LENGTHS * 8, hydraplan.load_profile(user_profile_data), num_gpus=8, time_limit_s=0.3
    )
    assert from_file.cost_profile == from_object.cost_profile
    assert hydraplan.check(from_file, path) == []


def test_load_profile_names_the_file_and_field(tmp_path: Path, user_profile_data: dict) -> None:
    user_profile_data["schemes"][0]["a"] = -1
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(user_profile_data))
    with pytest.raises(ValueError, match=r"bad.json: schemes\[0\].a"):
        hydraplan.load_profile(path)


def test_estimate_costs_a_fixed_strategy() -> None:
    fixed = hydraplan.estimate(LENGTHS, "2x<2,2,1>", model="tiny", num_gpus=8)
    assert fixed.strategy == "2x<2,2,1>" and hydraplan.check(fixed) == []
    with pytest.raises(ValueError, match="strategy 2x<2,2,1> uses 8 GPUs, the cluster has 16"):
        hydraplan.estimate(LENGTHS, "2x<2,2,1>", model="tiny", num_gpus=16)


def test_check_finds_a_tampered_plan() -> None:
    plan = hydraplan.plan(LENGTHS, **TINY)
    tampered = plan.model_copy(update={"step_time_s": plan.step_time_s * 0.5})
    assert any("step_time_s" in violation for violation in hydraplan.check(tampered))


def test_check_against_the_request() -> None:
    plan = hydraplan.plan(LENGTHS, **TINY)
    request = hydraplan.PlanRequest(lengths=LENGTHS, num_gpus=8, options={"time_limit_s": 0.3})
    assert hydraplan.check(plan, request=request) == []
    other = request.model_copy(update={"lengths": [*LENGTHS[:-1], 129]})
    assert hydraplan.check(plan, request=other) == ["sequence 7: the plan has length 128, the request 129"]


def test_importing_hydraplan_loads_nothing_heavy() -> None:
    probe = "import sys, hydraplan; print([m for m in ('pydantic', 'numpy', 'highspy', 'ortools') if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
