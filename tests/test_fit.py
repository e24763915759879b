"""Fitting measured samples: exact recovery from synthetic data, robustness to noise, the profile."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hydraplan.cost_models.fit import (
    MEMORY_UNMETERED_MARGIN,
    build_profiled_profile,
    fit_collectives,
    fit_memory,
    fit_scheme,
    fit_stage,
    growth_floor,
    memory_features,
    relative_nnls,
)
from hydraplan.cost_models.profile_io import load_profile, save_profile
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.measurements import CollectiveSample, ProfileProvenance, StageSample
from hydraplan.planner.schemas import PlanRequest, SolverOptions
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.solve import solve

A, B, C, PHI = 3e-9, 2e-5, 4e-3, 0.31
M0, M1, M2 = 1e5, 6e4, 2.0
MIXES = {
    "long": [[256], [512], [1024], [1536]],
    "short": [[64] * 4, [32] * 32, [128] * 12, [16] * 20],
    "mixed": [[512, 64, 64], [1024, 32, 16, 128], [300, 200, 100]],
}


def synthetic_samples(scheme=(1, 1, 1), stage=0, noise=0.0, seed=0, a=A, b=B, c=C) -> list[StageSample]:
    rng = np.random.default_rng(seed)
    samples = []
    for mix, batches in MIXES.items():
        for lengths in batches:
            tokens, squares = sum(lengths), sum(x * x for x in lengths)
            time_s = (a * squares + b * tokens + c) * (1 + noise * rng.standard_normal())
            memory = (M0 + M1 * tokens + M2 * squares) * (1 + noise * rng.standard_normal())
            samples.append(
                StageSample(
                    tp=scheme[0],
                    pp=scheme[1],
                    cp=scheme[2],
                    stage=stage,
                    lengths=lengths,
                    mix=mix,
                    time_s=time_s,
                    fwd_s=PHI * time_s,
                    activation_bytes=memory,
                    static_bytes=5e6,
                    repeats=3,
                )
            )
    return samples


def test_fitting_recovers_known_coefficients_exactly() -> None:
    fit = fit_stage(synthetic_samples())
    assert (fit.a, fit.b, fit.c) == pytest.approx((A, B, C), rel=1e-9)
    assert fit.fwd_fraction == pytest.approx(PHI, rel=1e-12)
    assert fit.activation_bytes_per_token == pytest.approx(M1, rel=1e-9)
    assert fit.activation_bytes_per_token_sq == pytest.approx(M2, rel=1e-7)
    assert fit.static_bytes == pytest.approx(5e6 + M0, rel=1e-7)
    assert max(map(abs, fit.time_residuals)) < 1e-9
    assert max(map(abs, fit.memory_residuals)) < 1e-7


def test_fitting_is_robust_to_five_percent_noise() -> None:
    errors = []
    for seed in range(5):
        fit = fit_stage(synthetic_samples(noise=0.05, seed=seed))
        predicted = [fit.stage_time_s(lengths) for batches in MIXES.values() for lengths in batches]
        true = [
            A * sum(x * x for x in lengths) + B * sum(lengths) + C for batches in MIXES.values() for lengths in batches
        ]
        errors.extend(abs(p - t) / t for p, t in zip(predicted, true))
        assert abs(fit.fwd_fraction - PHI) < 0.02
    # the fitted model is closer to the truth than the 5% noise on each sample
    assert np.median(errors) < 0.03 and max(errors) < 0.1


def test_a_micro_batch_out_of_memory_bounds_the_capacity() -> None:
    samples = synthetic_samples()
    samples.append(StageSample(tp=1, pp=1, cp=1, lengths=[4000], oom=True))
    cost, fit = fit_scheme(samples, usable_bytes=1e12)
    assert cost.capacity_tokens == 3999 and fit.capacity_from_oom_tokens == 4000
    cost, _ = fit_scheme(synthetic_samples(), usable_bytes=5e6 + M0 + M1 * 1000 + M2 * 1000**2)
    assert cost.capacity_tokens == 1000


def test_too_few_samples_are_refused_with_the_scheme_named() -> None:
    with pytest.raises(ValueError, match=r"scheme <2,1,1> stage 0: 2 timed micro-batches"):
        fit_stage(synthetic_samples(scheme=(2, 1, 1))[:2])


def test_pipeline_stages_combine_into_an_upper_bound() -> None:
    stage0 = synthetic_samples(scheme=(1, 2, 1), stage=0, b=B / 2)
    stage1 = synthetic_samples(scheme=(1, 2, 1), stage=1, c=2 * C)
    cost, fit = fit_scheme(stage0 + stage1, usable_bytes=1e12)
    assert (cost.a, cost.b, cost.c) == pytest.approx((A, B, 2 * C), rel=1e-8)
    assert cost.in_flight_micro_batches == 2 and fit.num_samples == len(stage0) * 2


def test_collectives_fit_latency_and_bandwidth() -> None:
    samples = [
        CollectiveSample(op="all_reduce", ranks=2, bytes=size, seconds=5e-5 + size / 2e9) for size in (1e3, 1e5, 1e7)
    ]
    fit = fit_collectives(samples)[("all_reduce", 2)]
    assert fit.latency_s == pytest.approx(5e-5, rel=1e-9)
    assert fit.bandwidth_bytes_per_s == pytest.approx(2e9, rel=1e-9)


def _provenance() -> ProfileProvenance:
    samples = synthetic_samples((1, 1, 1)) + synthetic_samples((2, 1, 1), a=A / 2, b=B / 2)
    return ProfileProvenance(device="cpu", hardware="test", torch_version="x", dtype="float32", samples=samples)


def test_a_profiled_profile_round_trips_through_the_file_and_plans(tmp_path: Path) -> None:
    profile = build_profiled_profile(
        _provenance(), model="tiny", device_name="cpu", num_layers=4, memory_bytes=8e9, memory_reserve_bytes=1e9
    )
    assert profile.source == "profiled" and len(profile.provenance.fits) == 2
    assert "sequences measured up to 1,536 tokens" in profile.notes and "real peaks" not in profile.notes
    holds = max(entry.capacity_tokens for entry in profile.schemes)
    assert holds > 1536 and f"lengths from 1,537 to {holds:,} are extrapolated" in profile.notes
    path = tmp_path / "p.json"
    save_profile(profile, path)
    loaded = load_profile(path)
    assert loaded == profile
    assert loaded.provenance.samples[0].lengths == [256]
    cost_model = ProfileCostModel(loaded)
    assert cost_model.stage_time_s(ParallelScheme(1, 1, 1), [256]) == pytest.approx(A * 256**2 + B * 256 + C)
    request = PlanRequest(lengths=[700, 300, 64, 64, 900, 1200], num_gpus=2, options=SolverOptions(time_limit_s=0.3))
    plan = solve(request, loaded)
    assert plan.num_gpus == 2 and sorted(plan.input_lengths) == [64, 64, 300, 700, 900, 1200]


def test_old_profile_files_keep_loading(tmp_path: Path) -> None:
    """A profile written before provenance and 'calibrated' existed (the PR-10 format)."""
    old = {
        "schema_version": "hydraplan.profile/1",
        "source": "profiled",
        "model": "tiny",
        "gpu": None,
        "time_unit": "s",
        "num_layers": 4,
        "gpu_memory_bytes": 8e9,
        "memory_reserve_bytes": 0.0,
        "grad_sync_s": None,
        "grad_sync_bandwidth_bytes_per_s": None,
        "schemes": [{"tp": 1, "pp": 1, "cp": 1, "a": 1e-9, "b": 1e-5, "c": 1e-3, "capacity_tokens": 4096}],
        "notes": "",
    }
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    profile = load_profile(path)
    assert profile.provenance is None and profile.schemes[0].capacity_tokens == 4096


def test_the_bundled_cpu_profile_is_measured_and_plans() -> None:
    from hydraplan.cost_models.profile_io import bundled_profile

    profile = bundled_profile("tiny-cpu")
    assert profile.source == "profiled" and profile.model == "tiny" and profile.provenance.device == "cpu"
    assert {entry.key for entry in profile.schemes} >= {(1, 1, 1), (2, 1, 1), (1, 1, 2), (1, 2, 1)}
    assert all(fit.num_samples >= 3 for fit in profile.provenance.fits)
    request = PlanRequest(lengths=[512, 256, 128, 64, 700, 300], num_gpus=2, options=SolverOptions(time_limit_s=0.3))
    assert solve(request, profile).num_gpus == 2


def test_without_a_memory_figure_the_largest_measured_batch_is_the_capacity() -> None:
    cost, _ = fit_scheme(synthetic_samples(), usable_bytes=None)
    assert cost.capacity_tokens == 1536


def with_real_peaks(samples: list[StageSample], noise: float = 0.08, seed: int = 1) -> list[StageSample]:
    """Each sample with a real peak 1.5x its saved bytes, give or take `noise` (uniform)."""
    rng = np.random.default_rng(seed)
    return [
        s.model_copy(update={"peak_bytes": 1.5 * s.activation_bytes * (1 + noise * rng.uniform(-1, 1))})
        for s in samples
    ]


def test_memory_is_fitted_to_the_real_peak_and_never_under_predicts_a_fitted_batch() -> None:
    samples = with_real_peaks(synthetic_samples())
    memory = fit_memory(samples)
    assert memory.fitted_to == "real_peak" and memory.margin == MEMORY_UNMETERED_MARGIN and memory.envelope >= 1
    for sample, residual in zip(samples, memory.residuals, strict=True):
        assert residual == pytest.approx((memory.bytes(sample.lengths) - sample.peak_bytes) / sample.peak_bytes)
        assert residual >= MEMORY_UNMETERED_MARGIN - 1e-9  # the envelope, then the stated margin
    # the tightest upper fit: some fitted micro-batch is met exactly (then the margin), and the total
    # over-prediction is no more than that of the least-squares fit scaled over every batch and over
    # the growth floor (the older promise, with the same floor)
    assert min(memory.residuals) == pytest.approx(MEMORY_UNMETERED_MARGIN, abs=1e-6)
    features = np.array([memory_features(s.lengths) for s in samples])
    peaks = np.array([s.peak_bytes for s in samples])
    least_squares = np.array(relative_nnls(features, peaks).coefficients)
    floor_features, floor_values = growth_floor(samples, list(peaks))
    scaled = features @ least_squares
    lift = max(float(np.max(peaks / scaled)), float(np.max(floor_values / (floor_features @ least_squares))))
    scaled *= lift * (1 + MEMORY_UNMETERED_MARGIN)
    assert sum(memory.residuals) <= float(np.sum((scaled - peaks) / peaks)) + 1e-9
    # the saved bytes alone (what older profiles were fitted to) would promise a third too little
    saved = fit_memory([s.model_copy(update={"peak_bytes": None}) for s in samples])
    assert saved.fitted_to == "saved_tensors" and saved.margin == 0 and saved.envelope == 1
    worst = min((saved.bytes(s.lengths) - s.peak_bytes) / s.peak_bytes for s in samples)
    assert worst < -0.25


def test_the_stage_fit_records_its_memory_promise_and_measured_range() -> None:
    samples = with_real_peaks(synthetic_samples())
    fit = fit_stage(samples)
    memory = fit_memory(samples)
    assert fit.memory_residuals == memory.residuals and fit.memory_fitted_to == "real_peak"
    m0, m1, m2, m3, m4 = memory.coefficients
    assert (fit.activation_bytes_per_token, fit.activation_bytes_per_token_sq) == (m1, m2)
    assert (fit.activation_bytes_per_longest_sq, fit.activation_bytes_per_longest_pow) == (m3, m4)
    assert fit.static_bytes == pytest.approx(5e6 + m0)
    cost, scheme_fit = fit_scheme(samples, usable_bytes=1e12)
    assert scheme_fit.memory_fitted_to == "real_peak" and scheme_fit.memory_margin == MEMORY_UNMETERED_MARGIN
    assert scheme_fit.memory_envelope == fit.memory_envelope
    assert (scheme_fit.max_measured_tokens, scheme_fit.max_measured_length) == (1536, 1536)
    # the capacity keeps the promise: the fitted peak of the capacity fits in the usable bytes
    usable = 5e6 + m0 + 30 * memory.bytes([1024])
    cost, _ = fit_scheme(samples, usable_bytes=usable)
    assert (
        cost.static_bytes
        + cost.activation_bytes_per_token * cost.capacity_tokens
        + (cost.activation_bytes_per_token_sq + cost.activation_bytes_per_longest_sq) * cost.capacity_tokens**2
        + cost.activation_bytes_per_longest_pow * cost.capacity_tokens**2.5
        <= usable
    )


def test_a_negative_memory_margin_is_refused_by_value() -> None:
    with pytest.raises(ValueError, match=r"memory margin -0.1"):
        fit_memory(with_real_peaks(synthetic_samples()), margin=-0.1)
