"""Calibration: known hardware parameters are recovered from samples the analytic model generates
with them, defaults reproduce the uncalibrated model, and a calibrated profile covers big clusters."""

from __future__ import annotations

import math

import pytest

from hydraplan.cost_models.analytic import AnalyticOptions, build_profile
from hydraplan.cost_models.calibrate import calibrate, calibrated_profile, modelled_activation_bytes
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.cost_models.hardware import HardwareParams
from hydraplan.planner.measurements import CollectiveSample, ProfileProvenance, StageSample
from hydraplan.planner.schemas import CostProfile, ModelSpec, SchemeCost

MODEL = ModelSpec(
    name="calib-test",
    num_layers=8,
    hidden_size=512,
    ffn_hidden_size=1376,
    num_heads=8,
    num_kv_heads=4,
    vocab_size=2048,
)
GPU = get_gpu("h100-sxm-80gb")
OPTIONS = AnalyticOptions()
TRUE = HardwareParams(
    gemm_flops_per_s=4e10,
    attention_flops_per_s=1.5e10,
    intra_node_bandwidth_bytes_per_s=3e9,
    # not measured on one device: it stays at the default model's value (the catalog's NCCL bus share)
    inter_node_bandwidth_bytes_per_s=HardwareParams.from_specs(GPU, OPTIONS).inter_node_bandwidth_bytes_per_s,
    per_layer_overhead_s=2e-4,
    gemm_half_dim=48.0,
    attention_half_length_tokens=24.0,
    attention_half_heads=0.75,
    per_micro_batch_overhead_s=3e-3,
    memory_bound_bytes_per_s=6e9,
    unsplit_s_per_token_per_layer=3e-7,
    intra_node_latency_s=4e-5,
    activation_element_bytes=4.0,
    activation_memory_scale=1.3,
)
BATCHES = [[2048], [1024, 1024], [512] * 4, [128] * 16, [1500, 300, 200], [64] * 8, [900], [3000, 40]]


def _collectives(hardware: HardwareParams) -> list[CollectiveSample]:
    """2-rank ring all-reduces: each rank sends 2(n-1)/n = 1x the buffer over the link."""
    return [
        CollectiveSample(
            op="all_reduce",
            ranks=2,
            bytes=size,
            seconds=hardware.intra_node_latency_s + size / hardware.intra_node_bandwidth_bytes_per_s,
        )
        for size in (1_000, 100_000, 10_000_000)
    ]


def _samples(hardware: HardwareParams, schemes) -> list[StageSample]:
    """The last stage of each scheme, timed by the analytic model's own a, b, c at `hardware`."""
    profile = build_profile(MODEL, GPU, 64, 8, OPTIONS, hardware)
    entries = {entry.key: entry for entry in profile.schemes}
    samples = []
    for key in schemes:
        entry = entries[key]
        for lengths in BATCHES:
            sample = StageSample(tp=key[0], pp=key[1], cp=key[2], stage=key[1] - 1, lengths=lengths)
            time_s = entry.a * sample.sum_sq_tokens + entry.b * sample.num_tokens + entry.c
            memory = hardware.activation_memory_scale * modelled_activation_bytes(
                MODEL, sample, hardware.activation_element_bytes, OPTIONS
            )
            samples.append(sample.model_copy(update={"time_s": time_s, "activation_bytes": memory}))
    return samples


WIDE = [(1, 1, 1), (2, 1, 1), (4, 1, 1), (1, 2, 1), (2, 2, 1), (1, 4, 1), (1, 1, 2), (2, 1, 2), (1, 2, 2)]


def _provenance(samples) -> ProfileProvenance:
    return ProfileProvenance(device="cpu", dtype="float32", samples=samples, collectives=_collectives(TRUE))


def test_calibration_recovers_known_hardware_parameters() -> None:
    calibration = calibrate(MODEL, GPU, _provenance(_samples(TRUE, WIDE)), OPTIONS)
    assert set(calibration.fitted) == {
        "gemm",
        "unsplit",
        "attention",
        "per_layer",
        "per_micro_batch",
        "attention_short",
        "attention_heads",
        "gemm_shape",
        "memory_bound",
    }
    fitted = calibration.hardware
    for name, value in TRUE.as_dict().items():
        assert getattr(fitted, name) == pytest.approx(value, rel=1e-6), name
    assert max(map(abs, calibration.residuals)) < 1e-8
    assert calibration.error()["memory_median_abs_error"] < 1e-9


