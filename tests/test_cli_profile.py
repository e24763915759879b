"""`hydraplan profile --device` and `--calibrate`: bad input is one line and exit 2, a calibrated
profile plans, and (marker runtime) a real CPU measurement of seconds gives a usable profile."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from test_calibrate import MODEL, TRUE, WIDE, _provenance, _samples
from test_cli import assert_one_line_error, run, write

from hydraplan.cost_models.fit import MEMORY_SAFETY_MARGIN
from hydraplan.cost_models.profile_io import load_profile, save_profile
from hydraplan.planner.schemas import CostProfile, SchemeCost


@pytest.fixture
def fake_runtime(monkeypatch: pytest.MonkeyPatch):
    """A stand-in for `hydraplan.runtime.profiler` (no torch needed) with `count` CUDA devices."""
    module = types.SimpleNamespace(
        cuda_device_count=lambda: module.count, count=0, device_memory_bytes=lambda device: 16 * 2.0**30
    )
    monkeypatch.setitem(__import__("sys").modules, "hydraplan.runtime.profiler", module)
    return module


def test_an_unknown_device_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "profile", "--device", "tpu", "--model", "tiny", "--out", "p.json")
    assert code == 2 and "argument --device: invalid choice: 'tpu'" in err


def test_cuda_without_cuda_is_refused(capsys: pytest.CaptureFixture[str], fake_runtime, tmp_path: Path) -> None:
    code, _, err = run(capsys, "profile", "--device", "cuda", "--model", "tiny", "--out", str(tmp_path / "p.json"))
    assert "--device cuda: no CUDA device is available" in assert_one_line_error(code, err)
    assert not (tmp_path / "p.json").exists()


def test_a_scheme_larger_than_the_local_ranks_is_named_with_the_advice(
    capsys: pytest.CaptureFixture[str], fake_runtime, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    argv = ["profile", "--device", "cpu", "--model", "tiny", "--out", str(tmp_path / "p.json")]
    code, _, err = run(capsys, *argv, "--schemes", "<1,1,1>", "<2,1,2>")
    message = assert_one_line_error(code, err)
    assert "<2,1,2> needs 4 local ranks, this machine has 2 (CPU cores)" in message and "--calibrate" in message
    code, _, err = run(capsys, *argv, "--schemes", "<1,3,1>")
    assert "pp 3 does not divide the 4 layers of tiny" in assert_one_line_error(code, err)
    code, _, err = run(capsys, *argv, "--schemes", "1;1")
    assert "--schemes: scheme '1;1' is not of the form <tp,pp,cp>" in assert_one_line_error(code, err)
    big = ["profile", "--device", "cpu", "--model", "llama3-70b", "--out", str(tmp_path / "p.json")]
    code, _, err = run(capsys, *big, "--schemes", "<1,1,1>")
    message = assert_one_line_error(code, err)
    assert "a stage of llama3-70b needs" in message and "of the device's 16.0 GiB" in message
    assert not (tmp_path / "p.json").exists()


def test_device_needs_an_output_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "profile", "--device", "cpu", "--model", "tiny")
    assert "--out FILE is required" in assert_one_line_error(code, err)


def _measured_file(tmp_path: Path, model: str = MODEL.name) -> Path:
    measured = CostProfile(
        source="profiled",
        model=model,
        num_layers=MODEL.num_layers,
        schemes=[SchemeCost(tp=1, pp=1, a=1e-9, b=1e-5, capacity_tokens=4096)],
        provenance=_provenance(_samples(TRUE, WIDE)),
    )
    path = tmp_path / "measured.json"
    save_profile(measured, path)
    return path


@pytest.fixture
def models_file(tmp_path: Path) -> str:
    return write(tmp_path, "models.json", json.dumps({"models": [MODEL.model_dump()]}))


def test_calibrate_writes_a_profile_for_a_big_cluster_that_plans(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, models_file: str
) -> None:
    out = tmp_path / "calibrated.json"
    flags = ["--model", MODEL.name, "--models-file", models_file, "--gpu", "h100-sxm-80gb", "--num-gpus", "512"]
    code, _, err = run(capsys, "profile", "--calibrate", str(_measured_file(tmp_path)), *flags, "--out", str(out))
    assert code == 0, err
    assert "wrote calibrated profile of" in err and "512 x h100-sxm-80gb" in err
    profile = load_profile(out)
    assert profile.source == "calibrated" and max(s.tp * s.pp * s.cp for s in profile.schemes) > 8
    code, out_text, err = run(
        capsys, "plan", "--profile", str(out), "--num-gpus", "512", "--num-tokens", "200000", "--time-limit-s", "0.5"
    )
    assert code == 0, err


def test_calibrate_refuses_foreign_malformed_and_unmeasured_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, models_file: str, tiny_plan_path: Path
) -> None:
    flags = ["--model", MODEL.name, "--models-file", models_file, "--num-gpus", "64"]
    broken = write(tmp_path, "broken.json", "{not json")
    code, _, err = run(capsys, "profile", "--calibrate", broken, *flags)
    assert "broken.json" in assert_one_line_error(code, err) and "not valid JSON" in err
    code, _, err = run(capsys, "profile", "--calibrate", str(tiny_plan_path), *flags)
    assert "is a plan, not a cost profile" in assert_one_line_error(code, err)
    analytic = tmp_path / "analytic.json"
    assert run(capsys, "profile", "--analytic", "--model", "tiny", "--num-gpus", "8", "--out", str(analytic))[0] == 0
    code, _, err = run(capsys, "profile", "--calibrate", str(analytic), *flags)
    assert "without measured samples (source 'analytic')" in assert_one_line_error(code, err)
    other = _measured_file(tmp_path, model="tiny")
    code, _, err = run(capsys, "profile", "--calibrate", str(other), *flags)
    assert "measured model 'tiny', but --model is 'calib-test'" in assert_one_line_error(code, err)
    code, _, err = run(capsys, "profile", "--calibrate", str(tmp_path / "missing.json"), *flags)
    assert "missing.json" in assert_one_line_error(code, err)


# ---------------------------------------------------------------------------------------------
# A real measurement (torch, CPU, seconds)
# ---------------------------------------------------------------------------------------------

MEASURE = ["--model", "tiny", "--schemes", "<1,1,1>", "--token-counts", "16", "32", "64", "--repeats", "1"]


@pytest.mark.runtime
def test_a_small_cpu_measurement_gives_a_profile_that_plans(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from tests.runtime_support import require_torch

    require_torch()
    out = tmp_path / "measured.json"
    code, _, err = run(capsys, "profile", "--device", "cpu", *MEASURE, "--out", str(out), "--no-progress")
    assert code == 0, err
    profile = load_profile(out)
    assert profile.source == "profiled" and [s.key for s in profile.schemes] == [(1, 1, 1)]
    provenance = profile.provenance
    assert provenance.device == "cpu" and provenance.torch_version and provenance.clock == "thread"
    # 3 token counts x 4 fit mixes, then one sequence of twice the largest count
    assert len(provenance.samples) == 13 and not provenance.interrupted
    assert provenance.samples[-1].lengths == [128] and provenance.samples[-1].mix == "long"
    assert all(s.time_s > 0 and s.activation_bytes > 0 for s in provenance.samples)
    # saved activations grow with the tokens: the fitted bytes per token are positive
    assert profile.schemes[0].activation_bytes_per_token > 0 and profile.schemes[0].b > 0
    fit = provenance.fits[0]
    assert fit.max_measured_length == max(max(s.lengths) for s in provenance.samples)
    assert f"sequences up to {fit.max_measured_length:,} tokens measured" in err
    if all(s.peak_bytes for s in provenance.samples):  # Linux: memory is fitted to the real peak
        # the margins: the stated 2% and the largest step noise of a fitted micro-batch, in bytes
        mine = [s for s in provenance.samples if s.key == (fit.tp, fit.pp, fit.cp) and s.peak_bytes]
        noise = max(s.peak_bytes - s.peak_median_bytes for s in mine)
        assert fit.memory_fitted_to == "real_peak" and fit.memory_margin == MEMORY_SAFETY_MARGIN
        assert fit.memory_noise_bytes == pytest.approx(noise)
        assert all(s.peak_median_bytes <= s.peak_bytes for s in provenance.samples)
        assert min(fit.memory_residuals) >= -1e-9 and f"real peak with a {fit.memory_margin:.0%} margin" in err
    code, _, err = run(
        capsys, "plan", "--profile", str(out), "--num-gpus", "1", "--num-tokens", "2000", "--time-limit-s", "0.3"
    )
    assert code == 0, err


@pytest.mark.runtime
def test_an_interrupted_measurement_leaves_a_valid_partial_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.runtime_support import require_torch

    require_torch()
    from hydraplan.api.cli import profile as cli_profile

    calls = []

    def interrupt_after_five(self, text: str) -> None:
        calls.append(text)
        if len(calls) == 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(cli_profile.ProfileProgress, "__call__", interrupt_after_five)
    out = tmp_path / "partial.json"
    code, _, err = run(capsys, "profile", "--device", "cpu", *MEASURE, "--out", str(out))
    assert code == 130 and "wrote partial" in err
    profile = load_profile(out)
    assert profile.provenance.interrupted and len(profile.provenance.samples) == 5
    assert [p.name for p in tmp_path.iterdir()] == ["partial.json"]  # no temporary file left
