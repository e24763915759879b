"""Fit the cost model's coefficients to measured samples and build a `profiled` CostProfile.

Per measured scheme (and PP stage), from the profiler's `StageSample`s:

- stage time `t = a * sum(l^2) + b * sum(l) + c` by non-negative least squares on the *relative*
  error (every row divided by its measured time, so a 2 ms and a 2 s micro-batch weigh the same:
  the planner cares about ratios between pipelines);
- the forward fraction `phi` with `phi * t ~ t_fwd`, also on relative error;
- the memory model `activation = m0 + m1 * sum(l) + m2 * sum(l^2) + m3 * max(l)^2 + m4 *
  max(l)^2.5`; `m0`, bytes that do not grow with the batch, is added to the measured static bytes.
  It is fitted to the real peak each micro-batch adds (`StageSample.peak_bytes`: allocator or
  process peak) where measured, else (older profiles) to the saved-activation bytes by
  relative-error NNLS without `m3` and `m4`. A real-peak fit is a promise: the tightest
  non-negative upper fit (a linear programme: the least total relative over-prediction with no
  fitted micro-batch under-predicted) to each micro-batch's median step peak (`peak_median_bytes`;
  older samples: its largest, `peak_bytes`), then margins for the step-to-step noise and for shapes
  it did not see. Where several steps were metered: `MEMORY_SAFETY_MARGIN` (2%) of the fit, plus
  the step noise in bytes, the largest excess of a fitted micro-batch's largest step peak over its
  median (`memory_noise_bytes`: the heap's step-to-step scatter is bytes, not a share of the peak,
  so a small micro-batch's scatter does not inflate a large one's promise); where one step was,
  `MEMORY_UNMETERED_MARGIN` (5%). So every fitted micro-batch's largest peak is covered, and a new
  one is under-predicted only where its steps scatter more than every fitted one's or its median
  is above the fitted trend by more than the margin. The envelope left after the upper fit (1
  unless the solver's tolerance leaves a row under) and the margins are recorded
  (`memory_envelope`, `memory_margin`, `memory_noise_bytes`) and its residuals are against the
  largest real peak. `m3` is there because part of a step's peak (the backward's attention
  temporaries, freed one sequence at a time) grows with the longest sequence only
  (benchmarks/results/memory_peak.md, "Where the median error comes from"); `m4` because one long
  sequence's peak grows faster than its square on CPU (`LONGEST_POWER`; the same file, set 8);
- collectives `seconds = latency + bytes / bandwidth` per (operation, ranks).

Each fit keeps its residuals `(predicted - measured) / measured`. Numpy/scipy only: no torch here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog, nnls

from hydraplan.cost_models.analytic import ring_all_reduce_factor, stage_params
from hydraplan.cost_models.analytic_time import (
    comm_latency_s_per_micro_batch,
    cp_comm_s_per_token,
    pp_comm_s_per_token,
    tp_comm_s_per_token,
)
from hydraplan.cost_models.hardware import HardwareParams
from hydraplan.planner.measurements import CollectiveSample, ProfileProvenance, SchemeFit, StageSample
from hydraplan.planner.schemas import LONGEST_POWER, CostProfile, GpuSpec, ModelSpec, SchemeCost, most_tokens
from hydraplan.planner.scheme import ParallelScheme

__all__ = [
    "CollectiveFit",
    "LinearFit",
    "MEMORY_SAFETY_MARGIN",
    "MEMORY_UNMETERED_MARGIN",
    "GROWTH_FLOOR_AT",
    "growth_floor",
    "memory_noise_bytes",
    "MemoryFit",
    "StageFit",
    "abs_error_summary",
    "build_profiled_profile",
    "fit_collectives",
    "fit_memory",
    "fit_scheme",
    "fit_stage",
    "grad_bytes_per_gpu",
    "upper_fit",
]

MIN_TIME_SAMPLES = 3  # a, b and c need three independent micro-batches
# Safety margin of a real-peak memory fit on top of the upper envelope of the fitted micro-batches,
# for shapes between and beyond them, where the step noise was metered (its bytes are added too,
# `memory_noise_bytes`); benchmarks/memory_peak.py checks it held out (set 8).
MEMORY_SAFETY_MARGIN = 0.02
# The margin where one step per micro-batch was metered (no step noise known): the rule of sets 5-7.
MEMORY_UNMETERED_MARGIN = 0.05
# Multiples of the longest measured single sequence where a real-peak fit must stay above the
# quadratic through the three longest measured ones (`growth_floor`; held-out set 9).
GROWTH_FLOOR_AT = (2, 8)


@dataclass(frozen=True)
class LinearFit:
    """Non-negative coefficients of a linear model and the relative residual of every sample."""

    coefficients: tuple[float, ...]
    residuals: tuple[float, ...]


def relative_nnls(features: np.ndarray, measured: np.ndarray) -> LinearFit:
    """min ||(features @ x - measured) / measured|| over x >= 0 (rows with measured <= 0 dropped).

    Columns are scaled to unit norm before solving so that coefficients of very different
    magnitudes (s per token^2 next to s per micro-batch) are found to full precision.
    """
    keep = measured > 0
    rows = features[keep] / measured[keep, None]
    scale = np.linalg.norm(rows, axis=0)
    scale[scale == 0] = 1.0
    solution, _ = nnls(rows / scale, np.ones(int(keep.sum())), maxiter=50 * features.shape[1])
    coefficients = solution / scale
    predicted = features @ coefficients
    residuals = np.where(measured > 0, (predicted - measured) / np.where(measured > 0, measured, 1), 0.0)
    return LinearFit(tuple(float(x) for x in coefficients), tuple(float(r) for r in residuals))


def upper_fit(
    features: np.ndarray, measured: np.ndarray, floors: tuple[np.ndarray, np.ndarray] | None = None
) -> tuple[float, ...] | None:
    """The tightest non-negative upper fit: x >= 0 minimising sum(features @ x / measured) subject
    to features @ x >= measured on every row (rows with measured <= 0 dropped), and to
    floor_features @ x >= floor_values for `floors` (rows that constrain and do not count in the
    objective); None when the solver finds none. Columns are scaled to unit norm first, as in
    `relative_nnls`."""
    keep = measured > 0
    rows = features[keep] / measured[keep, None]
    if not len(rows):
        return None
    scale = np.linalg.norm(rows, axis=0)
    scale[scale == 0] = 1.0
    rows = rows / scale
    bounds = rows
    if floors is not None and len(floors[1]):
        floor_features, floor_values = floors
        bounds = np.vstack([rows, floor_features / floor_values[:, None] / scale])
    result = linprog(rows.sum(axis=0), A_ub=-bounds, b_ub=-np.ones(len(bounds)), bounds=(0, None), method="highs")
    if result.status != 0:
        return None
    return tuple(float(x) for x in result.x / scale)


def abs_error_summary(residuals: Sequence[float]) -> tuple[float, float]:
    """(median, p95) of |residual|; (0, 0) when there is none."""
    if not residuals:
        return 0.0, 0.0
    values = np.abs(np.asarray(residuals, dtype=float))
    return float(np.median(values)), float(np.percentile(values, 95))


@dataclass(frozen=True)
class StageFit:
    """Fitted time, forward fraction and memory of one PP stage of one scheme."""

    scheme: tuple[int, int, int]
    stage: int
    a: float
    b: float
    c: float
    fwd_fraction: float
    static_bytes: float
    activation_bytes_per_token: float
    activation_bytes_per_token_sq: float
    time_residuals: tuple[float, ...]
    memory_residuals: tuple[float, ...]
    num_samples: int
    oom_tokens: int | None
    memory_fitted_to: str = ""  # "real_peak", "saved_tensors" or "" (no memory measured)
    memory_envelope: float = 1.0  # scale that lifts the fit over every fitted micro-batch
    memory_margin: float = 0.0  # stated margin on top of the envelope
    memory_noise_bytes: float = 0.0  # step noise added, bytes (in static_bytes through m0)
    max_measured_tokens: int = 0  # largest timed micro-batch, tokens
    max_measured_length: int = 0  # longest single sequence timed
    activation_bytes_per_longest_sq: float = 0.0  # m3, bytes per squared longest length
    activation_bytes_per_longest_pow: float = 0.0  # m4, bytes per longest length^LONGEST_POWER

    def stage_time_s(self, lengths: Sequence[int]) -> float:
        return self.a * sum(x * x for x in lengths) + self.b * sum(lengths) + self.c

    def activation_bytes(self, lengths: Sequence[int]) -> float:
        return (
            self.activation_bytes_per_token * sum(lengths)
            + self.activation_bytes_per_token_sq * sum(x * x for x in lengths)
            + self.activation_bytes_per_longest_sq * max(lengths, default=0) ** 2
            + self.activation_bytes_per_longest_pow * max(lengths, default=0) ** LONGEST_POWER
        )


def _time_features(samples: Sequence[StageSample]) -> np.ndarray:
    return np.array([[s.sum_sq_tokens, s.num_tokens, 1.0] for s in samples], dtype=float)


def fit_forward_fraction(samples: Sequence[StageSample]) -> float:
    """phi minimising sum(((phi * t - f) / f)^2): sum(t/f) / sum((t/f)^2); 1/3 without data."""
    ratios = [s.time_s / s.fwd_s for s in samples if s.time_s and s.fwd_s]
    if not ratios:
        return 1 / 3
    phi = sum(ratios) / sum(r * r for r in ratios)
    return min(max(phi, 0.01), 0.99)


def fit_stage(samples: Sequence[StageSample], memory_margin: float | None = None) -> StageFit:
    """Fit one (scheme, stage) from its samples; out-of-memory samples only bound the capacity.

    Raises `ValueError` with fewer than three timed samples or fewer than three distinct
    (tokens, squared tokens) points.
    """
    first = samples[0]
    timed = [s for s in samples if not s.oom and s.time_s is not None]
    where = f"scheme <{first.tp},{first.pp},{first.cp}> stage {first.stage}"
    if len({(s.num_tokens, s.sum_sq_tokens) for s in timed}) < MIN_TIME_SAMPLES:
        raise ValueError(f"{where}: {len(timed)} timed micro-batches, at least {MIN_TIME_SAMPLES} distinct needed")
    time_fit = relative_nnls(_time_features(timed), np.array([s.time_s for s in timed], dtype=float))
    a, b, c = time_fit.coefficients
    memory = fit_memory(timed, memory_margin)
    m0, m1, m2, m3, m4 = memory.coefficients
    statics = [s.static_bytes for s in samples if s.static_bytes is not None]
    ooms = [s.num_tokens for s in samples if s.oom]
    return StageFit(
        scheme=first.key,
        stage=first.stage,
        a=a,
        b=b,
        c=c,
        fwd_fraction=fit_forward_fraction(timed),
        static_bytes=(max(statics) if statics else 0.0) + m0,
        activation_bytes_per_token=m1,
        activation_bytes_per_token_sq=m2,
        activation_bytes_per_longest_sq=m3,
        activation_bytes_per_longest_pow=m4,
        time_residuals=time_fit.residuals,
        memory_residuals=memory.residuals,
        num_samples=len(timed),
        oom_tokens=min(ooms) if ooms else None,
        memory_fitted_to=memory.fitted_to,
        memory_envelope=memory.envelope,
        memory_margin=memory.margin,
        memory_noise_bytes=memory.noise_bytes,
        max_measured_tokens=max(s.num_tokens for s in timed),
        max_measured_length=max(max(s.lengths) for s in timed),
    )


@dataclass(frozen=True)
class MemoryFit:
    """`m0 + m1 * sum(l) + m2 * sum(l^2) + m3 * max(l)^2 + m4 * max(l)^2.5` bytes a micro-batch adds,
    margins included."""

    coefficients: tuple[float, float, float, float, float]
    residuals: tuple[float, ...]  # (predicted - measured) / measured, against what was fitted
    fitted_to: str
    envelope: float = 1.0
    margin: float = 0.0
    noise_bytes: float = 0.0  # in m0

    def bytes(self, lengths: Sequence[int]) -> float:
        return float(np.dot(self.coefficients, memory_features(lengths)))


def memory_features(lengths: Sequence[int]) -> tuple[float, float, float, float, float]:
    """(1, sum(l), sum(l^2), max(l)^2, max(l)^2.5): the memory model's terms of one micro-batch."""
    longest = max(lengths, default=0)
    return (1.0, float(sum(lengths)), float(sum(x * x for x in lengths)), float(longest**2), longest**LONGEST_POWER)