def test_calibration_from_two_schemes_keeps_what_it_cannot_tell_apart_at_the_defaults() -> None:
    samples = _samples(TRUE, [(1, 1, 1), (2, 1, 1)])
    calibration = calibrate(MODEL, GPU, _provenance(samples), OPTIONS)
    # every sample has the same layers: the per-micro-batch overhead is folded into the per-layer one
    assert "per_micro_batch" not in calibration.fitted and calibration.hardware.per_micro_batch_overhead_s == 0
    assert max(map(abs, calibration.residuals)) < 1e-6
    # the prediction of an unmeasured scheme is close but not exact (folded parameters)
    profile = build_profile(MODEL, GPU, 64, 8, OPTIONS, calibration.hardware)
    truth = {entry.key: entry for entry in build_profile(MODEL, GPU, 64, 8, OPTIONS, TRUE).schemes}
    for entry in profile.schemes:
        if entry.key == (1, 1, 2):
            expected = _time(truth[entry.key], [2048, 512])
            assert _time(entry, [2048, 512]) == pytest.approx(expected, rel=0.2)


def _time(entry: SchemeCost, lengths: list[int]) -> float:
    return entry.a * sum(x * x for x in lengths) + entry.b * sum(lengths) + entry.c


def test_default_hardware_parameters_reproduce_the_analytic_profile() -> None:
    for model_name, num_gpus in (("llama3-8b", 64), ("tiny", 8), ("llama3-70b", 1024)):
        model = get_model(model_name)
        plain = build_profile(model, GPU, num_gpus, 8)
        explicit = build_profile(model, GPU, num_gpus, 8, OPTIONS, HardwareParams.from_specs(GPU, OPTIONS))
        assert [entry.model_dump() for entry in explicit.schemes] == [entry.model_dump() for entry in plain.schemes]


def test_a_calibrated_profile_covers_schemes_far_larger_than_the_measured_ones() -> None:
    measured = CostProfile(
        source="profiled",
        model=MODEL.name,
        num_layers=MODEL.num_layers,
        schemes=[SchemeCost(tp=1, pp=1, a=1e-9, b=1e-5, capacity_tokens=4096)],
        provenance=_provenance(_samples(TRUE, WIDE)),
    )
    profile = calibrated_profile(MODEL, GPU, 1024, 8, measured, OPTIONS, measured_file="m.json")
    assert profile.source == "calibrated" and profile.provenance.measured_file == "m.json"
    assert max(entry.tp * entry.pp * entry.cp for entry in profile.schemes) >= 64
    truth = {entry.key: entry for entry in build_profile(MODEL, GPU, 1024, 8, OPTIONS, TRUE).schemes}
    for entry in profile.schemes:
        assert (entry.a, entry.b, entry.c) == pytest.approx(
            (truth[entry.key].a, truth[entry.key].b, truth[entry.key].c), rel=1e-5
        )
    assert profile.provenance.calibration["gemm_flops_per_s"] == pytest.approx(4e10, rel=1e-6)
    assert math.isfinite(profile.provenance.calibration_error["time_p95_abs_error"])


def test_calibrating_a_profile_without_samples_or_of_another_model_is_refused() -> None:
    bare = CostProfile(num_layers=8, schemes=[SchemeCost(tp=1, pp=1, a=1e-9, b=1e-5, capacity_tokens=4096)])
    with pytest.raises(ValueError, match="holds no measured samples"):
        calibrated_profile(MODEL, GPU, 64, 8, bare, OPTIONS)
    other = bare.model_copy(update={"model": "tiny", "provenance": _provenance(_samples(TRUE, WIDE))})
    with pytest.raises(ValueError, match="measurements are of model 'tiny', not 'calib-test'"):
        calibrated_profile(MODEL, GPU, 64, 8, other, OPTIONS)


def test_time_that_does_not_shrink_with_tp_is_kept_in_the_shape_terms() -> None:
    """On a small model TP shards may run no faster than the whole matrices (the CPU measurements
    show it): the fit then puts the time in the shape-dependent terms, and it must survive."""
    samples = []
    for key in [(1, 1, 1), (2, 1, 1)]:
        for lengths in BATCHES:
            tokens, squares = sum(lengths), sum(x * x for x in lengths)
            time_s = 2e-4 * tokens + 1e-8 * squares + 0.02  # the same for both TP degrees
            samples.append(StageSample(tp=key[0], pp=1, cp=1, lengths=lengths, time_s=time_s))
    provenance = ProfileProvenance(dtype="float32", clock="thread", samples=samples)
    calibration = calibrate(MODEL, GPU, provenance, OPTIONS)
    assert max(map(abs, calibration.residuals)) < 1e-3
    profile = {entry.key: entry for entry in build_profile(MODEL, GPU, 8, 8, OPTIONS, calibration.hardware).schemes}
    for key in [(1, 1, 1), (2, 1, 1)]:
        assert _time(profile[key], [1500, 300, 200]) == pytest.approx(2e-4 * 2000 + 1e-8 * 2_380_000 + 0.02, rel=1e-3)
