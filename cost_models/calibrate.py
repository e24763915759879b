"""Calibrate the analytic model's hardware parameters to measurements, then profile any cluster.

A measured profile (`hydraplan profile --device ...`, `source: "profiled"`) carries the raw stage
samples and collective timings of the schemes that fit the local devices. Calibration fits the
`HardwareParams` of `cost_models.hardware` to them, so that the analytic formulas, evaluated at
the fitted rates, reproduce the measurements; `analytic.build_profile` with those parameters then
writes a `source: "calibrated"` profile for every scheme of the target cluster, including schemes
far larger than the devices measured.

The stage time of a measured micro-batch is linear in the reciprocal rates and overheads:

    t = G / F_gemm + Gs * d0 / F_gemm + A / F_attn + Al * l0 / F_attn + Ah * h0 / F_attn
        + M / B_mem + U * unsplit + L * overhead_layer + overhead_micro_batch + communication

with the features (FLOPs per device `G`, the shape penalty `Gs`, attention FLOPs `A`, its short-
sequence and few-heads terms `Al` and `Ah`, memory-bound bytes `M`, the tokens times layers per
CP rank `U` for work TP does not split, the stage's layers `L`) taken
from the analytic formulas for that sample's scheme and stage, and the communication from the
collectives fitted first (`fit.fit_collectives`). The unknowns are found by non-negative least
squares on the relative error. A feature that the samples cannot tell apart from the ones before
it (e.g. the per-micro-batch overhead when every sample has the same layers) is left out and its
parameter keeps its uncalibrated value; which ones were fitted is recorded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.cost_models.analytic import AnalyticOptions, activation_coefficients, build_profile
from hydraplan.cost_models.analytic_time import (
    BF16_BYTES,
    HEAD_PASS_FACTOR,
    attention_flops_per_sq_token_per_device,
    comm_latency_s_per_micro_batch,
    cp_comm_s_per_token,
    gemm_shapes,
    linear_forward_flops_per_token,
    linear_pass_factor,
    lm_head_forward_flops_per_token,
    memory_bound_bytes_per_token,
    pp_comm_s_per_token,
    tp_comm_s_per_token,
)
from hydraplan.cost_models.fit import (
    abs_error_summary,
    element_bytes_of,
    fit_collectives,
    link_parameters,
    relative_nnls,
)
from hydraplan.cost_models.hardware import HardwareParams
from hydraplan.planner.measurements import ProfileProvenance, StageSample
from hydraplan.planner.schemas import CostProfile, GpuSpec, ModelSpec
from hydraplan.planner.scheme import ParallelScheme

__all__ = ["Calibration", "calibrate", "calibrated_profile", "element_bytes_of", "predict_stage_time_s"]

# Features in the order they are admitted: a later one is dropped when the samples cannot tell it
# from the earlier ones. Each maps to the parameter it determines.
FEATURES = (
    "gemm",
    "unsplit",
    "attention",
    "per_layer",
    "per_micro_batch",
    "attention_short",
    "attention_heads",
    "gemm_shape",
    "memory_bound",
)
# A feature is kept when more than this share of its (weighted) norm lies outside the span of the
# features kept before it.
INDEPENDENCE_TOLERANCE = 0.02
DEFAULT_OPTIONS = AnalyticOptions()


# ---------------------------------------------------------------------------------------------
# Features of one sample
# ---------------------------------------------------------------------------------------------


def _is_last(sample: StageSample) -> bool:
    return sample.stage == sample.pp - 1


def gemm_features(model: ModelSpec, scheme: ParallelScheme, last_stage: bool, recompute: str) -> tuple[float, float]:
    """(FLOPs, shape penalty FLOPs per unit d0) per token per device of one stage's GEMMs."""
    layers = model.num_layers // scheme.pp
    passes = linear_pass_factor(recompute)  # type: ignore[arg-type]
    flops = layers * linear_forward_flops_per_token(model) * passes
    penalty = layers * sum(f / d for f, d in gemm_shapes(model, scheme.tp)) * passes * scheme.tp
    if last_stage:
        head = lm_head_forward_flops_per_token(model) * HEAD_PASS_FACTOR
        flops += head
        penalty += head / min(model.hidden_size, model.vocab_size / scheme.tp)
    return flops / scheme.gpus_per_stage, penalty / scheme.gpus_per_stage


