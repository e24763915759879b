"""Boundary types of measured profiles: raw samples, fitted values and where they came from.

A profiled or calibrated `CostProfile` carries a `ProfileProvenance`: the stage-time and memory
samples the profiler took (`StageSample`), the collective timings (`CollectiveSample`), the values
fitted to them with their residuals (`SchemeFit`), the calibrated hardware parameters when the
profile was calibrated, and the hardware, torch version and date of the measurement. All of it is
optional, so profiles written before these fields existed keep loading.

The runtime's profiler produces the samples (it may import this module and `schemas`, nothing
else of the planner); `cost_models.fit` and `cost_models.calibrate` turn them into profiles.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from hydraplan.planner import limits

__all__ = [
    "CapacityChange",
    "CollectiveSample",
    "DriftEvent",
    "ProfileProvenance",
    "SchemeFit",
    "SessionFeedback",
    "StageSample",
    "StepError",
]

MAX_SAMPLES = 100_000  # stage or collective samples one profile may carry
MAX_SAMPLE_SEQUENCES = 1_000_000  # sequences of one measured micro-batch
MAX_RESIDUALS = MAX_SAMPLES

Seconds = Annotated[float, Field(ge=0, le=limits.MAX_TIME_S, allow_inf_nan=False)]
SampleBytes = Annotated[float, Field(ge=0, le=limits.MAX_BYTES, allow_inf_nan=False)]
Degree = Annotated[int, Field(ge=1, le=limits.MAX_NUM_GPUS)]
Ratio = Annotated[float, Field(allow_inf_nan=False)]
Length = Annotated[StrictInt, Field(ge=1, le=limits.MAX_SEQUENCE_TOKENS)]
Count = Annotated[int, Field(ge=0, le=2**62)]
Share = Annotated[float, Field(ge=0, le=1e12, allow_inf_nan=False)]
CollectiveOp = Literal["all_reduce", "all_gather", "send_recv"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StageSample(_Frozen):
    """One measured micro-batch on one PP stage of one scheme (times are medians over repeats)."""

    tp: Degree
    pp: Degree
    cp: Degree = 1
    stage: int = Field(0, ge=0, le=limits.MAX_LAYERS, description="PP stage measured (0 = first).")
    lengths: list[Length] = Field(
        min_length=1, max_length=MAX_SAMPLE_SEQUENCES, description="Sequence lengths of the packed micro-batch."
    )
    mix: str = Field("", max_length=64, description="Length mix the micro-batch was drawn from (long, short, ...).")
    time_s: Seconds | None = Field(None, description="Forward+backward time, seconds; None after out-of-memory.")
    fwd_s: Seconds | None = Field(None, description="Forward time, seconds.")
    activation_bytes: SampleBytes | None = Field(
        None, description="Peak activation bytes of the micro-batch on one rank (saved tensors or allocator)."
    )
    peak_bytes: SampleBytes | None = Field(
        None,
        description="Real peak memory one forward+backward adds on one rank above what it held before "
        "(gradients already allocated): the allocator's peak on CUDA, the process's resident high-water "
        "mark on CPU. The capacity is fitted to it; None where not measured (older profiles).",
    )
    peak_median_bytes: SampleBytes | None = Field(
        None,
        description="Median of the real peaks of the measured steps (peak_bytes is their largest): the "
        "trend the memory fit follows, its margin taken from how far peak_bytes exceeds it. None in "
        "older profiles (the fit then follows peak_bytes with a fixed margin).",
    )
    static_bytes: SampleBytes | None = Field(
        None, description="Weights, gradients and optimizer state of the stage on one rank, bytes."
    )
    repeats: int = Field(1, ge=1, le=1_000_000, description="Timed repeats the medians are over.")
    oom: bool = Field(False, description="The micro-batch ran out of memory (its token count is over capacity).")

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.tp, self.pp, self.cp)

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def sum_sq_tokens(self) -> int:
        return sum(length * length for length in self.lengths)


class CollectiveSample(_Frozen):
    """Median time of one collective over `ranks` ranks for a buffer of `bytes` per rank."""

    op: CollectiveOp
    ranks: int = Field(ge=2, le=limits.MAX_NUM_GPUS)
    bytes: int = Field(ge=1, le=int(limits.MAX_BYTES))
    seconds: Seconds


class SchemeFit(_Frozen):
    """What `cost_models.fit` fitted for one scheme, with its residuals (measured relative error)."""

    tp: Degree
    pp: Degree
    cp: Degree = 1
    a: Ratio
    b: Ratio
    c: Ratio
    fwd_fraction: Ratio
    static_bytes: Ratio
    activation_bytes_per_token: Ratio
    activation_bytes_per_token_sq: Ratio
    activation_bytes_per_longest_sq: Ratio = Field(
        0.0,
        description="Bytes per squared length of a micro-batch's longest sequence (m3); left out of the JSON when 0.",
        exclude_if=lambda value: value == 0,
    )
    activation_bytes_per_longest_pow: Ratio = Field(
        0.0,
        description="Bytes per max(l)^2.5 of a micro-batch's longest sequence (m4); left out of the JSON when 0.",
        exclude_if=lambda value: value == 0,
    )
    num_samples: int = Field(ge=0)
    time_residuals: list[Ratio] = Field(
        default_factory=list, max_length=MAX_RESIDUALS, description="(predicted - measured) / measured per sample."
    )
    memory_residuals: list[Ratio] = Field(default_factory=list, max_length=MAX_RESIDUALS)
    time_median_abs_error: Ratio = Field(0.0, description="Median |residual| of stage time (0.05 = 5%).")
    time_p95_abs_error: Ratio = 0.0
    memory_median_abs_error: Ratio = 0.0
    capacity_from_oom_tokens: int | None = Field(
        None, ge=1, description="Smallest token count that ran out of memory, when one did."
    )
    memory_fitted_to: Literal["", "real_peak", "saved_tensors"] = Field(
        "",
        description="What the memory model was fitted to: the real peak a micro-batch adds (allocator or "
        "process), the bytes autograd saves (profiles measured before real peaks were), or nothing.",
    )
    memory_envelope: Ratio = Field(
        1.0, description="Scale that lifts a real-peak fit over every fitted micro-batch (1 = none needed)."
    )
    memory_margin: Ratio = Field(
        0.0,
        description="Safety margin on top of the envelope (0.02 = 2%): 2% where the step noise was metered "
        "(several steps per micro-batch; its bytes are added too, memory_noise_bytes), 5% where it was not. "
        "Profiles fitted before Dec 3 2026: the larger of 5% and the largest step noise as a ratio. "
        "memory_residuals include every margin.",
    )
    memory_noise_bytes: Ratio = Field(
        0.0,
        description="Bytes added to a real-peak fit for the step noise: the largest excess of a fitted "
        "micro-batch's largest step peak over its median step peak. Left out of the JSON when 0.",
        exclude_if=lambda value: value == 0,
    )
    max_measured_tokens: int | None = Field(
        None, ge=1, description="Largest micro-batch measured, tokens: the fit is extrapolated beyond it."
    )
    max_measured_length: int | None = Field(
        None, ge=1, description="Longest single sequence measured: stage times beyond it are extrapolated."
    )


class ProfileProvenance(_Frozen):
    """Where a measured or calibrated profile came from."""

    device: str = Field("", max_length=64, description="Device kind measured: cpu or cuda.")
    hardware: str = Field("", max_length=512, description="CPU or GPU model, cores, memory.")
    torch_version: str = Field("", max_length=64)
    date: str = Field("", max_length=64, description="UTC date and time of the measurement (ISO 8601).")
    model: str = Field("", max_length=256, description="Model measured.")
    num_threads: int | None = Field(None, ge=1, description="Intra-op threads per rank (CPU).")
    dtype: str = Field("", max_length=32)
    clock: Literal["", "thread", "wall", "cuda"] = Field(
        "",
        description="How stage times were taken: CPU time of the measuring thread (excludes waits for "
        "peers and for cores other processes hold; communication is then modelled from the measured "
        "collectives), elapsed time, or CUDA events.",
    )
    budget_s: Seconds | None = None
    interrupted: bool = Field(False, description="The measurement ended early (Ctrl-C or budget); partial.")
    samples: list[StageSample] = Field(default_factory=list, max_length=MAX_SAMPLES)
    collectives: list[CollectiveSample] = Field(default_factory=list, max_length=MAX_SAMPLES)
    fits: list[SchemeFit] = Field(default_factory=list, max_length=limits.MAX_NUM_GPUS)
    calibration: dict[str, Ratio] | None = Field(
        None, description="Fitted hardware parameters (cost_models.analytic.HardwareParams) of a calibrated profile."
    )
    calibration_error: dict[str, Ratio] | None = Field(
        None, description="Calibration fit error on its samples: median and p95 |relative error|."
    )
    measured_file: str = Field("", max_length=4096, description="Measured profile a calibration was fitted to.")


# ---------------------------------------------------------------------------------------------
# The closed loop of a planning session (issue 31): cost_models.online_fit and the service
# ---------------------------------------------------------------------------------------------


class StepError(_Frozen):
    """How far one measured step was from the profile version that planned it (online refit)."""

    step: Count = Field(description="1 for the first measured step of the session.")
    profile_version: Count = Field(description="The version that planned the step, which the error is against.")
    median_error: Share = Field(description="Median |predicted - measured| / measured stage time.")
    num_micro_batches: Count


class CapacityChange(_Frozen):
    """A capacity the online refit lowered at once on a measured peak (cost_models.online_fit)."""

    version: Count = Field(description="The profile version that first has the lowered capacity.")
    step: Count
    scheme: str = Field(max_length=64, description="'<tp,pp,cp>'.")
    from_tokens: Count
    to_tokens: Count
    measured_peak_bytes: SampleBytes
    reason: Literal["near-device-memory", "above-predicted-peak"]
    limit_bytes: SampleBytes = Field(description="The usable memory (near-device-memory) or the predicted peak.")


class DriftEvent(_Frozen):
    """An error jump: a step's median error over 3x the recent median and over 10% (a slow node, a degraded
    link, a new kernel)."""

    version: Count = Field(description="The profile version current after the step.")
    step: Count
    median_error: Share
    recent_median_error: Share


class SessionFeedback(_Frozen):
    """What a planning session's closed loop tells the plan it made."""

    profile_version: int = Field(
        ge=0, description="Version of the session's refitted profile this plan was planned with (0: the original)."
    )
    capacity_changes: list[CapacityChange] = Field(
        default_factory=list,
        max_length=64,
        description="Capacities lowered on measured peaks since the session's previous plan (this plan obeys them).",
    )
    error_jumps: list[DriftEvent] = Field(
        default_factory=list, max_length=64, description="Error jumps measured since the session's previous plan."
    )
