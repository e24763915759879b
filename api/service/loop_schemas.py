"""Bodies of a session's closed loop (issue 31): one step's measurements in, the refit out.

`POST /v1/sessions/{id}/measurements` takes a `MeasurementsBody`; `GET /v1/sessions/{id}` shows
the refit as a `SessionFit`. Every list is bounded, every number a finite, positive JSON number of
its own kind (a count is an integer, `"5"` and `true` are refused), like every other body.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictInt, model_validator

from hydraplan.planner import limits
from hydraplan.planner.measurements import CapacityChange, DriftEvent, StepError
from hydraplan.planner.schemas import SchemeModel

MAX_MEASURED_PIPELINES = 4096  # pipelines of one step (a 16,384-GPU run of 4-GPU pipelines)
MAX_PIPELINE_MICRO_BATCHES = 4096  # micro-batches of one pipeline in one step
MAX_STEP_MICRO_BATCHES = 65_536  # over the whole body: ~5 MB of JSON, a few ms to refit
MAX_COLLECTIVES = 1024

Seconds = Annotated[float, Strict(), Field(gt=0, le=limits.MAX_TIME_S, allow_inf_nan=False)]
Work = Annotated[float, Field(gt=0, le=1e30, allow_inf_nan=False)]  # relative FLOPs (ints taken too)
PeakBytes = Annotated[float, Strict(), Field(gt=0, le=limits.MAX_BYTES, allow_inf_nan=False)]
Rank = Annotated[StrictInt, Field(ge=0, lt=limits.MAX_NUM_GPUS)]
SlowdownFactor = Annotated[float, Strict(), Field(ge=1, le=limits.MAX_RANK_SLOWDOWN, allow_inf_nan=False)]
Tokens = Annotated[StrictInt, Field(ge=1, le=limits.MAX_BATCH_TOKENS)]
SquaredTokens = Annotated[StrictInt, Field(ge=1, le=limits.MAX_BATCH_TOKENS**2)]


class LoopModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MeasuredMicroBatchBody(LoopModel):
    """One micro-batch of one pipeline: the stage-time model's features and its measured time."""

    num_tokens: Tokens = Field(description="Tokens of the micro-batch: sum of its sequence lengths.")
    sum_sq_tokens: SquaredTokens = Field(description="Sum of its sequence lengths squared (the attention feature).")
    time_s: Seconds = Field(
        description="Measured forward+backward time on the pipeline's slowest PP stage, seconds (the profile's "
        "stage time)."
    )
    fwd_s: Seconds | None = Field(None, description="Its forward part, seconds (refits the forward fraction).")

    @model_validator(mode="after")
    def _consistent(self) -> MeasuredMicroBatchBody:
        if not self.num_tokens <= self.sum_sq_tokens <= self.num_tokens**2:
            raise ValueError(
                f"sum_sq_tokens {self.sum_sq_tokens} is impossible for {self.num_tokens} tokens: it lies between "
                "num_tokens (every length 1) and num_tokens^2 (one sequence)"
            )
        if self.fwd_s is not None and self.fwd_s >= self.time_s:
            raise ValueError(f"fwd_s {self.fwd_s} must be less than time_s {self.time_s} (forward + backward)")
        return self


def per_rank(description: str) -> Any:
    """An optional list of one value per rank of a pipeline (1 to MAX_NUM_GPUS values)."""
    return Field(None, min_length=1, max_length=limits.MAX_NUM_GPUS, description=description)


