"""Request and response bodies of the REST API, composed from the planner's boundary types.

The planner's types (`SolverOptions`, `ModelSpec`, `GpuSpec`, `CostProfile`, `Plan`) are embedded
unchanged, so a field the planner adds appears in the API without an edit here. Every body is
frozen and rejects unknown fields, like the planner's own.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from hydraplan.api.service.loop_schemas import SessionFit
from hydraplan.api.service.problems import Problem
from hydraplan.api.whatif.schemas import WhatifRow
from hydraplan.planner import limits
from hydraplan.planner.budget import AUTO
from hydraplan.planner.schemas import (
    CostProfile,
    GpuSpec,
    ModelSpec,
    Plan,
    PlanRequest,
    SchemeModel,
    SolverOptions,
    StrategyText,
    TimeLimit,
    TokenCount,
    TrainingRecipe,
    check_rank_slowdowns,
    previous_strategy_fits,
)
from hydraplan.planner.schemas import GpusPerNode as PlannerGpusPerNode
from hydraplan.planner.schemas import NumGpus as PlannerNumGpus
from hydraplan.planner.strategies import check_strategy_fits

# The planner's bounds (planner/limits.py) apply as the body is parsed; the server's settings may
# lower some of them (checked by api.service.planning.Planning.check_limits).
Lengths = Annotated[
    list[TokenCount],
    Field(
        min_length=1,
        max_length=limits.MAX_SEQUENCES,
        description="Token length of every sequence of the global batch (JSON integers).",
    ),
]
# JSON integers only, like the lengths: "8", 8.0 and true are refused, not coerced.
NumGpus = Annotated[PlannerNumGpus, Strict(), Field(description="GPUs in the cluster (N).")]
GpusPerNode = Annotated[PlannerGpusPerNode, Strict(), Field(description="GPUs per node; TP groups stay inside one.")]
ModelRef = Annotated[
    str | ModelSpec | None,
    Field(description="Catalog model name (GET /v1/models) or an inline ModelSpec; needs gpu."),
]
GpuRef = Annotated[
    str | GpuSpec | None,
    Field(description="Catalog GPU name (GET /v1/gpus) or an inline GpuSpec; needs model."),
]
RecipeRef = Annotated[
    TrainingRecipe | None,
    Field(
        description="The training recipe the analytic profile of model + gpu is built for (default: selective "
        "recompute, ZeRO-1, fp32 gradients reduced in bf16, nothing overlapped, catalog efficiency)."
    ),
]
InlineProfile = Annotated[CostProfile | None, Field(description="An inline cost profile (instead of model + gpu).")]
ProfileId = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=128,
        description="Id of a profile uploaded with POST /v1/profiles (instead of model + gpu).",
    ),
]
Baselines = Annotated[
    list[str],
    Field(max_length=8, description="Baselines to run on the same batch for comparison."),
]

TINY_EXAMPLE: dict[str, Any] = {
    "lengths": [4096, 1024, 512, 8192, 2048, 300, 7000, 128],
    "num_gpus": 8,
    "gpus_per_node": 8,
    "model": "tiny",
    "gpu": "h100-sxm-80gb",
    "options": {"time_limit_s": 0.5, "seed": 0},
}


class ApiModel(BaseModel):
    """Base of the API's own bodies: immutable, unknown fields rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def check_source(body: Any, *, required: bool) -> None:
    """Exactly one of (model + gpu), profile and profile_id (or none when not `required`)."""
    given = [name for name in ("model", "gpu", "profile", "profile_id") if getattr(body, name)]
    if ("model" in given) != ("gpu" in given):
        present, missing = ("model", "gpu") if "model" in given else ("gpu", "model")
        raise ValueError(f"{present} is given but {missing} is missing: give both or neither")
    sources = [name for name in given if name != "gpu"]
    if len(sources) > 1:
        named = ", ".join("model+gpu" if name == "model" else name for name in sources)
        raise ValueError(f"give only one of model+gpu, profile or profile_id; got {named}")
    if required and not sources:
        raise ValueError("a cost source is required: give model+gpu, profile or profile_id")
    if getattr(body, "recipe", None) is not None and "model" not in given:
        raise ValueError("recipe applies to the analytic profile of model+gpu: give model and gpu with it")


class SourceMixin:
    """Where the costs come from: bodies with model, gpu, profile and profile_id fields."""

    def source_kind(self) -> Literal["catalog", "profile", "profile_id"] | None:
        """Which source the body gives (None when it gives none)."""
        if self.model is not None:
            return "catalog"
        if self.profile is not None:
            return "profile"
        if self.profile_id is not None:
            return "profile_id"
        return None


