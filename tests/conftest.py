"""Shared test fixtures: a hand-written user cost profile, a lengths file, Hypothesis settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import settings

# Shared CI machines are slow and noisy: no per-example deadline (a timing flake is not a bug).
settings.register_profile("hydraplan", deadline=None)
settings.load_profile("hydraplan")


@pytest.fixture
def user_profile_data() -> dict:
    """A profile in the user format: times in ms, capacities given or derived from memory.

    Magnitudes are those of an 8B model on 80 GB GPUs: b ~ 6 * 8e9 FLOP/token at ~400 TFLOP/s.
    """
    return {
        "schema_version": "hydraplan.profile/1",
        "time_unit": "ms",
        "num_layers": 32,
        "grad_sync_s": 40.0,
        "gpu_memory_bytes": 80e9,
        "schemes": [
            {"tp": 1, "pp": 1, "cp": 1, "a": 2.0e-6, "b": 0.12, "c": 1.0, "capacity_tokens": 8192},
            {
                "tp": 2,
                "pp": 1,
                "cp": 1,
                "a": 1.1e-6,
                "b": 0.065,
                "c": 1.0,
                "capacity_tokens": 16384,
            },
            {
                "tp": 4,
                "pp": 2,
                "cp": 1,
                "a": 3.0e-7,
                "b": 0.018,
                "c": 1.0,
                "static_bytes": 20e9,
                "activation_bytes_per_token": 1e6,
            },
            {
                "tp": 8,
                "pp": 1,
                "cp": 2,
                "a": 1.4e-7,
                "b": 0.009,
                "c": 1.5,
                "capacity_tokens": 65536,
            },
        ],
    }


@pytest.fixture
def user_profile_path(tmp_path: Path, user_profile_data: dict) -> Path:
    """`user_profile_data` written to a JSON file."""
    path = tmp_path / "user_profile.json"
    path.write_text(json.dumps(user_profile_data, indent=2), encoding="utf-8")
    return path


@pytest.fixture
def lengths_path(tmp_path: Path) -> Path:
    """200 fixed lengths between 64 and 20,000 tokens, one per line."""
    lengths = [64 + (index * 7919) % 6000 for index in range(196)] + [12000, 15000, 18000, 20000]
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(str(length) for length in lengths) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def tiny_plan_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Path:
    """A plan file written by `hydraplan plan` on the tiny model (the CLI tests' reference plan)."""
    from test_cli import TINY, run

    path = tmp_path / "plan.json"
    code, _, err = run(capsys, "plan", *TINY, "--out", str(path))
    assert code == 0, err
    return path