class MeasuredPipelineBody(LoopModel):
    """One pipeline's measurements of the step."""

    scheme: SchemeModel = Field(description="Its <tp,pp,cp>; a scheme of the session's profile.")
    micro_batches: list[MeasuredMicroBatchBody] = Field(
        default_factory=list, max_length=MAX_PIPELINE_MICRO_BATCHES, description="Its micro-batches, any order."
    )
    peak_memory_bytes: list[PeakBytes] | None = per_rank(
        "Measured peak memory of each of its ranks (at most tp*pp*cp values), bytes: the allocator's peak, "
        "workspace included. The largest is compared with the usable device memory and the predicted peak."
    )

    ranks: list[Rank] | None = per_rank(
        "Its ranks (the plan's pipeline ranks, tp*pp*cp of them, distinct): with predicted_s, what the session "
        "estimates slow ranks from."
    )
    predicted_s: Seconds | None = Field(
        None,
        description="The plan's predicted stage time of the measured micro-batches, summed (their stage_time_s in "
        "the plan, its slowdown included), seconds.",
    )
    slowdown: SlowdownFactor | None = Field(
        None, description="The pipeline's slowdown factor in the plan (PipelinePlan.slowdown); absent: 1."
    )
    rank_compute_s: list[Seconds] | None = per_rank(
        "Each rank's compute time over the step (thread CPU on CPU ranks), in the order of ranks: what tells a "
        "slow rank from the others of its pipeline (within its PP stage, whose TP x CP ranks do equal work; with "
        "rank_work, across stages too)."
    )
    rank_work: list[Work] | None = per_rank(
        "Each rank's expected work over the step (its stage's forward FLOPs over its TP x CP ranks; relative "
        "values suffice), in the order of ranks: with rank_compute_s, every rank of the pipeline is compared by "
        "its compute over its work, across PP stages too."
    )

    @model_validator(mode="after")
    def _ranks(self) -> MeasuredPipelineBody:
        num_gpus = self.scheme.tp * self.scheme.pp * self.scheme.cp
        if self.ranks is not None and (len(self.ranks) != num_gpus or len(set(self.ranks)) != num_gpus):
            raise ValueError(f"ranks {self.ranks[:8]} must be the scheme's {num_gpus} distinct ranks")
        if self.predicted_s is not None and not self.micro_batches:
            raise ValueError("predicted_s is the prediction of the micro_batches: give them too")
        if self.rank_work is not None and (
            self.rank_compute_s is None or self.ranks is None or len(self.rank_work) != len(self.ranks)
        ):
            raise ValueError(
                f"rank_work has {len(self.rank_work)} values: one per rank of ranks, beside rank_compute_s "
                f"({'absent' if self.rank_compute_s is None else len(self.rank_compute_s)})"
            )
        if self.rank_compute_s is not None and (self.ranks is None or len(self.rank_compute_s) != len(self.ranks)):
            raise ValueError(
                f"rank_compute_s has {len(self.rank_compute_s)} values: one per rank of ranks "
                f"({'absent' if self.ranks is None else len(self.ranks)})"
            )
        if self.peak_memory_bytes is not None and len(self.peak_memory_bytes) > num_gpus:
            raise ValueError(
                f"peak_memory_bytes has {len(self.peak_memory_bytes)} values, more than the scheme's {num_gpus} ranks"
            )
        if not self.micro_batches and self.peak_memory_bytes is None:
            raise ValueError("give micro_batches, peak_memory_bytes or both")
        return self


class CollectiveTime(LoopModel):
    """One measured collective (kept as a count for now: the refit uses stage times)."""

    op: Literal["all_reduce", "all_gather", "reduce_scatter", "send_recv"]
    ranks: Annotated[StrictInt, Field(ge=2, le=limits.MAX_NUM_GPUS)]
    bytes: Annotated[StrictInt, Field(ge=1, le=int(limits.MAX_BYTES))]
    seconds: Seconds