VirtualStages = Annotated[
    list[Annotated[int, Strict(), Field(ge=1, le=limits.MAX_VIRTUAL_STAGES)]],
    Field(
        max_length=limits.MAX_VIRTUAL_STAGES,
        description="Chunk counts v the analytic profile of model+gpu also prices every scheme with pp > 1 at "
        "(<tp,pp,cp,v>: interleaved 1F1B, where v divides the layers per stage and the schedule fits in memory); "
        "the search then chooses between them and the plain schemes. Needs model+gpu.",
    ),
]


# a JSON object's keys are strings: a rank key is the decimal digits of a rank
RankKey = Annotated[int, Strict(False), Field(ge=0, le=limits.MAX_NUM_GPUS)]
SlowdownFactor = Annotated[float, Strict(), Field(allow_inf_nan=True)]  # the planner names a bad one


class PlanBody(SourceMixin, ApiModel):
    """POST /v1/plans: one global batch, its cluster, its cost source and the solver options."""

    model_config = ConfigDict(json_schema_extra={"examples": [TINY_EXAMPLE]})

    lengths: Lengths
    num_gpus: NumGpus
    gpus_per_node: GpusPerNode = 8
    model: ModelRef = None
    gpu: GpuRef = None
    recipe: RecipeRef = None
    profile: InlineProfile = None
    profile_id: ProfileId = None
    options: SolverOptions = Field(default_factory=SolverOptions)
    previous_plan: Plan | None = Field(
        None, description="The plan of the previous step: a strategy switch is then costed."
    )
    previous_strategy: StrategyText | None = Field(
        None,
        description="Instead of previous_plan, just its strategy (e.g. '2x<4,1,1>'); it must run on the cluster.",
    )
    baselines: Baselines = []
    virtual_stages: VirtualStages = []
    rank_slowdowns: dict[RankKey, SlowdownFactor] | None = Field(
        None,
        max_length=limits.MAX_NUM_GPUS,
        description="Known slow ranks: rank -> slowdown factor >= 1. A pipeline holding one has its stage times "
        "scaled by the largest factor among its ranks and gets less work; the plan lists the factors it used.",
    )

    _previous_strategy_fits = field_validator("previous_strategy")(previous_strategy_fits)

    @field_validator("previous_plan")
    @classmethod
    def _previous_plan_fits(cls, plan: Plan | None, info: ValidationInfo) -> Plan | None:
        num_gpus, gpus_per_node = info.data.get("num_gpus"), info.data.get("gpus_per_node")
        if plan is not None and num_gpus is not None and gpus_per_node is not None:
            check_strategy_fits(plan.strategy, num_gpus, gpus_per_node, "previous_plan.strategy")
        return plan

    @model_validator(mode="after")
    def _one_source(self) -> PlanBody:
        check_source(self, required=True)
        check_rank_slowdowns(self.rank_slowdowns, self.num_gpus)
        if self.virtual_stages and self.model is None:
            raise ValueError(
                f"virtual_stages {self.virtual_stages}: applies to the analytic profile of model+gpu; a given "
                "profile prices the interleaved schemes it holds"
            )
        return self

    def plan_request(self) -> PlanRequest:
        """The planner's request (its validators apply: whole nodes, positive lengths)."""
        return PlanRequest(
            lengths=self.lengths,
            num_gpus=self.num_gpus,
            gpus_per_node=self.gpus_per_node,
            options=self.options,
            previous_strategy=self.previous_strategy,
            rank_slowdowns=self.rank_slowdowns,
        )