def memory_noise_bytes(samples: Sequence[StageSample]) -> float | None:
    """The largest step-to-step noise of the samples' real peaks, bytes: max(peak_bytes -
    peak_median_bytes); None unless every sample with a real peak has a median step peak (one
    metered step per micro-batch: no noise known)."""
    peaked = [s for s in samples if s.peak_bytes is not None and s.peak_bytes > 0]
    if not peaked or any(not s.peak_median_bytes for s in peaked):
        return None
    return max(0.0, max(s.peak_bytes - s.peak_median_bytes for s in peaked))


def growth_floor(samples: Sequence[StageSample], peaks: Sequence[float]) -> tuple[np.ndarray, np.ndarray] | None:
    """Where one long sequence's fitted peak must stay beyond the grid: the quadratic through the
    three longest single sequences measured (their `peaks`), at `GROWTH_FLOOR_AT` x the longest, as
    (memory features, bytes) rows for `upper_fit`'s floors; None with fewer than three lengths.

    On the grid an upper fit can be as tight with the growth of long sequences in the sum of
    squares as in `max(l)^2.5`, and the two part beyond it (held-out set 8: a 2,900-token sequence
    5% under); the floor keeps the fit's growth beyond the longest measured sequence no slower than
    the measured curve's own at its end (which, on CPU, still steepens: the margin covers the rest).
    """
    longest: dict[int, float] = {}
    for sample, peak in zip(samples, peaks, strict=True):
        if len(sample.lengths) == 1 and peak > 0:
            longest[sample.lengths[0]] = max(peak, longest.get(sample.lengths[0], 0.0))
    if len(longest) < 3:
        return None
    (x0, y0), (x1, y1), (x2, y2) = sorted(longest.items())[-3:]
    slope0, slope1 = (y1 - y0) / (x1 - x0), (y2 - y1) / (x2 - x1)
    curvature = (slope1 - slope0) / (x2 - x0)
    rows, values = [], []
    for factor in GROWTH_FLOOR_AT:
        length = factor * x2
        value = y0 + slope0 * (length - x0) + curvature * (length - x0) * (length - x1)
        if value > 0:
            rows.append(memory_features([length]))
            values.append(value)
    return np.array(rows, dtype=float).reshape(-1, 5), np.array(values, dtype=float)


def fit_memory(samples: Sequence[StageSample], margin: float | None = None) -> MemoryFit:
    """The memory model of one stage: to the real peaks where measured, else to the saved bytes.

    A real-peak fit (`m0 + m1 T + m2 sum(l^2) + m3 max(l)^2 + m4 max(l)^2.5`) is the tightest
    upper fit (`upper_fit`; relative-error NNLS where the solver finds none) to the median step
    peaks where every row has one (else to the largest), kept above `growth_floor` beyond the
    longest measured sequence, scaled by `envelope = max(1, max(fitted /
    predicted))` so that no fitted micro-batch is under-predicted, then by `1 + margin`, and the
    step noise in bytes (`memory_noise_bytes`) added to `m0`; so every row's largest step peak is
    covered. `margin` defaults to `MEMORY_SAFETY_MARGIN` where the step noise was metered, else
    `MEMORY_UNMETERED_MARGIN`. Its residuals are the model against the largest peaks
    (`peak_bytes`). A saved-bytes fit (`m0 + m1 T + m2 sum(l^2)`, relative-error NNLS, `m3 = m4 =
    0`) is left as fitted (those bytes are not what must fit: no promise is made).
    """
    if margin is not None and margin < 0:
        raise ValueError(f"memory margin {margin}: must be >= 0")
    peaks = [s for s in samples if s.peak_bytes is not None and s.peak_bytes > 0]
    if peaks:
        rows, measured, fitted_to = peaks, [s.peak_bytes for s in peaks], "real_peak"
    else:
        rows = [s for s in samples if s.activation_bytes is not None]
        measured, fitted_to = [s.activation_bytes for s in rows], "saved_tensors"
    if not rows:
        return MemoryFit((0.0, 0.0, 0.0, 0.0, 0.0), (), "")
    target = largest = np.array(measured, dtype=float)
    if fitted_to == "saved_tensors":
        fit = relative_nnls(np.array([[1.0, s.num_tokens, s.sum_sq_tokens] for s in rows], dtype=float), target)
        return MemoryFit((*fit.coefficients, 0.0, 0.0), fit.residuals, fitted_to)
    noise_bytes = memory_noise_bytes(rows)
    if noise_bytes is not None:
        target = np.array([s.peak_median_bytes for s in rows], dtype=float)
    if margin is None:
        margin = MEMORY_UNMETERED_MARGIN if noise_bytes is None else MEMORY_SAFETY_MARGIN
    features = np.array([memory_features(s.lengths) for s in rows], dtype=float)
    solution = upper_fit(features, target, growth_floor(rows, list(target)))
    if solution is None:
        solution = relative_nnls(features, target).coefficients
    predicted = features @ np.array(solution)
    positive = predicted > 0
    envelope = max(1.0, float(np.max(target[positive] / predicted[positive]))) if positive.any() else 1.0
    scale = envelope * (1 + margin)
    coefficients = [float(x) * scale for x in solution]
    coefficients[0] += noise_bytes or 0.0
    residuals = tuple(float(r) for r in (features @ np.array(coefficients) - largest) / largest)
    return MemoryFit(tuple(coefficients), residuals, fitted_to, envelope, margin, noise_bytes or 0.0)


def fit_scheme(samples: Sequence[StageSample], usable_bytes: float | None) -> tuple[SchemeCost, SchemeFit] | None:
    """The profile entry of one scheme from all its samples (every measured stage).

    Time: the coefficient-wise maximum over the measured stages (an upper bound on the slowest
    stage, since every term is non-negative). Memory: 1F1B stage s holds `pp - s` micro-batches in
    flight; the capacity is the smallest stage bound, and below the smallest out-of-memory batch.
    Returns None when no stage has enough samples.
    """
    by_stage: dict[int, list[StageSample]] = {}
    for sample in samples:
        by_stage.setdefault(sample.stage, []).append(sample)
    stage_fits = []
    for stage_samples in by_stage.values():
        try:
            stage_fits.append(fit_stage(stage_samples))
        except ValueError:
            continue
    if not stage_fits:
        return None
    tp, pp, cp = stage_fits[0].scheme
    capacity = _capacity_tokens(stage_fits, pp, usable_bytes)
    if capacity is None:  # no memory figure and no out-of-memory: what was measured is known to fit
        capacity = max(s.num_tokens for s in samples if not s.oom)
    if capacity < 1:
        return None
    first = min(stage_fits, key=lambda fit: fit.stage)
    cost = SchemeCost(
        tp=tp,
        pp=pp,
        cp=cp,
        a=max(fit.a for fit in stage_fits),
        b=max(fit.b for fit in stage_fits),
        c=max(fit.c for fit in stage_fits),
        fwd_fraction=_weighted_fwd_fraction(stage_fits),
        capacity_tokens=capacity,
        static_bytes=max(fit.static_bytes for fit in stage_fits),
        activation_bytes_per_token=first.activation_bytes_per_token,
        activation_bytes_per_token_sq=first.activation_bytes_per_token_sq,
        activation_bytes_per_longest_sq=first.activation_bytes_per_longest_sq,
        activation_bytes_per_longest_pow=first.activation_bytes_per_longest_pow,
        in_flight_micro_batches=pp,
        grad_bytes_per_gpu=0.0,
    )
    return cost, _scheme_fit(cost, stage_fits)


def _weighted_fwd_fraction(stage_fits: Sequence[StageFit]) -> float:
    return float(np.mean([fit.fwd_fraction for fit in stage_fits]))


def _capacity_tokens(stage_fits: Sequence[StageFit], pp: int, usable_bytes: float | None) -> int | None:
    """Smallest per-stage token bound (None when neither memory nor an out-of-memory is known)."""
    bounds = []
    for fit in stage_fits:
        per_square = fit.activation_bytes_per_token_sq + fit.activation_bytes_per_longest_sq
        per_power = fit.activation_bytes_per_longest_pow
        if usable_bytes is not None and (fit.activation_bytes_per_token or per_square or per_power):
            in_flight = max(pp - fit.stage, 1)
            # sum(l^2) and max(l)^2 are both at most T^2, max(l)^2.5 at most T^2.5: the bound holds
            # for any T tokens
            bounds.append(
                most_tokens(
                    usable_bytes - fit.static_bytes,
                    in_flight * fit.activation_bytes_per_token,
                    in_flight * per_square,
                    in_flight * per_power,
                )
            )
        if fit.oom_tokens is not None:
            bounds.append(fit.oom_tokens - 1)
    return min(bounds) if bounds else None


def _scheme_fit(cost: SchemeCost, stage_fits: Sequence[StageFit]) -> SchemeFit:
    time_residuals = [r for fit in stage_fits for r in fit.time_residuals]
    memory_residuals = [r for fit in stage_fits for r in fit.memory_residuals]
    time_median, time_p95 = abs_error_summary(time_residuals)
    memory_median, _ = abs_error_summary(memory_residuals)
    ooms = [fit.oom_tokens for fit in stage_fits if fit.oom_tokens is not None]
    return SchemeFit(
        tp=cost.tp,
        pp=cost.pp,
        cp=cost.cp,
        a=cost.a,
        b=cost.b,
        c=cost.c,
        fwd_fraction=cost.fwd_fraction,
        static_bytes=cost.static_bytes or 0.0,
        activation_bytes_per_token=cost.activation_bytes_per_token or 0.0,
        activation_bytes_per_token_sq=cost.activation_bytes_per_token_sq,
        activation_bytes_per_longest_sq=cost.activation_bytes_per_longest_sq,
        activation_bytes_per_longest_pow=cost.activation_bytes_per_longest_pow,
        num_samples=sum(fit.num_samples for fit in stage_fits),
        time_residuals=time_residuals,
        memory_residuals=memory_residuals,
        time_median_abs_error=time_median,
        time_p95_abs_error=time_p95,
        memory_median_abs_error=memory_median,
        capacity_from_oom_tokens=min(ooms) if ooms else None,
        memory_fitted_to=_memory_fitted_to(stage_fits),
        memory_envelope=max(fit.memory_envelope for fit in stage_fits),
        memory_margin=max(fit.memory_margin for fit in stage_fits),
        memory_noise_bytes=max(fit.memory_noise_bytes for fit in stage_fits),
        max_measured_tokens=max(fit.max_measured_tokens for fit in stage_fits) or None,
        max_measured_length=max(fit.max_measured_length for fit in stage_fits) or None,
    )