class MeasurementsBody(LoopModel):
    """POST /v1/sessions/{id}/measurements: what one training step measured."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "profile_version": 0,
                    "pipelines": [
                        {
                            "scheme": {"tp": 1, "pp": 2, "cp": 1},
                            "micro_batches": [
                                {"num_tokens": 4096, "sum_sq_tokens": 8388608, "time_s": 0.41, "fwd_s": 0.13}
                            ],
                            "peak_memory_bytes": [61e9, 58e9],
                        }
                    ],
                }
            ]
        }
    )

    profile_version: Annotated[StrictInt, Field(ge=0, le=2**62)] | None = Field(
        None,
        description="The profile version of the plan the step ran (plan.session_feedback.profile_version), which "
        "its error is measured against; default the session's current version.",
    )
    pipelines: list[MeasuredPipelineBody] = Field(min_length=1, max_length=MAX_MEASURED_PIPELINES)
    collectives: list[CollectiveTime] = Field(default_factory=list, max_length=MAX_COLLECTIVES)

    @model_validator(mode="after")
    def _bounded(self) -> MeasurementsBody:
        total = sum(len(pipeline.micro_batches) for pipeline in self.pipelines)
        if total > MAX_STEP_MICRO_BATCHES:
            raise ValueError(f"{total} micro-batches in all, more than the limit of {MAX_STEP_MICRO_BATCHES}")
        seen: set[int] = set()
        for index, pipeline in enumerate(self.pipelines):
            twice = seen.intersection(pipeline.ranks or ())
            if twice:
                raise ValueError(f"pipelines[{index}].ranks: rank {min(twice)} is in an earlier pipeline too")
            seen.update(pipeline.ranks or ())
        return self


class SchemeRefit(LoopModel):
    """One refitted scheme: its original and current stage-time coefficients (seconds) and capacity."""

    scheme: str = Field(description="'<tp,pp,cp>'.")
    a: float = Field(description="Current seconds per squared token.")
    b: float = Field(description="Current seconds per token.")
    c: float = Field(description="Current seconds per micro-batch.")
    fwd_fraction: float
    prior_a: float = Field(description="The session's original profile's a, seconds per squared token.")
    prior_b: float
    prior_c: float
    capacity_tokens: int | None = Field(None, description="Lowered capacity; None: the original profile's.")
    activation_scale: float = Field(
        1.0, description="The memory model's activation bytes times this, as measured peaks showed them (>= 1)."
    )
    extra_static_bytes: float = Field(
        0.0, description="Bytes added to the memory model's static bytes by peaks of micro-batches too small to tell."
    )
    num_micro_batches: int = Field(description="Micro-batches in the fit's window.")


class SharedScales(LoopModel):
    """Scales of the original profile's terms that every scheme's data shows (cost_models/online_fit.py,
    `shared_term_scales`): schemes never measured are priced with them, refits are pulled towards them."""

    a: float = Field(1.0, description="Scale of every scheme's a (seconds per squared token).")
    b: float = Field(1.0, description="Scale of every scheme's b (seconds per token).")
    c: float = Field(1.0, description="Scale of every scheme's c (seconds per micro-batch).")
    activation_bytes: float = Field(
        1.0,
        description="Scale of the memory model's activation bytes for the schemes whose peaks were never measured: "
        "the largest `activation_scale` of the schemes whose peaks the model under-predicted (capacities derived "
        "with it where lower).",
    )


class SessionFit(LoopModel):
    """The closed loop of a session: its profile version, what the refit changed, its error history."""

    version: int = Field(0, description="Current profile version (0: the session's original profile).")
    num_steps: int = Field(0, description="Steps whose measurements were posted.")
    schemes: list[SchemeRefit] = Field(default_factory=list, description="Schemes the refit changed.")
    shared_scales: SharedScales = Field(
        default_factory=SharedScales,
        description="The original profile's terms scaled as every measured scheme shows: the pricing of the schemes "
        "not in `schemes`.",
    )
    errors: list[StepError] = Field(
        default_factory=list,
        description="The last steps' median stage-time errors against the version that planned them.",
    )
    capacity_changes: list[CapacityChange] = Field(default_factory=list, description="The last capacities lowered.")
    error_jumps: list[DriftEvent] = Field(default_factory=list, description="The last error jumps.")
    last_error_jump: DriftEvent | None = Field(None, description="The latest error jump, if any.")
    rank_slowdowns: dict[int, float] = Field(
        default_factory=dict,
        description="Ranks the session estimates slow, with their slowdown factors (> 1): the median over the last "
        "steps of their pipelines' measured/predicted ratio over the step's fastest pipeline "
        "(cost_models/rank_speed.py). The session's next plans carry them as rank_slowdowns.",
    )