class CheckBody(SourceMixin, ApiModel):
    """POST /v1/plans/check: a plan, optionally the request it claims to answer and a profile."""

    plan: Plan = Field(description="The plan to check.")
    lengths: Lengths | None = Field(None, description="The batch the plan must cover, if given.")
    num_gpus: StrictInt | None = Field(None, ge=1, description="The cluster size it must use, if given.")
    gpus_per_node: StrictInt | None = Field(None, ge=1, description="GPUs per node, if given.")
    options: SolverOptions | None = Field(
        None,
        description="The options the plan was made with: with lengths and num_gpus, the body is the whole request "
        "the plan answers (gpus_per_node 8 unless given): its status is checked against options.gap_tolerance "
        "and, with a cost source (the profile it was planned with), its request_hash.",
    )
    previous_strategy: StrategyText | None = Field(
        None, description="With options: the previous strategy of the request (the plan's previous_strategy)."
    )
    bound: bool = Field(
        False,
        description="Also verify lower_bound_s from the plan's bound certificate with the independent verifier: "
        "needs a cost source (the whole profile the plan was made with, which defines the strategy space).",
    )
    model: ModelRef = None
    gpu: GpuRef = None
    recipe: RecipeRef = None
    profile: InlineProfile = None
    profile_id: ProfileId = None

    @model_validator(mode="after")
    def _at_most_one_source(self) -> CheckBody:
        check_source(self, required=False)
        if self.bound and self.source_kind() is None:
            raise ValueError("bound: verifying the bound needs the profile the plan was made with: give a cost source")
        if (self.options is not None or self.previous_strategy is not None) and (
            self.lengths is None or self.num_gpus is None
        ):
            raise ValueError("options and previous_strategy describe a request: give lengths and num_gpus too")
        return self

    @model_validator(mode="after")
    def _previous_strategy_fits(self) -> CheckBody:
        """The plan's previous strategy is held to the bounds POST /v1/plans applies to one
        (`check_strategy_fits`, linear in the text) before the checker places its pipelines."""
        plan = self.plan
        if plan.previous_strategy is not None:
            check_strategy_fits(plan.previous_strategy, plan.num_gpus, plan.gpus_per_node, "plan.previous_strategy")
        return self


class CheckResult(ApiModel):
    """The checker's verdict; an invalid plan is a 200 with `valid: false`."""

    plan_id: str
    valid: bool
    violations: list[str] = Field(description="Every constraint the plan breaks (empty if valid).")
    verified_bound_s: float | None = Field(
        None,
        description="With bound: the lower bound the verifier proved from the certificate (null when the plan "
        "fails the checker or has no certificate). The plan is valid only when it is at least lower_bound_s.",
    )


class StrategyPart(ApiModel):
    """`num_pipelines` pipelines running the scheme <tp, pp, cp> (<tp, pp, cp, v> with v > 1)."""

    tp: int = Field(ge=1, le=limits.MAX_GPUS_PER_NODE, description="Tensor-parallel degree.")
    pp: int = Field(ge=1, le=limits.MAX_LAYERS, description="Pipeline-parallel degree.")
    cp: int = Field(1, ge=1, le=limits.MAX_NUM_GPUS, description="Context-parallel degree.")
    v: int = Field(
        1, ge=1, le=limits.MAX_LAYERS, description="Model chunks per GPU: 1 is 1F1B, more is interleaved 1F1B."
    )
    num_pipelines: int = Field(ge=1, le=limits.MAX_NUM_GPUS, description="Pipelines with this scheme.")


