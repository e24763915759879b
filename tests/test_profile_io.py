"""Profile files: round trip, units, derived capacities and error messages."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from hydraplan.cost_models.analytic import build_profile
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.cost_models.profile_io import ProfileError, load_profile, save_profile
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.schemas import PROFILE_SCHEMA
from hydraplan.planner.scheme import ParallelScheme


def _user_profile() -> dict[str, Any]:
    """A hand-written profile in milliseconds with three schemes."""
    return {
        "time_unit": "ms",
        "num_layers": 32,
        "grad_sync_s": 40.0,
        "schemes": [
            {"tp": 8, "pp": 1, "cp": 1, "a": 2e-7, "b": 0.015, "c": 1.5, "capacity_tokens": 65536},
            {"tp": 4, "pp": 2, "cp": 1, "a": 3e-7, "b": 0.014, "c": 1.0, "capacity_tokens": 32768},
            {"tp": 8, "pp": 1, "cp": 2, "a": 1e-7, "b": 0.008, "c": 1.5, "capacity_tokens": 131072},
        ],
    }


def _write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_analytic_profile_round_trips(tmp_path: Path) -> None:
    profile = build_profile(get_model("llama3-8b"), get_gpu("h100-sxm-80gb"), 64, 8)
    path = tmp_path / "profile.json"
    save_profile(profile, path)
    loaded = load_profile(path)
    assert loaded == profile
    assert load_profile(str(path)) == profile
    assert json.loads(path.read_text())["schema_version"] == PROFILE_SCHEMA


def test_user_profile_in_milliseconds(tmp_path: Path) -> None:
    profile = load_profile(_write(tmp_path / "p.json", _user_profile()))
    assert profile.source == "user" and profile.schema_version == PROFILE_SCHEMA
    cost_model = ProfileCostModel(profile)
    scheme = ParallelScheme(4, 2, 1)
    expected_s = (3e-7 * (1000**2 + 2000**2) + 0.014 * 3000 + 1.0) * 1e-3
    assert cost_model.stage_time_s(scheme, [1000, 2000]) == pytest.approx(expected_s)
    assert cost_model.grad_sync_s([scheme] * 4) == pytest.approx(0.040)
    assert cost_model.capacity_tokens(ParallelScheme(8, 1, 2)) == 131072
    save_profile(profile, tmp_path / "again.json")
    assert load_profile(tmp_path / "again.json") == profile


def test_profile_from_a_dict_and_default_cp() -> None:
    data = _user_profile()
    del data["schemes"][0]["cp"]
    profile = load_profile(data)
    assert profile.schemes[0].cp == 1


def test_capacity_is_derived_from_memory_fields() -> None:
    data = _user_profile() | {"gpu_memory_bytes": 80e9, "memory_reserve_bytes": 4e9}
    derived = {"static_bytes": 20e9, "activation_bytes_per_token": 300_000.0}
    del data["schemes"][1]["capacity_tokens"]
    data["schemes"][1].update(derived)
    cost_model = ProfileCostModel(load_profile(data))
    expected = math.floor((80e9 - 4e9 - 20e9) / (2 * 300_000.0))  # pp=2 micro-batches in flight
    assert cost_model.capacity_tokens(ParallelScheme(4, 2, 1)) == expected


def _mutated(change) -> dict[str, Any]:
    data = copy.deepcopy(_user_profile())
    change(data)
    return data


MALFORMED = [
    (
        lambda d: d["schemes"][2].update(a=-1.0),
        "schemes[2].a: Input should be greater than or equal to 0",
    ),
    (lambda d: d.pop("num_layers"), "num_layers: Field required"),
    (lambda d: d.update(time_unit="us"), "time_unit: Input should be 's' or 'ms'"),
    (
        lambda d: d["schemes"][0].update(tp=0),
        "schemes[0].tp: Input should be greater than or equal to 1",
    ),
    (lambda d: d["schemes"][0].update(b="fast"), "schemes[0].b: Input should be a valid number"),
    (lambda d: d["schemes"][1].update(bogus=1), "schemes[1].bogus: Extra inputs are not permitted"),
    (lambda d: d.update(schemes=[]), "schemes: List should have at least 1 item"),
    (
        lambda d: d["schemes"][1].pop("capacity_tokens"),
        "schemes[1].capacity_tokens is missing and cannot be derived",
    ),
    (
        lambda d: d["schemes"][1].update(tp=8, pp=1, cp=1),
        "schemes[1]: duplicate scheme (8, 1, 1)",
    ),
    (
        lambda d: d["schemes"][0].update(fwd_fraction=1.5),
        "schemes[0].fwd_fraction: Input should be less than 1",
    ),
    (
        lambda d: d.update(schema_version="hydraplan.profile/2"),
        "schema_version: 'hydraplan.profile/2' is not supported",
    ),
]


@pytest.mark.parametrize(("change", "expected"), MALFORMED)
def test_malformed_profile_names_the_file_and_field(tmp_path: Path, change, expected) -> None:
    path = _write(tmp_path / "p.json", _mutated(change))
    with pytest.raises(ProfileError) as caught:
        load_profile(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert expected in message
    assert isinstance(caught.value, ValueError)


def test_exact_message_for_a_negative_coefficient(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.json", _mutated(lambda d: d["schemes"][2].update(a=-1.0)))
    with pytest.raises(ProfileError) as caught:
        load_profile(path)
    assert str(caught.value) == f"{path}: schemes[2].a: Input should be greater than or equal to 0"


def test_non_finite_coefficient_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_user_profile()).replace("0.015", "NaN"), encoding="utf-8")
    with pytest.raises(ProfileError, match=r"schemes\[0\]\.b: Input should be a finite number"):
        load_profile(path)


def test_invalid_json_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{\n  "time_unit": "s",\n    ,\n}', encoding="utf-8")
    with pytest.raises(ProfileError) as caught:
        load_profile(path)
    assert str(caught.value).startswith(f"{path}: not valid JSON: line 3 column 5")


def test_missing_file_and_wrong_top_level(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"nowhere\.json: no such file"):
        load_profile(tmp_path / "nowhere.json")
    with pytest.raises(ProfileError, match="top level must be a JSON object, got list"):
        load_profile(_write(tmp_path / "list.json", [1, 2]))


def test_dict_errors_are_named_too() -> None:
    with pytest.raises(ProfileError, match=r"^<profile>: num_layers: Field required$"):
        load_profile(_mutated(lambda d: d.pop("num_layers")))


def test_saving_is_atomic_and_keeps_a_new_files_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    profile = build_profile(get_model("tiny"), get_gpu("h100-sxm-80gb"), 8, 8)
    path = tmp_path / "p.json"
    save_profile(profile, path)
    assert path.stat().st_mode & 0o777 == 0o666 & ~_current_umask()

    def fail(*_args):
        raise KeyboardInterrupt  # Ctrl-C between writing and renaming

    monkeypatch.setattr("os.replace", fail)
    with pytest.raises(KeyboardInterrupt):
        save_profile(profile.model_copy(update={"notes": "new"}), path)
    assert load_profile(path) == profile  # the old file is intact
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]  # no temporary file left


def _current_umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask
