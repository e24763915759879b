"""Refit a session's cost profile online, step after step, from the runtime's measurements.

The stage-time model is the profile's, `t = a * sum(l^2) + b * sum(l) + c` per scheme (DESIGN.md,
"Cost model"); each posted step adds its measured micro-batches to a per-scheme window and refits
`a, b, c` with four safeguards, each with a stated constant:

- **robust**: iteratively reweighted least squares with Huber weights on the *relative* residual
  (as `cost_models.fit` does, every micro-batch weighs the same whatever its length); the scale is
  1.4826 x the median |residual| (MAD), floored at `MIN_RESIDUAL_SCALE`, and the Huber threshold is
  `HUBER_K` scales. The first residuals are taken against the current fit, so a straggler step's
  micro-batches are down-weighted from the start (Huber 1964; Holland and Welsch 1977 for IRLS);
- **recent**: each micro-batch weighs `0.5 ** (age_steps / HALF_LIFE_STEPS)`; a window keeps the
  last `WINDOW_STEPS` steps, at most `MAX_WINDOW_SAMPLES` micro-batches; two error jumps in a row
  (a new regime, not a straggler) restart the measured schemes' windows from the first of them;
- **bounded**: one step moves each coefficient by at most `MAX_STEP_CHANGE` (20%) of its current
  value (of `ZERO_FLOOR_SHARE` of a reference micro-batch's time, for a coefficient at or near 0);
- **blended with the prior**: the session's original coefficients, at the shared scales (below)
  and scaled to the level the window's data sets (the decay-weighted median of measured over prior
  time), enter the fit as `PRIOR_SAMPLES` pseudo micro-batches at the reference point (the
  window's weighted mean features): a ridge towards that shape that the data outweighs after a
  step or two. The level matters for a slowdown that slows every term alike: a ridge towards the
  unscaled prior pulled the terms it weighs most back and let the least-weighed one (often `c`,
  near 0) absorb the rest; a uniform 1.6x slowdown was followed in 5 steps with `c` at 14-39x, in 4
  with it scaled;
- **shared across schemes**: one scale per term, `t = s_a a_s sum(l^2) + s_b b_s sum(l) + s_c c_s`
  with each scheme's prior `a_s, b_s, c_s`, fitted over every window's micro-batches with the
  same robust weights and per-step cap (`shared_term_scales`; its ridge towards (1, 1, 1) at the
  data's level weighs only `SHARED_PRIOR_SAMPLES`, enough to make one micro-batch's fit unique).
  A profile's errors are largely shared (a kernel version, a device's speed: every scheme's `a` or
  `b` off alike), and pooled, the schemes' different term ratios and length mixes tell the terms
  apart where one window cannot: each scheme's ridge pulls towards its prior at these scales, and
  a scheme without a window is priced at them. On a replay of the wrong start (a x2, b x0.5; one
  scheme measured every step, others now and then, 12 seeds), the error on new mixes after 14
  steps fell from 9-14% (rarely measured schemes) and 28-33% (never measured) to 1-2%. The cost:
  a slowdown of one kind of scheme alone (a degraded link under TP or CP) also raises the others'
  prices until they are measured; a slow rank is not such a case (below).

Memory: a measured peak within `MEMORY_MARGIN` of the usable device memory lowers that scheme's
capacity at once, in proportion. A peak above the peak the profile predicts corrects the scheme's
memory model (`corrected_memory`: over its last `MEMORY_PEAKS` peaks, the activation bytes' scale
and the extra static bytes the measurements show, every peak on or under the corrected model,
`MEMORY_MARGIN` on top) and lowers the capacity to what the corrected model derives
(`corrected_capacity`, `lowered_capacity`). Derived from the profile's model, not the current
capacity, the cut is made once: the rule it replaced scaled the current capacity by predicted /
peak at every step, and a lasting 2x under-prediction cut a capacity of 12,935 tokens to 419 in
five steps. A scheme whose peaks were never measured plans with the largest activation scale of
the schemes the model under-predicted (`shared_activation_scale`). An error jump (a step's median
error over `DRIFT_RATIO` x the recent median and over `DRIFT_MIN_ERROR`) is reported
(`is_error_jump`).

Slow ranks: each step's per-pipeline measured/predicted ratios, with the pipelines' ranks, give
per-rank slowdown factors (`cost_models.rank_speed`, kept in the state's `rank_slowdowns`); a
pipeline holding a slow rank is scored and refitted with its times divided by its factor.

Pure: numpy and scipy only, no IO, no service imports; the session (`api/service/session_fit.py`)
stores the `OnlineFitState` and applies it to its profile.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy.optimize import nnls

from hydraplan.cost_models.rank_speed import PipelineRatio, kept_observations, rank_factors, step_observations
from hydraplan.planner import limits
from hydraplan.planner.measurements import CapacityChange, DriftEvent, SessionFeedback, StepError
from hydraplan.planner.schemas import LONGEST_POWER, CostProfile, SchemeCost, derive_capacity_tokens, single_chunk

__all__ = [
    "CapacityChange",
    "Coefficients",
    "DriftEvent",
    "MeasuredMicroBatch",
    "MeasuredPipeline",
    "OnlineFitState",
    "StepError",
    "apply_step",
    "feedback",
    "is_error_jump",
    "lowered_capacity",
    "profile_at",
    "refit_coefficients",
    "scaled_activations",
    "shared_activation_scale",
    "shared_term_scales",
]

HALF_LIFE_STEPS = 4.0  # a micro-batch 4 steps old weighs half as much as one of this step
WINDOW_STEPS = 16  # 4 half-lives: older micro-batches (weight < 1/16) are dropped
MAX_WINDOW_SAMPLES = 256  # micro-batches kept per scheme (the most recent)
MAX_STEP_CHANGE = 0.20  # one step moves a coefficient by at most 20% of its current value
ZERO_FLOOR_SHARE = 0.05  # ...or, near 0, by 20% of the value whose term is 5% of a reference micro-batch
PRIOR_SAMPLES = 4.0  # the prior weighs as much as 4 fresh micro-batches
SHARED_PRIOR_SAMPLES = 0.1  # the shared scales' ridge: enough to make a fit of one micro-batch unique
HUBER_K = 1.345  # Huber threshold in robust scales (95% efficiency under Gaussian noise)
MIN_RESIDUAL_SCALE = 0.02  # relative residuals under 2% are noise, never outliers
IRLS_ITERATIONS = 10
MEMORY_MARGIN = 0.05  # a peak within 5% of the usable memory lowers the capacity
MEMORY_PEAKS = 16  # measured peaks kept per scheme for its memory correction
DRIFT_RATIO = 3.0  # an error jump: a step's median error > 3x the recent median ...
DRIFT_MIN_ERROR = 0.10  # ... and > 10%
DRIFT_RECENT_STEPS = 8  # the recent median is over the last 8 steps (at least 3 needed)
KEPT_VERSIONS = 8  # coefficient snapshots kept, to score a step against the version that planned it
KEPT_ERRORS = 32
KEPT_EVENTS = 16
MAX_ERROR = 1e12  # a relative error is reported up to this


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Coefficients(_Frozen):
    """Stage-time coefficients of one scheme, in seconds (whatever the profile's time unit)."""

    tp: int
    pp: int
    cp: int
    v: int = Field(1, description="Model chunks per PP rank (interleaved); left out when 1.", exclude_if=single_chunk)
    a: float = Field(description="Seconds per squared token.")
    b: float = Field(description="Seconds per token.")
    c: float = Field(description="Seconds per micro-batch.")
    fwd_fraction: float = Field(description="Share of the stage time spent in the forward pass.")

    @property
    def key(self) -> tuple[int, ...]:
        """The profile entry's key: (tp, pp, cp), with v appended when v > 1."""
        return (self.tp, self.pp, self.cp) if self.v == 1 else (self.tp, self.pp, self.cp, self.v)

    def stage_time_s(self, sum_sq_tokens: float, num_tokens: float) -> float:
        return self.a * sum_sq_tokens + self.b * num_tokens + self.c


class SchemeWindow(_Frozen):
    """The current fit of one measured scheme and its recent micro-batches."""

    prior: Coefficients = Field(description="The session's original coefficients (version 0).")
    current: Coefficients
    capacity_tokens: int | None = Field(None, description="Lowered capacity; None: the profile's own.")
    activation_scale: float = Field(
        1.0,
        description="The memory model's activation bytes times this, as the measured peaks show (`corrected_memory`).",
    )
    extra_static_bytes: float = Field(0.0, description="Bytes the measured peaks show above the model's static bytes.")
    peaks: list[tuple[int, float, float]] = Field(
        default_factory=list,
        description="(step, the model's activation bytes, measured peak minus the model's static bytes) per measured "
        "pipeline peak, the last MEMORY_PEAKS.",
    )
    rows: list[tuple[int, float, float, float, float]] = Field(
        default_factory=list, description="(step, sum of squared lengths, tokens, time_s, fwd_s or -1) per micro-batch."
    )


class OnlineFitState(_Frozen):
    """A session's online fit: version 0 is the session's original profile."""

    version: int = 0
    num_steps: int = 0
    schemes: list[SchemeWindow] = Field(default_factory=list)
    snapshots: list[tuple[int, list[Coefficients]]] = Field(
        default_factory=list, description="(version, refitted schemes' coefficients) of the last versions."
    )
    errors: list[StepError] = Field(default_factory=list)
    capacity_changes: list[CapacityChange] = Field(default_factory=list)
    drift: list[DriftEvent] = Field(default_factory=list)
    rank_observations: list[tuple[int, int, float]] = Field(
        default_factory=list,
        description="(step, rank, ratio over the step's fastest pipeline) of the last steps (`rank_speed`).",
    )
    rank_slowdowns: dict[int, float] = Field(
        default_factory=dict, description="Ranks estimated slow after the last step, with their factors (> 1)."
    )
    shared: tuple[float, float, float] = Field(
        (1.0, 1.0, 1.0),
        description="Cross-scheme scales of the prior's a, b, c terms (`shared_term_scales`): the ridge target of "
        "every refit, and the pricing of schemes without a window.",
    )
    shared_snapshots: list[tuple[int, tuple[float, float, float]]] = Field(
        default_factory=list, description="(version, shared scales) of the last versions."
    )

    def window(self, key: tuple[int, ...]) -> SchemeWindow | None:
        return next((window for window in self.schemes if window.current.key == key), None)


@dataclass(frozen=True)
class MeasuredMicroBatch:
    sum_sq_tokens: float
    num_tokens: float
    time_s: float
    fwd_s: float | None = None


@dataclass(frozen=True)
class MeasuredPipeline:
    """One pipeline's measurements of one step; `peak_bytes` is the largest over its ranks."""

    scheme: tuple[int, ...]
    micro_batches: tuple[MeasuredMicroBatch, ...]
    peak_bytes: float | None = None
    # its ranks, the plan's predicted time of its measured micro-batches (summed) and the slowdown
    # factor that prediction held: what the per-rank factors are estimated from (`rank_speed`)
    ranks: tuple[int, ...] = ()
    predicted_s: float | None = None
    slowdown: float = 1.0
    # each rank's compute CPU time over the step, in `ranks` order (stage-major): what tells a slow
    # rank from the others of its PP stage (`rank_speed.PipelineRatio.within`)
    rank_compute_s: tuple[float, ...] = ()
    rank_work: tuple[float, ...] = ()  # each rank's expected work (stage FLOPs over its TP x CP ranks)

    def normalized(self, factor: float) -> MeasuredPipeline:
        """Its micro-batches' times divided by `factor` (a slow rank's share taken out)."""
        if factor == 1.0:
            return self
        micro_batches = tuple(
            MeasuredMicroBatch(
                mb.sum_sq_tokens, mb.num_tokens, mb.time_s / factor, None if mb.fwd_s is None else mb.fwd_s / factor
            )
            for mb in self.micro_batches
        )
        return dataclasses.replace(self, micro_batches=micro_batches)


def scheme_name(key: tuple[int, ...]) -> str:
    return "<" + ",".join(str(degree) for degree in key) + ">"


def prior_coefficients(profile: CostProfile, entry: SchemeCost) -> Coefficients:
    unit = profile.seconds_per_unit
    return Coefficients(
        tp=entry.tp,
        pp=entry.pp,
        cp=entry.cp,
        v=entry.v,
        a=entry.a * unit,
        b=entry.b * unit,
        c=entry.c * unit,
        fwd_fraction=entry.fwd_fraction,
    )


# ---------------------------------------------------------------------------------------------
# The robust, decayed, capped refit of one scheme
# ---------------------------------------------------------------------------------------------


def refit_coefficients(
    prior: Coefficients,
    current: Coefficients,
    rows: np.ndarray,
    now_step: int,
    shared: tuple[float, float, float] = (1.0, 1.0, 1.0),
) -> Coefficients:
    """The next coefficients of one scheme from its window `rows` (step, s2, s1, t, fwd or -1).

    Huber IRLS on relative residuals with decayed weights and a ridge towards the prior's terms
    scaled by `shared` (the session's cross-scheme term scales, `shared_term_scales`), then each
    coefficient clipped to within `MAX_STEP_CHANGE` of `current` (module docstring).
    """
    if len(rows) == 0:
        return current
    features = np.column_stack([rows[:, 1], rows[:, 2], np.ones(len(rows))])
    decay = 0.5 ** ((now_step - rows[:, 0]) / HALF_LIFE_STEPS)
    target = np.array([prior.a, prior.b, prior.c]) * np.asarray(shared)
    a, b, c = _robust_fit(features, rows[:, 3], decay, np.array([current.a, current.b, current.c]), target)
    return current.model_copy(
        update={"a": float(a), "b": float(b), "c": float(c), "fwd_fraction": _fwd_fraction(current, rows, decay)}
    )


def shared_term_scales(
    windows: Sequence[SchemeWindow], current: tuple[float, float, float], now_step: int
) -> tuple[float, float, float]:
    """The next cross-scheme term scales `(s_a, s_b, s_c)`: one robust fit over every window's
    micro-batches of `t = s_a a_s sum(l^2) + s_b b_s sum(l) + s_c c_s`, with each micro-batch's
    scheme s priced by its prior (the same safeguards as a scheme's refit, towards `(1, 1, 1)` at
    the data's level).

    Pooled, the schemes' different term ratios and length mixes tell the terms apart better than
    one scheme's window does, and a scheme measured rarely or never is then priced with the
    profile's error the others show (module docstring, "shared")."""
    blocks = [
        (np.asarray(window.rows, dtype=float), np.array([window.prior.a, window.prior.b, window.prior.c]))
        for window in windows
        if window.rows
    ]
    if not blocks:
        return current
    rows = np.vstack([block for block, _ in blocks])
    priced = np.vstack([np.column_stack([b[:, 1], b[:, 2], np.ones(len(b))]) * terms for b, terms in blocks])
    decay = 0.5 ** ((now_step - rows[:, 0]) / HALF_LIFE_STEPS)
    scales = _robust_fit(
        priced,
        rows[:, 3],
        decay,
        np.asarray(current, dtype=float),
        np.ones(3),
        relative_cap=True,
        prior_samples=SHARED_PRIOR_SAMPLES,
    )
    return (float(scales[0]), float(scales[1]), float(scales[2]))


def _robust_fit(
    features: np.ndarray,
    measured: np.ndarray,
    decay: np.ndarray,
    old: np.ndarray,
    prior_x: np.ndarray,
    relative_cap: bool = False,
    prior_samples: float = PRIOR_SAMPLES,
) -> np.ndarray:
    """x >= 0 with `features @ x ~ measured`: Huber IRLS on relative residuals from `old`, a ridge
    towards `prior_x` scaled to the data's level, each term clipped to `MAX_STEP_CHANGE` of `old`
    (or, for a term near 0, of the value whose term is `ZERO_FLOOR_SHARE` of the reference time,
    unless `relative_cap`: then always of the current value, as for the shared scales, which start at 1)."""
    reference = decay @ features / decay.sum()
    reference_s = float(reference @ prior_x) or float(np.average(measured, weights=decay))
    target = prior_x * _level(features @ prior_x, measured, decay)
    solution = old  # the first residuals are against the current fit: a straggler step is down-weighted at once
    for _ in range(IRLS_ITERATIONS):
        huber = _huber_weights((features @ solution - measured) / measured)
        solution = _weighted_ridge_nnls(
            features, measured, decay * huber, reference / reference_s, target, prior_samples
        )
    floor = 0.0 if relative_cap else ZERO_FLOOR_SHARE * reference_s / np.maximum(reference, 1e-300)
    step = MAX_STEP_CHANGE * np.maximum(old, floor)
    return np.clip(solution, np.maximum(old - step, 0.0), old + step)


def _level(prior_s: np.ndarray, measured: np.ndarray, decay: np.ndarray) -> float:
    """The decay-weighted median of measured / prior time over the window: the level the data sets
    for the prior's shape (1 where the prior prices nothing)."""
    priced = prior_s > 0
    if not priced.any():
        return 1.0
    return _weighted_median(measured[priced] / prior_s[priced], decay[priced])


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The value at which the sorted values' cumulative weight reaches half the total."""
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, cumulative[-1] / 2)])


def _huber_weights(residuals: np.ndarray) -> np.ndarray:
    scale = max(1.4826 * float(np.median(np.abs(residuals))), MIN_RESIDUAL_SCALE)
    threshold = HUBER_K * scale
    magnitude = np.abs(residuals)
    return np.where(magnitude <= threshold, 1.0, threshold / np.maximum(magnitude, 1e-300))


def _weighted_ridge_nnls(
    features: np.ndarray,
    measured: np.ndarray,
    weights: np.ndarray,
    ridge_scale: np.ndarray,
    prior_x: np.ndarray,
    prior_samples: float = PRIOR_SAMPLES,
) -> np.ndarray:
    """min sum w_i ((f_i x - t_i) / t_i)^2 + PRIOR_SAMPLES * sum_k (s_k (x_k - p_k))^2 over x >= 0,
    where s_k is term k's share of the reference micro-batch's prior time per unit of x_k."""
    root = np.sqrt(weights)
    rows = np.vstack([features * (root / measured)[:, None], math.sqrt(prior_samples) * np.diag(ridge_scale)])
    targets = np.concatenate([root, math.sqrt(prior_samples) * ridge_scale * prior_x])
    column = np.linalg.norm(rows, axis=0)
    column[column == 0] = 1.0
    solution, _ = nnls(rows / column, targets, maxiter=150)
    return solution / column


def _fwd_fraction(current: Coefficients, rows: np.ndarray, decay: np.ndarray) -> float:
    """The decay-weighted median of measured fwd/time, within `MAX_STEP_CHANGE` of the current one."""
    has_fwd = rows[:, 4] > 0
    if not has_fwd.any():
        return current.fwd_fraction
    median = _weighted_median(rows[has_fwd, 4] / rows[has_fwd, 3], decay[has_fwd])
    low, high = current.fwd_fraction * (1 - MAX_STEP_CHANGE), current.fwd_fraction * (1 + MAX_STEP_CHANGE)
    return float(min(max(median, low, 0.05), high, 0.95))


# ---------------------------------------------------------------------------------------------
# Memory and drift
# ---------------------------------------------------------------------------------------------


def lowered_capacity(
    capacity_tokens: int,
    peak_bytes: float,
    usable_bytes: float | None,
    predicted_peak_bytes: float | None,
    corrected_tokens: int | None = None,
) -> tuple[int, Literal["near-device-memory", "above-predicted-peak"], float] | None:
    """(new capacity, reason, limit) when a measured peak calls for a lower capacity, else None.

    Near device memory (`peak >= (1 - MEMORY_MARGIN) * usable`): the capacity is scaled by
    `(1 - 2 * MEMORY_MARGIN) * usable / peak`, so the same micro-batch would peak a margin below
    the threshold. Above the predicted peak: `corrected_tokens`, the capacity the memory model
    corrected by the measurement allows (`corrected_capacity`), where one is known; else the
    capacity scaled by `predicted / peak`, the whole peak (static bytes included: the safe side).
    The lower of the two wins, and a capacity is never raised here.
    """
    candidates = []
    if usable_bytes is not None and peak_bytes >= (1 - MEMORY_MARGIN) * usable_bytes:
        tokens = math.floor(capacity_tokens * (1 - 2 * MEMORY_MARGIN) * usable_bytes / peak_bytes)
        candidates.append((tokens, "near-device-memory", usable_bytes))
    if predicted_peak_bytes is not None and peak_bytes > predicted_peak_bytes:
        if corrected_tokens is None:
            corrected_tokens = math.floor(capacity_tokens * predicted_peak_bytes / peak_bytes)
        if corrected_tokens < capacity_tokens:
            candidates.append((corrected_tokens, "above-predicted-peak", predicted_peak_bytes))
    if not candidates:
        return None
    tokens, reason, limit = min(candidates, key=lambda candidate: candidate[0])
    return max(1, min(capacity_tokens - 1, tokens)), reason, limit


def corrected_memory(peaks: Sequence[tuple[int, float, float]]) -> tuple[float, float]:
    """The scheme's memory correction `(activation scale, extra static bytes)` from its measured
    peaks `(step, a, y)`: a the model's activation bytes of the pipeline's micro-batches, y the
    peak less the model's static bytes. The slope k of `y ~ k a + e` by least squares (k, e >= 0),
    or, where the sizes lie within 10% of each other and cannot tell k from e, the largest `y / a`;
    never below 1 (a correction never promises more than the profile's model); then e the least that
    puts every measured peak on or under the line, and k x (1 + MEMORY_MARGIN). A small
    micro-batch's peak, where the allocator's fixed bytes weigh most, then moves e rather than k:
    scaling the activations by one peak's ratio cut a capacity by a quarter on one noisy
    292-token peak (`benchmarks/closed_loop.py --scenario memory`, results/closed_loop-memory.md)."""
    sizes = np.array([a for _, a, _ in peaks], dtype=float)
    excess = np.array([y for _, _, y in peaks], dtype=float)
    if len(sizes) == 0:
        return 1.0, 0.0
    if sizes.max() <= 0:  # no activations to blame: the static bytes
        return 1.0 + MEMORY_MARGIN, max(0.0, float(excess.max()))
    sized = sizes > 0
    if sizes.min() >= 0.9 * sizes.max():
        slope = float(np.max(excess[sized] / sizes[sized]))
    else:
        (slope, _), _ = nnls(np.column_stack([sizes, np.ones(len(sizes))]), excess)
    scale = max(float(slope), 1.0)
    extra = max(0.0, float(np.max(excess - scale * sizes)))
    return scale * (1 + MEMORY_MARGIN), extra


def corrected_capacity(profile: CostProfile, entry: SchemeCost, scale: float, extra: float) -> int | None:
    """The capacity the scheme's memory model derives once corrected by the measurements
    (`derive_capacity_tokens` with the activation bytes x `scale` and `extra` static bytes): from
    the profile's model, not the current capacity, so a lasting under-prediction lowers the
    capacity once, to where the corrected model fits the device, and not again every step. None
    where the profile derives no capacity (no device memory or no memory model)."""
    if profile.gpu_memory_bytes is None or entry.static_bytes is None or entry.activation_bytes_per_token is None:
        return None
    corrected = scaled_activations(entry, scale).model_copy(
        update={"capacity_tokens": None, "static_bytes": entry.static_bytes + extra}
    )
    return derive_capacity_tokens(profile, corrected)


def scaled_activations(entry: SchemeCost, scale: float) -> SchemeCost:
    """The scheme's memory model with its activation bytes (every term the profile gives) x `scale`."""
    terms = (
        "activation_bytes_per_token",
        "activation_bytes_per_token_sq",
        "activation_bytes_per_longest_sq",
        "activation_bytes_per_longest_pow",
    )
    return entry.model_copy(
        update={term: value * scale for term in terms if (value := getattr(entry, term)) is not None}
    )


def is_error_jump(error: float, history: Sequence[float]) -> tuple[bool, float]:
    """(jumped, recent median): the step's median error is over DRIFT_RATIO x the median of the
    last DRIFT_RECENT_STEPS steps' and over DRIFT_MIN_ERROR (at least 3 steps of history)."""
    recent = list(history)[-DRIFT_RECENT_STEPS:]
    if len(recent) < 3:
        return False, float(np.median(recent)) if recent else 0.0
    median = float(np.median(recent))
    return error > DRIFT_RATIO * median and error > DRIFT_MIN_ERROR, median


def predicted_peak_bytes(
    entry: SchemeCost,
    micro_batches: Sequence[MeasuredMicroBatch],
    activation_scale: float = 1.0,
    extra_bytes: float = 0.0,
) -> float | None:
    """Static bytes plus the in-flight micro-batches' activations at 1F1B stage 0's peak, each
    taken as large as the pipeline's largest (the planner's memory model, `derive_capacity_tokens`).
    A measured micro-batch carries no lengths, so its longest sequence is bounded by the root of
    its sum of squares (the `m3` and `m4` terms read as upper bounds). With a session's memory
    correction (`corrected_memory`): the activations x `activation_scale`, `extra_bytes` on the
    static ones."""
    if entry.static_bytes is None or entry.activation_bytes_per_token is None or not micro_batches:
        return None
    in_flight = min(entry.in_flight_micro_batches or entry.pp, len(micro_batches))
    per_square = entry.activation_bytes_per_token_sq + entry.activation_bytes_per_longest_sq
    per_power = entry.activation_bytes_per_longest_pow
    largest = max(
        entry.activation_bytes_per_token * mb.num_tokens
        + per_square * mb.sum_sq_tokens
        + per_power * mb.sum_sq_tokens ** (LONGEST_POWER / 2)
        for mb in micro_batches
    )
    return entry.static_bytes + extra_bytes + activation_scale * in_flight * largest


# ---------------------------------------------------------------------------------------------
# One step
# ---------------------------------------------------------------------------------------------


def coefficients_at(state: OnlineFitState, profile: CostProfile, version: int) -> dict[tuple[int, ...], Coefficients]:
    """Every scheme's coefficients at `version` (the profile's where never refitted before it).

    Raises `ValueError` for a version newer than the state's or older than the kept snapshots.
    """
    if version > state.version:
        raise ValueError(f"profile version {version} is newer than the session's current version {state.version}")
    if version == 0:
        return {entry.key: prior_coefficients(profile, entry) for entry in profile.schemes}
    snapshot = next((schemes for kept, schemes in state.snapshots if kept == version), None)
    if snapshot is None:
        oldest = min((kept for kept, _ in state.snapshots), default=state.version)
        raise ValueError(f"profile version {version} is older than the oldest kept ({oldest}, or 0)")
    shared = next((scales for kept, scales in state.shared_snapshots if kept == version), (1.0, 1.0, 1.0))
    known = {entry.key: _scaled(prior_coefficients(profile, entry), shared) for entry in profile.schemes}
    known.update({coefficients.key: coefficients for coefficients in snapshot})
    return known


def _scaled(coefficients: Coefficients, shared: tuple[float, float, float]) -> Coefficients:
    """A scheme without a window priced by the shared term scales."""
    if shared == (1.0, 1.0, 1.0):
        return coefficients
    scale_a, scale_b, scale_c = shared
    return coefficients.model_copy(
        update={"a": coefficients.a * scale_a, "b": coefficients.b * scale_b, "c": coefficients.c * scale_c}
    )


def apply_step(
    state: OnlineFitState, profile: CostProfile, pipelines: Sequence[MeasuredPipeline], planned_version: int
) -> OnlineFitState:
    """The state after one step's measurements, planned with `planned_version` of the profile.

    Scores the step against that version (its median relative error, an error jump), refits every
    measured scheme, lowers capacities on measured peaks, and makes a new version when anything
    changed. Raises `ValueError` for a scheme the profile does not have or an unknown version.
    """
    entries = {entry.key: entry for entry in profile.schemes}
    for pipeline in pipelines:
        if pipeline.scheme not in entries:
            raise ValueError(f"scheme {scheme_name(pipeline.scheme)} is not in the session's profile")
    planned = coefficients_at(state, profile, planned_version)
    step = state.num_steps + 1
    # per-rank slowdowns first: a slow rank's pipelines are then scored and refitted with their
    # times divided by its factor, so one slow rank does not drag its scheme's fit (`rank_speed`)
    ratios = [
        PipelineRatio(
            p.ranks,
            sum(mb.time_s for mb in p.micro_batches),
            p.predicted_s,
            p.slowdown,
            p.rank_compute_s,
            stage_size=p.scheme[0] * p.scheme[2],
            rank_work=p.rank_work,
        )
        for p in pipelines
        if p.ranks and p.predicted_s and p.micro_batches
    ]
    observations = kept_observations([*state.rank_observations, *step_observations(step, ratios)], step)
    slow_ranks = rank_factors(observations, step)
    pipelines = [p.normalized(max([1.0, *(slow_ranks.get(rank, 1.0) for rank in p.ranks)])) for p in pipelines]
    rank_update = {"rank_observations": observations, "rank_slowdowns": slow_ranks}
    errors = [  # capped at MAX_ERROR: an absurd time is still a number the state can keep
        min(abs(planned[p.scheme].stage_time_s(mb.sum_sq_tokens, mb.num_tokens) - mb.time_s) / mb.time_s, MAX_ERROR)
        for p in pipelines
        for mb in p.micro_batches
    ]
    next_version = state.version + 1
    new_errors, new_drift = list(state.errors), list(state.drift)
    restart_step = None
    if errors:
        median = float(np.median(errors))
        jumped, recent = is_error_jump(median, [error.median_error for error in state.errors])
        if jumped:
            if state.drift and state.drift[-1].step == step - 1:  # two in a row: a new regime, not a straggler
                restart_step = step - 1
            new_drift.append(
                DriftEvent(version=next_version, step=step, median_error=median, recent_median_error=recent)
            )
        new_errors.append(
            StepError(step=step, profile_version=planned_version, median_error=median, num_micro_batches=len(errors))
        )
    windows = {window.current.key: window for window in state.schemes}
    shared = _refit_windows(windows, profile, pipelines, step, restart_step, state.shared)
    changed = shared is not None
    changes = _lower_capacities(windows, profile, pipelines, step, next_version, shared or state.shared)
    if not changed and not changes:
        return state.model_copy(
            update={
                "num_steps": step,
                "errors": new_errors[-KEPT_ERRORS:],
                "drift": new_drift[-KEPT_EVENTS:],
                **rank_update,
            }
        )
    schemes = [windows[key] for key in sorted(windows)]
    snapshots = [*state.snapshots, (next_version, [window.current for window in schemes])][-KEPT_VERSIONS:]
    shared = state.shared if shared is None else shared
    return OnlineFitState(
        shared=shared,
        shared_snapshots=[*state.shared_snapshots, (next_version, shared)][-KEPT_VERSIONS:],
        version=next_version,
        num_steps=step,
        schemes=schemes,
        snapshots=snapshots,
        errors=new_errors[-KEPT_ERRORS:],
        capacity_changes=[*state.capacity_changes, *changes][-KEPT_EVENTS:],
        drift=new_drift[-KEPT_EVENTS:],
        **rank_update,
    )


def _refit_windows(
    windows: dict[tuple[int, ...], SchemeWindow],
    profile: CostProfile,
    pipelines: Sequence[MeasuredPipeline],
    step: int,
    restart_step: int | None,
    shared: tuple[float, float, float],
) -> tuple[float, float, float] | None:
    """Add the step's micro-batches to each scheme's window, refit the shared term scales over
    every window, then refit every window towards its prior at those scales (in place). Returns
    the new shared scales, or None when the step measured nothing (nothing refitted). With
    `restart_step` (a confirmed error jump), the measured schemes' windows keep only the
    micro-batches from that step on: the old regime no longer holds the fit back."""
    new_rows: dict[tuple[int, ...], list[tuple[int, float, float, float, float]]] = {}
    for pipeline in pipelines:
        new_rows.setdefault(pipeline.scheme, []).extend(
            (step, mb.sum_sq_tokens, mb.num_tokens, mb.time_s, -1.0 if mb.fwd_s is None else mb.fwd_s)
            for mb in pipeline.micro_batches
        )
    if not any(new_rows.values()):
        return None
    entries = {entry.key: entry for entry in profile.schemes}
    oldest = step - WINDOW_STEPS + 1
    for key in windows.keys() | new_rows.keys():
        rows = new_rows.get(key, [])
        window = windows.get(key)
        if window is None:
            if not rows:
                continue
            prior = prior_coefficients(profile, entries[key])
            window = SchemeWindow(prior=prior, current=_scaled(prior, shared))
        first = restart_step if rows and restart_step is not None else oldest
        kept = [row for row in [*window.rows, *rows] if row[0] >= first][-MAX_WINDOW_SAMPLES:]
        windows[key] = window.model_copy(update={"rows": kept})
    shared = shared_term_scales(list(windows.values()), shared, step)
    for key, window in windows.items():
        if window.rows:
            current = refit_coefficients(window.prior, window.current, np.array(window.rows, dtype=float), step, shared)
            windows[key] = window.model_copy(update={"current": current})
    return shared


def _lower_capacities(
    windows: dict[tuple[int, ...], SchemeWindow],
    profile: CostProfile,
    pipelines: Sequence[MeasuredPipeline],
    step: int,
    version: int,
    shared: tuple[float, float, float],
) -> list[CapacityChange]:
    """Lower each scheme's capacity (in place) where its pipelines' measured peaks call for it:
    once per scheme and step, by the most severe of its pipelines."""
    usable = None if profile.gpu_memory_bytes is None else profile.gpu_memory_bytes - profile.memory_reserve_bytes
    entries = {entry.key: entry for entry in profile.schemes}
    lowest: dict[tuple[int, ...], CapacityChange] = {}
    corrections: dict[tuple[int, ...], tuple[list[tuple[int, float, float]], float, float]] = {}
    for pipeline in pipelines:  # first every peak of the step into its scheme's correction
        entry = entries[pipeline.scheme]
        model = predicted_peak_bytes(entry, pipeline.micro_batches)
        if pipeline.peak_bytes is None or model is None:
            continue
        window = windows.get(pipeline.scheme)
        kept = corrections[pipeline.scheme][0] if pipeline.scheme in corrections else (window.peaks if window else [])
        kept = [*kept, (step, model - entry.static_bytes, pipeline.peak_bytes - entry.static_bytes)][-MEMORY_PEAKS:]
        corrections[pipeline.scheme] = (kept, *corrected_memory(kept))
    corrected_tokens = {  # the capacity each corrected scheme's model derives, once per scheme
        key: corrected_capacity(profile, entries[key], scale, extra) for key, (_, scale, extra) in corrections.items()
    }
    for pipeline in pipelines:
        if pipeline.peak_bytes is None:
            continue
        entry = entries[pipeline.scheme]
        window = windows.get(pipeline.scheme)
        scale, extra = (window.activation_scale, window.extra_static_bytes) if window else (1.0, 0.0)
        capacity = (window.capacity_tokens if window else None) or derive_capacity_tokens(profile, entry)
        lowered = lowered_capacity(
            capacity,
            pipeline.peak_bytes,
            usable,
            predicted_peak_bytes(entry, pipeline.micro_batches, scale, extra),
            corrected_tokens.get(pipeline.scheme),
        )
        if lowered is None or lowered[0] >= capacity:
            continue
        tokens, reason, limit = lowered
        known = lowest.get(pipeline.scheme)
        # the lowest capacity; among equal ones (the scheme's correction is one) the worst peak is named
        if known is None or (tokens, -pipeline.peak_bytes) < (known.to_tokens, -known.measured_peak_bytes):
            lowest[pipeline.scheme] = CapacityChange(
                version=version,
                step=step,
                scheme=scheme_name(pipeline.scheme),
                from_tokens=capacity,
                to_tokens=tokens,
                measured_peak_bytes=pipeline.peak_bytes,
                reason=reason,
                limit_bytes=limit,
            )
    for key in lowest.keys() | corrections.keys():
        window = windows.get(key)
        if window is None:
            prior = prior_coefficients(profile, entries[key])
            window = SchemeWindow(prior=prior, current=_scaled(prior, shared))
        update = {}
        if key in lowest:
            update["capacity_tokens"] = lowest[key].to_tokens
        if key in corrections:
            update["peaks"], update["activation_scale"], update["extra_static_bytes"] = corrections[key]
        windows[key] = window.model_copy(update=update)
    return [lowest[key] for key in sorted(lowest)]


def feedback(state: OnlineFitState, since_version: int) -> SessionFeedback:
    """What a plan made with the state's version says (a session's, or `hydraplan run`'s local
    planner's): its version and the capacity changes and error jumps of the versions after
    `since_version` (the previous plan's)."""
    return SessionFeedback(
        profile_version=state.version,
        capacity_changes=[change for change in state.capacity_changes if change.version > since_version],
        error_jumps=[event for event in state.drift if event.version > since_version],
    )


def shared_activation_scale(state: OnlineFitState) -> float:
    """The memory correction of a scheme whose peaks were never measured: the largest activation
    scale of the schemes whose peaks the model under-predicted (1 when none did). A profile's
    memory model is largely one model for every scheme, so its error on one scheme is the best
    guess for the next, and on the safe side: `benchmarks/closed_loop.py --scenario memory` once
    ran a scheme on first use at its uncorrected capacity and went over the device (103%)."""
    under = [window.activation_scale for window in state.schemes if any(y > a for _, a, y in window.peaks)]
    return max([1.0, *under])


def profile_at(state: OnlineFitState, profile: CostProfile) -> CostProfile:
    """`profile` with the state's current coefficients and lowered capacities (its version); the
    schemes whose peaks were never measured at the shared activation scale's capacity, where lower."""
    if state.version == 0:
        return profile
    windows = {window.current.key: window for window in state.schemes}
    unit = profile.seconds_per_unit
    memory_scale = shared_activation_scale(state)
    schemes = []
    for entry in profile.schemes:
        window = windows.get(entry.key)
        if window is None and state.shared == (1.0, 1.0, 1.0) and memory_scale == 1.0:
            schemes.append(entry)
            continue
        current = _scaled(prior_coefficients(profile, entry), state.shared) if window is None else window.current
        update = {
            "a": min(current.a / unit, limits.MAX_COST_A),
            "b": min(current.b / unit, limits.MAX_COST_B),
            "c": min(current.c / unit, limits.MAX_COST_C),
            "fwd_fraction": current.fwd_fraction,
        }
        if window is not None and window.capacity_tokens is not None:
            update["capacity_tokens"] = window.capacity_tokens
        # a scheme whose peaks were never measured borrows the under-predicting schemes' correction
        borrowed = (window is None or not window.peaks) and memory_scale > 1.0
        corrected = corrected_capacity(profile, entry, memory_scale, 0.0) if borrowed else None
        if corrected is not None:
            current_tokens = update.get("capacity_tokens") or derive_capacity_tokens(profile, entry)
            update["capacity_tokens"] = max(1, min(current_tokens, corrected))
        schemes.append(entry.model_copy(update=update))
    notes = f"{profile.notes}; " if profile.notes else ""
    return profile.model_copy(
        update={
            "schemes": schemes,
            "notes": f"{notes}refitted online (cost_models.online_fit), version {state.version}",
        }
    )