class EstimateBody(SourceMixin, ApiModel):
    """POST /v1/estimate: cost a fixed strategy (or a baseline's) on a batch, without searching."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {**TINY_EXAMPLE, "strategy": [{"tp": 1, "pp": 1, "cp": 1, "num_pipelines": 8}]},
                {**TINY_EXAMPLE, "baseline": "megatron"},
            ]
        }
    )

    lengths: Lengths
    num_gpus: NumGpus
    gpus_per_node: GpusPerNode = 8
    model: ModelRef = None
    gpu: GpuRef = None
    recipe: RecipeRef = None
    profile: InlineProfile = None
    profile_id: ProfileId = None
    options: SolverOptions = Field(default_factory=SolverOptions)
    strategy: list[StrategyPart] | None = Field(
        None, min_length=1, max_length=16, description="The strategy to cost (or give baseline)."
    )
    baseline: str | None = Field(None, description="A baseline whose strategy to cost.")

    @model_validator(mode="after")
    def _one_source_one_strategy(self) -> EstimateBody:
        check_source(self, required=True)
        if (self.strategy is None) == (self.baseline is None):
            raise ValueError("give exactly one of strategy or baseline")
        if self.strategy is not None:
            text = " + ".join(f"{part.num_pipelines}x<{part.tp},{part.pp},{part.cp}>" for part in self.strategy)
            check_strategy_fits(text, self.num_gpus, self.gpus_per_node, "strategy")
        return self

    def plan_request(self) -> PlanRequest:
        return PlanRequest(
            lengths=self.lengths,
            num_gpus=self.num_gpus,
            gpus_per_node=self.gpus_per_node,
            options=self.options,
        )


class PipelineEstimate(ApiModel):
    """Time and memory of one pipeline of an estimated strategy."""

    index: int
    scheme: SchemeModel
    num_sequences: int
    num_tokens: int
    num_micro_batches: int
    time_s: float = Field(description="Simulated 1F1B time of this pipeline.")
    capacity_tokens: int = Field(description="Most tokens per micro-batch for this scheme.")
    max_micro_batch_tokens: int = Field(description="Tokens of its largest micro-batch.")
    peak_memory_bytes: float | None = Field(
        None,
        description=(
            "Upper bound on the per-GPU peak: static bytes plus in-flight micro-batches times the "
            "activations of the largest one; null when the profile has no memory model."
        ),
    )


class EstimateResult(ApiModel):
    strategy: str
    step_time_s: float
    grad_sync_s: float
    num_gpus: int
    pipelines: list[PipelineEstimate]
    plan: Plan = Field(description="The full plan of the fixed strategy (dispatch and packing).")


class ModelList(ApiModel):
    models: list[ModelSpec]


class GpuList(ApiModel):
    gpus: list[GpuSpec]


class SchemeInfo(ApiModel):
    """One runnable scheme and its costs (times in the profile's time unit, seconds here)."""

    scheme: str = Field(description="<tp,pp,cp>")
    tp: int
    pp: int
    cp: int
    num_gpus: int = Field(description="GPUs one pipeline with this scheme uses.")
    capacity_tokens: int
    a: float = Field(description="Stage time per squared token.")
    b: float = Field(description="Stage time per token.")
    c: float = Field(description="Stage time per micro-batch.")
    static_bytes: float | None = None


class SchemeList(ApiModel):
    model: str
    gpu: str
    num_gpus: int
    gpus_per_node: int
    schemes: list[SchemeInfo]


class ProfileCreated(ApiModel):
    profile_id: str = Field(description="Content hash of the profile: uploading it again is a no-op.")
    num_schemes: int
    model: str | None
    gpu: str | None


class SessionOptions(SolverOptions):
    """The solver options of a session's plans: those of `SolverOptions`, but the time limit is
    'auto' unless given, since a session plans step k+1 while step k trains."""

    time_limit_s: TimeLimit = Field(
        AUTO,
        description="Planning-time budget of each plan in seconds, or 'auto' (the default here): half of the "
        "step time's floor (the area bound of the batch over every scheme), clipped to [0.5, 60] s; each plan "
        "says what it ran under (solver.time_limit_s).",
    )


class SessionBody(SourceMixin, ApiModel):
    """POST /v1/sessions: what stays fixed for a training job (cluster, costs, options)."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{key: value for key, value in TINY_EXAMPLE.items() if key != "lengths"}]}
    )

    num_gpus: NumGpus
    gpus_per_node: GpusPerNode = 8
    model: ModelRef = None
    gpu: GpuRef = None
    recipe: RecipeRef = None
    profile: InlineProfile = None
    profile_id: ProfileId = None
    options: SessionOptions = Field(default_factory=SessionOptions)
    baselines: Baselines = []

    @model_validator(mode="after")
    def _one_source(self) -> SessionBody:
        check_source(self, required=True)
        return self


class SessionView(ApiModel):
    session_id: str
    created_at: datetime
    last_used_at: datetime
    idle_timeout_s: float = Field(description="The session expires after this long unused.")
    num_plans: int = Field(description="Plans made in this session so far.")
    last_plan_id: str | None
    last_strategy: str | None
    config: SessionBody
    fit: SessionFit = Field(
        default_factory=SessionFit,
        description="The closed loop: current profile version, schemes refitted, error history, capacities "
        "lowered and error jumps (POST /v1/sessions/{id}/measurements).",
    )


class SessionRecord(ApiModel):
    """What the store keeps for a session."""

    session_id: str
    created_at: datetime
    last_used_at: datetime
    config: SessionBody
    num_plans: int = 0
    last_plan_id: str | None = None
    last_strategy: str | None = Field(None, description="The next plan's previous_strategy.")
    last_profile_version: int = Field(0, ge=0, description="The profile version the last plan was made with.")
    owner: str | None = Field(
        None, description="The tenant that made it (api/service/tenants.py); only it and admins see it."
    )


class SessionPlansBody(ApiModel):
    """POST /v1/sessions/{id}/plans: the next batch, or the next k batches in order."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"lengths": [4096, 1024, 512, 8192]}, {"batches": [[4096, 512], [900]]}]}
    )

    lengths: Lengths | None = None
    batches: list[Lengths] | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description="Several batches, planned in order, each after the last (at most max_session_batches).",
    )

    @model_validator(mode="after")
    def _one_of(self) -> SessionPlansBody:
        if (self.lengths is None) == (self.batches is None):
            raise ValueError("give exactly one of lengths or batches")
        return self

    def all_batches(self) -> list[list[int]]:
        return [self.lengths] if self.lengths is not None else list(self.batches or [])


class SessionPlans(ApiModel):
    plans: list[Plan] = Field(description="One plan per batch, in order.")


MAX_AXIS_VALUES = 1024


class SweepVary(ApiModel):
    """Values to sweep; the sweep plans every combination (cartesian product)."""

    # Each axis is bounded as it is parsed; the server's max_sweep_items bounds their product.
    num_gpus: list[NumGpus] | None = Field(None, min_length=1, max_length=MAX_AXIS_VALUES, description="Cluster sizes.")
    model: list[str | ModelSpec] | None = Field(None, min_length=1, max_length=MAX_AXIS_VALUES, description="Models.")
    gpu: list[str | GpuSpec] | None = Field(None, min_length=1, max_length=MAX_AXIS_VALUES, description="GPUs.")

    @model_validator(mode="after")
    def _something_varies(self) -> SweepVary:
        if self.num_gpus is None and self.model is None and self.gpu is None:
            raise ValueError("vary needs at least one of num_gpus, model or gpu")
        return self


class PlanJobBody(ApiModel):
    kind: Literal["plan"] = "plan"
    request: PlanBody


class SweepJobBody(ApiModel):
    kind: Literal["sweep"]
    base: PlanBody = Field(description="The request every sweep item starts from.")
    vary: SweepVary


JobBody = Annotated[PlanJobBody | SweepJobBody, Field(discriminator="kind")]
JOB_EXAMPLES = [
    {"kind": "plan", "request": TINY_EXAMPLE},
    {"kind": "sweep", "base": TINY_EXAMPLE, "vary": {"num_gpus": [8, 16]}},
]


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class SweepItem(ApiModel):
    """One plan of a sweep."""

    index: int
    num_gpus: int
    model: str | None
    gpu: str | None
    status: JobStatus
    plan: Plan | None = None
    error: Problem | None = None
    row: WhatifRow | None = Field(
        None, description="The what-if row of the item (the same row `hydraplan whatif` gives for it)."
    )


class JobProgress(ApiModel):
    done: int
    total: int


class JobView(ApiModel):
    """A job's state; the store keeps exactly this, so every worker answers the same."""

    job_id: str
    kind: Literal["plan", "sweep"]
    status: JobStatus
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    cancel_requested: bool = False
    progress: JobProgress
    result: Plan | None = Field(None, description="The plan of a plan job (best so far if cancelled).")
    items: list[SweepItem] = Field(default_factory=list, description="Sweep items finished so far.")
    error: Problem | None = None
    owner: str | None = Field(
        None, description="The tenant that made it (api/service/tenants.py); only it and admins see it."
    )


class JobAccepted(ApiModel):
    job_id: str
    status: JobStatus
    location: str


class Health(ApiModel):
    status: Literal["ok"] = "ok"


class Readiness(ApiModel):
    status: Literal["ready"] = "ready"
    store: str = Field(description="Store backend: memory or redis.")
    solves_running: int
    solve_slots: int


class LabelledPlan(ApiModel):
    """A plan to draw beside the main one (a baseline's, from POST /v1/estimate)."""

    label: str = Field(min_length=1, max_length=64, description="Its panel's name, e.g. the baseline's.")
    plan: Plan


class TimelineBody(ApiModel):
    """POST /v1/plans/timeline: the plans to draw on one time axis."""

    plan: Plan = Field(description="The plan to draw first; its lower bound is drawn too.")
    label: str = Field("hydraplan", min_length=1, max_length=64, description="Its panel's name.")
    compare: list[LabelledPlan] = Field([], max_length=8, description="Plans drawn below it, on the same axis.")
    pipelines: Literal["grouped", "all"] = Field(
        "grouped",
        description="grouped: identical schedules once, the slowest 8 groups and a histogram of the rest; "
        "all: every pipeline.",
    )
    format: Literal["svg", "json"] = Field(
        "svg", description="svg: the drawing (image/svg+xml); json: the hydraplan.timeline/1 document."
    )


class DatasetInfo(ApiModel):
    """A bundled dataset lengths can be sampled from."""

    name: str
    description: str


class DatasetList(ApiModel):
    datasets: list[DatasetInfo]


class DatasetSample(ApiModel):
    """A global batch sampled from a bundled dataset, as `hydraplan plan --dataset` draws it."""

    dataset: str
    seed: int
    num_tokens: int = Field(description="Tokens of the batch (the last document may overshoot the request).")
    lengths: list[int]