def _memory_fitted_to(stage_fits: Sequence[StageFit]) -> str:
    """`real_peak` only when every stage's memory was fitted to real peaks."""
    kinds = {fit.memory_fitted_to for fit in stage_fits if fit.memory_fitted_to}
    if not kinds:
        return ""
    return "real_peak" if kinds == {"real_peak"} else "saved_tensors"


# ---------------------------------------------------------------------------------------------
# Collectives
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CollectiveFit:
    """`seconds = latency_s + bytes / bandwidth_bytes_per_s` of one (operation, ranks)."""

    op: str
    ranks: int
    latency_s: float
    bandwidth_bytes_per_s: float
    residuals: tuple[float, ...]

    def seconds(self, num_bytes: float) -> float:
        return self.latency_s + num_bytes / self.bandwidth_bytes_per_s


def fit_collectives(samples: Iterable[CollectiveSample]) -> dict[tuple[str, int], CollectiveFit]:
    """One latency + bandwidth fit per (operation, ranks) with at least two message sizes."""
    groups: dict[tuple[str, int], list[CollectiveSample]] = {}
    for sample in samples:
        groups.setdefault((sample.op, sample.ranks), []).append(sample)
    fits = {}
    for (op, ranks), group in groups.items():
        if len({s.bytes for s in group}) < 2:
            continue
        features = np.array([[1.0, float(s.bytes)] for s in group])
        fit = relative_nnls(features, np.array([s.seconds for s in group]))
        latency, seconds_per_byte = fit.coefficients
        bandwidth = 1 / seconds_per_byte if seconds_per_byte > 0 else math.inf
        fits[(op, ranks)] = CollectiveFit(op, ranks, latency, bandwidth, fit.residuals)
    return fits