def sample_features(
    model: ModelSpec, sample: StageSample, options: AnalyticOptions, element_bytes: float
) -> dict[str, float]:
    """The feature values of one measured micro-batch (see the module docstring); memory-bound
    bytes at `element_bytes` per activation element."""
    scheme = ParallelScheme(sample.tp, sample.pp, sample.cp)
    tokens, sq_tokens = float(sample.num_tokens), float(sample.sum_sq_tokens)
    gemm, gemm_shape = gemm_features(model, scheme, _is_last(sample), options.recompute)
    attention = attention_flops_per_sq_token_per_device(model, scheme, options)
    return {
        "gemm": gemm * tokens,
        "gemm_shape": gemm_shape * tokens,
        "attention": attention * sq_tokens,
        "attention_short": attention * scheme.cp * tokens,
        "attention_heads": attention * sq_tokens / (model.num_heads / scheme.tp),
        "memory_bound": memory_bound_bytes_per_token(model, scheme, element_bytes) * tokens,
        "unsplit": float(model.num_layers // scheme.pp) / scheme.cp * tokens,
        "per_layer": float(model.num_layers // scheme.pp),
        "per_micro_batch": 1.0,
    }


def communication_s(model: ModelSpec, sample: StageSample, hardware: HardwareParams, gpu: GpuSpec) -> float:
    """TP, CP and PP communication time of one sample at `hardware`'s link figures (one node)."""
    scheme = ParallelScheme(sample.tp, sample.pp, sample.cp)
    nodes = scheme.num_gpus  # the measured ranks share one machine
    per_token = (
        tp_comm_s_per_token(model, gpu, scheme, hardware)
        + cp_comm_s_per_token(model, gpu, scheme, nodes, hardware)
        + pp_comm_s_per_token(model, gpu, scheme, nodes, hardware)
    )
    return per_token * sample.num_tokens + comm_latency_s_per_micro_batch(model, scheme, nodes, hardware)


def _base_coefficient(base: float, dependents: Sequence[float]) -> float:
    """The seconds per FLOP at full speed; when the fit put all the time in the shape-dependent
    terms (e.g. TP shards that run no faster than the whole matrix), a rate a billion times the
    shape terms' keeps their products (the half-points times 1/rate) exactly."""
    if base > 0 or not any(value > 0 for value in dependents):
        return base
    return max(dependents) * 1e-9


def _parameters_from(coefficients: dict[str, float], base: HardwareParams) -> HardwareParams:
    """Hardware parameters from fitted feature coefficients (seconds per unit feature)."""
    values: dict[str, float] = {}
    gemm = _base_coefficient(coefficients.get("gemm", 0.0), [coefficients.get("gemm_shape", 0.0)])
    attention = _base_coefficient(
        coefficients.get("attention", 0.0),
        [coefficients.get("attention_short", 0.0), coefficients.get("attention_heads", 0.0)],
    )
    if "gemm" in coefficients:  # fitted; 0 means the measured time has no such part
        values["gemm_flops_per_s"] = 1 / gemm if gemm > 0 else math.inf
        values["gemm_half_dim"] = coefficients.get("gemm_shape", 0.0) / gemm if gemm > 0 else 0.0
    if "attention" in coefficients:
        values["attention_flops_per_s"] = 1 / attention if attention > 0 else math.inf
        for name, parameter in (
            ("attention_short", "attention_half_length_tokens"),
            ("attention_heads", "attention_half_heads"),
        ):
            values[parameter] = coefficients.get(name, 0.0) / attention if attention > 0 else 0.0
    if "per_layer" in coefficients:
        values["per_layer_overhead_s"] = coefficients["per_layer"]
    if "per_micro_batch" in coefficients:
        values["per_micro_batch_overhead_s"] = coefficients["per_micro_batch"]
    values["unsplit_s_per_token_per_layer"] = coefficients.get("unsplit", 0.0)
    memory_bound = coefficients.get("memory_bound", 0.0)
    values["memory_bound_bytes_per_s"] = 1 / memory_bound if memory_bound > 0 else math.inf
    return base.with_values(**values)


# ---------------------------------------------------------------------------------------------
# Fitting
# ---------------------------------------------------------------------------------------------


def independent_features(rows: np.ndarray, names: Sequence[str]) -> list[int]:
    """Indices of the columns kept, in order: each adds a direction the kept ones do not span."""
    kept: list[int] = []
    for index in range(rows.shape[1]):
        column = rows[:, index]
        norm = np.linalg.norm(column)
        if norm == 0:
            continue
        if kept:
            basis = rows[:, kept]
            projection = basis @ np.linalg.lstsq(basis, column, rcond=None)[0]
            if np.linalg.norm(column - projection) <= INDEPENDENCE_TOLERANCE * norm:
                continue
        kept.append(index)
    return kept


@dataclass(frozen=True)
class Calibration:
    """Fitted hardware parameters, which features were fitted, and the relative residuals."""

    hardware: HardwareParams
    fitted: tuple[str, ...]
    residuals: tuple[float, ...]
    memory_residuals: tuple[float, ...]

    def error(self) -> dict[str, float]:
        time_median, time_p95 = abs_error_summary(self.residuals)
        memory_median, memory_p95 = abs_error_summary(self.memory_residuals)
        return {
            "time_median_abs_error": time_median,
            "time_p95_abs_error": time_p95,
            "memory_median_abs_error": memory_median,
            "memory_p95_abs_error": memory_p95,
        }


def calibrate(
    model: ModelSpec,
    gpu: GpuSpec,
    provenance: ProfileProvenance,
    options: AnalyticOptions = DEFAULT_OPTIONS,
    schemes: Sequence[tuple[int, int, int]] | None = None,
) -> Calibration:
    """Fit `HardwareParams` to the samples (of `schemes` only, when given) in `provenance`.

    Raises `ValueError` when fewer than three timed samples remain.
    """
    samples = [
        s
        for s in provenance.samples
        if not s.oom and s.time_s and (schemes is None or s.key in set(map(tuple, schemes)))
    ]
    if len(samples) < 3:
        raise ValueError(f"calibration needs at least 3 timed samples, the measurements hold {len(samples)}")
    element_bytes = element_bytes_of(provenance.dtype)
    base = HardwareParams.from_specs(gpu, options).with_values(activation_element_bytes=element_bytes)
    base = link_parameters(fit_collectives(provenance.collectives), base)
    measured = np.array([s.time_s for s in samples], dtype=float)
    features = np.array(
        [[sample_features(model, s, options, element_bytes)[name] for name in FEATURES] for s in samples]
    )
    # Thread-CPU-time samples hold the compute only (the thread sleeps while peers communicate).
    compute_only = provenance.clock == "thread"
    comm = np.array([0.0 if compute_only else communication_s(model, s, base, gpu) for s in samples])
    scaled = features / measured[:, None]
    kept = independent_features(scaled / np.linalg.norm(scaled, axis=0).clip(min=1e-300), FEATURES)
    fit = relative_nnls(features[:, kept], np.maximum(measured - comm, 0.0))
    coefficients = {FEATURES[index]: value for index, value in zip(kept, fit.coefficients)}
    hardware = _parameters_from(coefficients, base)
    scale, memory_residuals = _activation_scale(model, samples, hardware, options)
    hardware = hardware.with_values(activation_memory_scale=scale)
    residuals = tuple(
        (predict_stage_time_s(model, gpu, s, hardware, options, not compute_only) - s.time_s) / s.time_s
        for s in samples
    )
    return Calibration(hardware, tuple(FEATURES[index] for index in kept), residuals, memory_residuals)


def predict_stage_time_s(
    model: ModelSpec,
    gpu: GpuSpec,
    sample: StageSample,
    hardware: HardwareParams,
    options: AnalyticOptions,
    include_communication: bool = True,
) -> float:
    """The calibrated model's time for the micro-batch, scheme and stage of `sample` (its compute
    alone with `include_communication=False`, as thread CPU time measures it)."""
    values = sample_features(model, sample, options, hardware.activation_element_bytes)
    coefficients = {
        "gemm": 1 / hardware.gemm_flops_per_s,
        "gemm_shape": hardware.gemm_half_dim / hardware.gemm_flops_per_s,
        "attention": 1 / hardware.attention_flops_per_s,
        "attention_short": hardware.attention_half_length_tokens / hardware.attention_flops_per_s,
        "attention_heads": hardware.attention_half_heads / hardware.attention_flops_per_s,
        "memory_bound": 1 / hardware.memory_bound_bytes_per_s,
        "unsplit": hardware.unsplit_s_per_token_per_layer,
        "per_layer": hardware.per_layer_overhead_s,
        "per_micro_batch": hardware.per_micro_batch_overhead_s,
    }
    compute = sum(values[name] * coefficients[name] for name in FEATURES)
    return compute + (communication_s(model, sample, hardware, gpu) if include_communication else 0.0)


def modelled_activation_bytes(
    model: ModelSpec, sample: StageSample, element_bytes: float, options: AnalyticOptions
) -> float:
    """Korthikanti's stored activations of the sample's stage per device, at `element_bytes`."""
    per_token, per_sq = activation_coefficients(
        model, sample.tp, True, options.recompute, options.flash_attention, dropout=False
    )
    layers = model.num_layers // sample.pp
    scale = element_bytes / BF16_BYTES / sample.cp * layers
    return scale * (per_token * sample.num_tokens + per_sq * sample.sum_sq_tokens)


def _activation_scale(
    model: ModelSpec, samples: Sequence[StageSample], hardware: HardwareParams, options: AnalyticOptions
) -> tuple[float, tuple[float, ...]]:
    """Measured over modelled activation bytes (the median ratio), and the relative residuals."""
    pairs = [
        (s.activation_bytes, modelled_activation_bytes(model, s, hardware.activation_element_bytes, options))
        for s in samples
        if s.activation_bytes
    ]
    if not pairs:
        return 1.0, ()
    scale = float(np.median([measured / modelled for measured, modelled in pairs]))
    return scale, tuple((scale * modelled - measured) / measured for measured, modelled in pairs)


# ---------------------------------------------------------------------------------------------
# The calibrated profile
# ---------------------------------------------------------------------------------------------


def calibrated_profile(
    model: ModelSpec,
    gpu: GpuSpec,
    num_gpus: int,
    gpus_per_node: int,
    measured: CostProfile,
    options: AnalyticOptions = DEFAULT_OPTIONS,
    measured_file: str = "",
) -> CostProfile:
    """The `source: "calibrated"` profile of every scheme of `num_gpus` x `gpu`.

    Raises `ValueError` when `measured` carries no samples (not a measured profile) or is for
    another model.
    """
    provenance = measured.provenance
    if provenance is None or not provenance.samples:
        raise ValueError("the profile holds no measured samples (write one with `hydraplan profile --device`)")
    if measured.model is not None and measured.model != model.name:
        raise ValueError(f"the measurements are of model {measured.model!r}, not {model.name!r}")
    calibration = calibrate(model, gpu, provenance, options)
    profile = build_profile(model, gpu, num_gpus, gpus_per_node, options, calibration.hardware)
    error = calibration.error()
    notes = (
        f"calibrated to {len(calibration.residuals)} measured micro-batches of "
        f"{', '.join(sorted({f'<{s.tp},{s.pp},{s.cp}>' for s in provenance.samples}))} "
        f"({provenance.hardware or provenance.device}); fitted: {', '.join(calibration.fitted)}; "
        f"fit error median {error['time_median_abs_error']:.1%}, p95 {error['time_p95_abs_error']:.1%}. "
        + profile.notes
    )
    return profile.model_copy(
        update={
            "source": "calibrated",
            "notes": notes,
            "provenance": provenance.model_copy(
                update={
                    "calibration": calibration.hardware.as_dict(),
                    "calibration_error": error,
                    "measured_file": measured_file,
                    "fits": [],
                }
            ),
        }
    )