def grad_sync_bandwidth(fits: dict[tuple[str, int], CollectiveFit]) -> float | None:
    """Bus bandwidth of the measured all-reduce with the most ranks: bytes * 2(n-1)/n per second."""
    reduces = [fit for (op, _), fit in fits.items() if op == "all_reduce" and math.isfinite(fit.bandwidth_bytes_per_s)]
    if not reduces:
        return None
    widest = max(reduces, key=lambda fit: fit.ranks)
    return widest.bandwidth_bytes_per_s * ring_all_reduce_factor(widest.ranks)


def link_parameters(fits: dict[tuple[str, int], CollectiveFit], base: HardwareParams) -> HardwareParams:
    """Intra-node latency and link bandwidth from the measured all-reduce (else send/recv).

    An all-reduce of B bytes over n ranks sends `2(n-1)/n * B` per rank (ring), so the link
    bandwidth is the fitted bytes-per-second times that factor.
    """
    reduces = [fit for (op, _), fit in fits.items() if op == "all_reduce"]
    p2p = [fit for (op, _), fit in fits.items() if op == "send_recv"]
    if reduces:
        fit = max(reduces, key=lambda item: item.ranks)
        bandwidth = fit.bandwidth_bytes_per_s * ring_all_reduce_factor(fit.ranks)
    elif p2p:
        fit = p2p[0]
        bandwidth = fit.bandwidth_bytes_per_s
    else:
        return base
    values = {"intra_node_latency_s": fit.latency_s}
    if math.isfinite(bandwidth):
        values["intra_node_bandwidth_bytes_per_s"] = bandwidth
    return base.with_values(**values)


def element_bytes_of(dtype: str) -> float:
    """Bytes per element of a torch dtype name ('float32', 'torch.bfloat16'); 2 (bf16) when unknown."""
    return {"float32": 4.0, "float64": 8.0, "bfloat16": 2.0, "float16": 2.0}.get(dtype.removeprefix("torch."), 2.0)


def with_communication(cost: SchemeCost, model: ModelSpec, provenance: ProfileProvenance) -> SchemeCost:
    """`cost` plus the TP, CP and PP communication of its scheme at the measured link figures.

    Used when stage times are thread CPU time (`provenance.clock == "thread"`): they hold the
    compute only, so the per-token transfer time and per-micro-batch latency of the analytic
    formulas (`analytic_time`) are added, evaluated with the measured collectives' fit.
    """
    scheme = ParallelScheme(cost.tp, cost.pp, cost.cp)
    if scheme.num_gpus == 1:
        return cost
    fits = fit_collectives(provenance.collectives)
    unknown = HardwareParams(
        gemm_flops_per_s=1.0,
        attention_flops_per_s=1.0,
        intra_node_bandwidth_bytes_per_s=math.inf,
        inter_node_bandwidth_bytes_per_s=math.inf,
        per_layer_overhead_s=0.0,
        activation_element_bytes=element_bytes_of(provenance.dtype),
    )
    link = link_parameters(fits, unknown)
    if math.isinf(link.intra_node_bandwidth_bytes_per_s):
        return cost  # no collective measured: nothing to add
    link = link.with_values(inter_node_bandwidth_bytes_per_s=link.intra_node_bandwidth_bytes_per_s)
    gpu = GpuSpec(
        name="local",
        memory_bytes=1.0,
        peak_bf16_flops=1.0,
        hbm_bandwidth_bytes_per_s=1.0,
        intra_node_bandwidth_bytes_per_s=link.intra_node_bandwidth_bytes_per_s,
        inter_node_bandwidth_bytes_per_s=link.intra_node_bandwidth_bytes_per_s,
    )
    nodes = scheme.num_gpus  # the measured ranks share one machine
    per_token = (
        tp_comm_s_per_token(model, gpu, scheme, link)
        + cp_comm_s_per_token(model, gpu, scheme, nodes, link)
        + pp_comm_s_per_token(model, gpu, scheme, nodes, link)
    )
    latency = comm_latency_s_per_micro_batch(model, scheme, nodes, link)
    return cost.model_copy(update={"b": cost.b + per_token, "c": cost.c + latency})


def grad_bytes_per_gpu(model: ModelSpec, scheme: ParallelScheme, element_bytes: float) -> float:
    """Gradient bytes of one GPU's shard: the larger end stage's parameters over TP, at the
    measured dtype (the gradient-sync model of `planner/cost.py` reduces this much per replica)."""
    return max(stage_params(model, scheme.pp)) / scheme.tp * element_bytes


# ---------------------------------------------------------------------------------------------
# The profile
# ---------------------------------------------------------------------------------------------


def build_profiled_profile(
    provenance: ProfileProvenance,
    *,
    model: str,
    device_name: str,
    num_layers: int,
    memory_bytes: float | None,
    memory_reserve_bytes: float = 0.0,
    model_spec: ModelSpec | None = None,
) -> CostProfile:
    """A `source: "profiled"` profile of every scheme with enough samples in `provenance`.

    With `model_spec` and thread-CPU-time samples, each scheme's communication is added from the
    measured collectives (`with_communication`); the fits in the provenance stay the compute's.
    With `model_spec`, each scheme's `grad_bytes_per_gpu` is its gradient shard at the measured
    dtype (`grad_bytes_per_gpu`), so the measured all-reduce bandwidth prices the gradient sync.

    Raises `ValueError` when no scheme could be fitted (too few samples).
    """
    usable = None if memory_bytes is None else memory_bytes - memory_reserve_bytes
    by_scheme: dict[tuple[int, int, int], list[StageSample]] = {}
    for sample in provenance.samples:
        by_scheme.setdefault(sample.key, []).append(sample)
    entries, fits = [], []
    for key in sorted(by_scheme):
        result = fit_scheme(by_scheme[key], usable)
        if result is not None:
            cost = result[0]
            if model_spec is not None and provenance.clock == "thread":
                cost = with_communication(cost, model_spec, provenance)
            if model_spec is not None:  # without it the gradient sync would be priced at 0 s
                shard = grad_bytes_per_gpu(model_spec, ParallelScheme(*key), element_bytes_of(provenance.dtype))
                cost = cost.model_copy(update={"grad_bytes_per_gpu": shard})
            entries.append(cost)
            fits.append(result[1])
    if not entries:
        raise ValueError(f"no scheme has {MIN_TIME_SAMPLES} distinct timed micro-batches to fit; nothing to write")
    bandwidth = grad_sync_bandwidth(fit_collectives(provenance.collectives))
    missing = sorted(set(by_scheme) - {entry.key for entry in entries})
    notes = "fitted to measurements (cost_models.fit): relative-error NNLS per scheme and stage"
    if missing:
        notes += f"; too few samples for {', '.join(f'<{t},{p},{c}>' for t, p, c in missing)}"
    longest = max(fit.max_measured_length or 0 for fit in fits)
    notes += f"; sequences measured up to {longest:,} tokens (longer ones: extrapolated)"
    holds = max(entry.capacity_tokens or 0 for entry in entries)
    if holds > longest:  # issue 31 item 5: say where the measured range stops against what a pipeline holds
        notes += (
            f"; the largest capacity holds {holds:,} tokens per micro-batch: lengths from {longest + 1:,} to "
            f"{holds:,} are extrapolated (the measured grid stops at {longest:,} to bound profiling time)"
        )
    if any(fit.memory_fitted_to == "real_peak" for fit in fits):
        peaked = [fit for fit in fits if fit.memory_fitted_to == "real_peak"]
        margin = max(fit.memory_margin for fit in peaked)
        noise = max(fit.memory_noise_bytes for fit in peaked)
        notes += "; memory fitted to real peaks (median step peaks, max(l)^2 and max(l)^2.5 terms, tightest upper "
        notes += "fit, one long sequence's growth beyond the longest measured kept above the quadratic through the "
        notes += f"three longest), then a {margin:.0%} margin"
        if noise:
            notes += f" and {noise / 2**20:.1f} MiB (the largest step noise of a fitted micro-batch)"
    if provenance.interrupted:
        notes += "; measurement interrupted: partial"
    return CostProfile(
        source="profiled",
        model=model,
        gpu=device_name,
        time_unit="s",
        num_layers=num_layers,
        gpu_memory_bytes=memory_bytes,
        memory_reserve_bytes=memory_reserve_bytes,
        grad_sync_bandwidth_bytes_per_s=bandwidth,
        # hydraplan's runtime keeps each shard's AdamW moments beside it and moves them on a switch
        switch_bytes_per_weight_byte=3.0,
        schemes=entries,
        notes=notes,
        provenance=provenance.model_copy(update={"fits": fits}),
    )
