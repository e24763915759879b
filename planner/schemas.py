"""Boundary types: everything that crosses a process or network boundary.

Requests, cost profiles and the versioned `Plan` are frozen pydantic models with `extra="forbid"`.
Solver internals never appear here (they are dataclasses / numpy arrays inside the planner).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictInt,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from hydraplan.planner import limits
from hydraplan.planner.measurements import ProfileProvenance, SessionFeedback
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.strategies import check_strategy_fits

PLAN_SCHEMA = "hydraplan.plan/1"
PROFILE_SCHEMA = "hydraplan.profile/1"
# The power of the longest sequence's length in the memory model's fifth term (m4 max(l)^2.5): one
# long sequence's real peak grows faster than l^2 on the CPU profile (a free fit of single sequences
# of 128-3,072 tokens gives 2.3-2.4; benchmarks/memory_peak.py); an upper fit leaves it 0 where the
# quadratic terms suffice.
LONGEST_POWER = 2.5

PositiveInt = Annotated[int, Field(ge=1)]
# Only finite numbers cross the boundary; upper bounds keep every product the planner forms finite.
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Bytes = Annotated[float, Field(ge=0, le=limits.MAX_BYTES, allow_inf_nan=False)]
PositiveBytes = Annotated[float, Field(gt=0, le=limits.MAX_BYTES, allow_inf_nan=False)]
Rate = Annotated[float, Field(gt=0, le=limits.MAX_RATE, allow_inf_nan=False)]
# A sequence's token count: a JSON integer (no `true`, no "5", no 5.0), inside int32.
TokenCount = Annotated[StrictInt, Field(ge=1, le=limits.MAX_SEQUENCE_TOKENS)]
NumGpus = Annotated[int, Field(ge=1, le=limits.MAX_NUM_GPUS)]


def integer_list(values: Iterable[Any]) -> list[Any]:
    """Python ints from any integers (numpy's included) for a `list[TokenCount]` field; booleans,
    floats and strings pass through unchanged, for validation to refuse naming their position."""
    return [
        value if isinstance(value, bool) or not hasattr(value, "__index__") else operator.index(value)
        for value in values
    ]


GpusPerNode = Annotated[int, Field(ge=1, le=limits.MAX_GPUS_PER_NODE)]
Degree = Annotated[int, Field(ge=1, le=limits.MAX_NUM_GPUS)]
Stages = Annotated[int, Field(ge=1, le=limits.MAX_LAYERS)]
StrategyText = Annotated[str, Field(min_length=1, max_length=16 * limits.MAX_STRATEGY_TERMS)]


class Frozen(BaseModel):
    """Base of all boundary models: immutable, unknown fields rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


# ---------------------------------------------------------------------------------------------
# Hardware and model specs (catalog entries)
# ---------------------------------------------------------------------------------------------


class ModelSpec(Frozen):
    """A decoder-only Transformer (Llama-style: RMSNorm, rotary, optional gated MLP, GQA)."""

    name: str = Field(description="Catalog name, e.g. llama3-8b.")
    num_layers: Stages = Field(description="Transformer layers.")
    # Widths up to 16-64x the largest published dense models (Llama 3 405B: h 16,384, f 53,248,
    # 128 heads, vocabulary 128K): the analytic model's products stay finite.
    hidden_size: int = Field(ge=1, le=2**20, description="Model width h.")
    ffn_hidden_size: int = Field(ge=1, le=2**22, description="MLP inner width f.")
    num_heads: int = Field(ge=1, le=2**14, description="Attention (query) heads.")
    num_kv_heads: int = Field(ge=1, le=2**14, description="Key/value heads (GQA); equals num_heads for MHA.")
    vocab_size: int = Field(ge=1, le=2**24, description="Vocabulary size V.")
    gated_mlp: bool = Field(True, description="SwiGLU-style MLP with three weight matrices.")
    tied_embeddings: bool = Field(False, description="Input embedding shared with the LM head.")
    source: str = Field("", description="Where the numbers come from.")

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.num_kv_heads}")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_dim(self) -> int:
        """Width of the K (or V) projection output."""
        return self.num_kv_heads * self.head_dim

    @property
    def params_per_layer(self) -> int:
        """Weights of one layer: attention projections, MLP and two norms (no biases)."""
        h, f = self.hidden_size, self.ffn_hidden_size
        attention = h * (h + 2 * self.kv_dim) + h * h
        mlp = (3 if self.gated_mlp else 2) * h * f
        return attention + mlp + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        head = 0 if self.tied_embeddings else self.embedding_params
        return self.num_layers * self.params_per_layer + self.embedding_params + head


class GpuSpec(Frozen):
    """One GPU model with the vendor numbers the analytic cost model needs."""

    name: str = Field(description="Catalog name, e.g. h100-sxm-80gb.")
    memory_bytes: PositiveBytes = Field(description="HBM capacity in bytes.")
    peak_bf16_flops: Rate = Field(description="Dense BF16 tensor-core peak, FLOP/s.")
    hbm_bandwidth_bytes_per_s: Rate = Field(description="HBM bandwidth, bytes/s.")
    intra_node_bandwidth_bytes_per_s: Rate = Field(
        description="Per-GPU unidirectional NVLink bandwidth inside a node, bytes/s."
    )
    inter_node_bandwidth_bytes_per_s: Rate = Field(description="Per-GPU network bandwidth between nodes, bytes/s.")
    source: str = Field("", description="Vendor datasheet the numbers come from.")


# ---------------------------------------------------------------------------------------------
# Cost profile (the contract between cost_models/ and planner/)
# ---------------------------------------------------------------------------------------------


def single_chunk(v: int) -> bool:
    """`exclude_if` of a scheme's `v`: left out of the JSON when 1, so the files of plain 1F1B
    pipelines stay as they were before the chunk count existed (byte for byte, plan ids included)."""
    return v == 1


def no_longest_term(m: float) -> bool:
    """`exclude_if` of `activation_bytes_per_longest_sq` and `_pow`: left out of the JSON when 0, so
    profiles and plans without the term stay as they were before it existed (byte for byte)."""
    return m == 0


class SchemeCost(Frozen):
    """Cost of one scheme: stage time `a*sum(l^2) + b*sum(l) + c` and its memory model.

    `capacity_tokens` may be omitted when `static_bytes` and `activation_bytes_per_token` are given
    and the profile has `gpu_memory_bytes`; it is then derived.
    """

    tp: Degree = Field(description="Tensor-parallel degree.")
    pp: Stages = Field(description="Pipeline-parallel degree (stages).")
    cp: Degree = Field(1, description="Context-parallel degree.")
    v: Stages = Field(
        1,
        description="Model chunks (virtual stages) per PP rank: 1 is plain 1F1B, v > 1 Megatron-LM's interleaved "
        "1F1B. With v > 1, a, b, c and the activation bytes are per chunk (num_layers / (pp * v) layers, its "
        "point-to-point transfers included). Left out of the JSON when 1.",
        exclude_if=single_chunk,
    )
    a: float = Field(
        ge=0,
        le=limits.MAX_COST_A,
        allow_inf_nan=False,
        description="Stage time per squared token (time_unit / token^2).",
    )
    b: float = Field(
        ge=0, le=limits.MAX_COST_B, allow_inf_nan=False, description="Stage time per token (time_unit / token)."
    )
    c: float = Field(
        0.0, ge=0, le=limits.MAX_COST_C, allow_inf_nan=False, description="Stage time per micro-batch (time_unit)."
    )
    fwd_fraction: float = Field(1 / 3, gt=0, lt=1, description="Share of the stage time spent in the forward pass.")
    capacity_tokens: PositiveInt | None = Field(
        None, description="Most tokens one micro-batch may hold without running out of memory."
    )
    static_bytes: Bytes | None = Field(None, description="Weights, gradients and optimizer shard per GPU, bytes.")
    activation_bytes_per_token: Bytes | None = Field(
        None, description="Activation bytes per GPU per token of one in-flight micro-batch (m1)."
    )
    activation_bytes_per_token_sq: Bytes = Field(
        0.0, description="Activation bytes per GPU per squared token (m2, eager attention only)."
    )
    activation_bytes_per_longest_sq: Bytes = Field(
        0.0,
        description="Bytes per GPU per squared length of the micro-batch's longest sequence (m3: attention "
        "temporaries alive for one sequence at a time). The capacity bounds max(l)^2 by T^2, like sum(l^2). "
        "Left out of the JSON when 0.",
        exclude_if=no_longest_term,
    )
    activation_bytes_per_longest_pow: Bytes = Field(
        0.0,
        description="Bytes per GPU per max(l)^2.5 of the micro-batch's longest sequence (m4: one long sequence's "
        "peak growing faster than its square, as measured on CPU). The capacity bounds max(l) by T. Left out of "
        "the JSON when 0.",
        exclude_if=no_longest_term,
    )
    in_flight_micro_batches: Stages | None = Field(
        None,
        description="Micro-batches alive at the memory peak of the fullest rank (1F1B stage 0: pp); with v > 1, "
        "chunk micro-batches (interleaved rank 0: 2 (pp - 1) + (v - 1) pp + 1).",
    )
    grad_bytes_per_gpu: Bytes = Field(0.0, description="Gradient bytes each GPU of this scheme synchronises per step.")
    grad_sync_bytes_per_gpu: Bytes | None = Field(
        None,
        description="Bytes each GPU of this scheme puts through the gradient all-reduce per step when they "
        "differ from grad_bytes_per_gpu (reduce dtype, ZeRO-3 reduce-scatter only); None: grad_bytes_per_gpu.",
    )
    grad_sync_bandwidth_bytes_per_s: Rate | None = Field(
        None,
        description="Bus bandwidth per GPU of this scheme's gradient all-reduce (all NICs of a node shared by "
        "its replicas there); None: the profile's grad_sync_bandwidth_bytes_per_s.",
    )

    @property
    def key(self) -> tuple[int, ...]:
        """(tp, pp, cp), with v appended when v > 1."""
        return self.scheme.key

    @property
    def scheme(self) -> ParallelScheme:
        return ParallelScheme(self.tp, self.pp, self.cp, self.v)


Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class TrainingRecipe(Frozen):
    """How the model is trained, as the analytic cost model prices it (issue 13).

    The defaults: selective recompute, ZeRO-1 with fp32 gradients reduced in bf16, fp32 Adam,
    nothing overlapped, and the per-GPU, per-shape efficiencies validated against published runs
    (`catalog`, benchmarks/RESULTS.md "published"); `efficiency="flat"` is the model before
    issue 13 (one efficiency for every GPU and shape).
    """

    recompute: Literal["none", "selective", "selective-op", "full"] = Field(
        "selective",
        description="Activation recomputation: none; selective (Korthikanti et al. 2022, core attention); "
        "selective-op (torchtitan: every other matmul and the elementwise ops); full (each layer's forward).",
    )
    sharding: Literal["zero1", "zero2", "zero3", "fsdp"] = Field(
        "zero1",
        description="ZeRO stage (Rajbhandari et al. 2020): optimizer state (zero1), also gradients (zero2), "
        "also weights (zero3; fsdp is the same).",
    )
    grad_dtype: Literal["fp32", "bf16"] = Field("fp32", description="Gradient buffer dtype in memory.")
    grad_reduce_dtype: Literal["fp32", "bf16"] = Field("bf16", description="Dtype the gradients are reduced in.")
    optimizer_dtype: Literal["fp32", "bf16"] = Field("fp32", description="Dtype of Adam's two moments.")
    dp_sync_exposed: Fraction = Field(
        1.0, description="Share of the data-parallel sync (and FSDP gathers) not hidden behind compute."
    )
    tp_comm_exposed: Fraction = Field(1.0, description="Share of tensor-parallel communication not overlapped.")
    cp_comm_exposed: Fraction = Field(1.0, description="Share of context-parallel (ring) transfers not overlapped.")
    efficiency: Literal["flat", "catalog"] = Field(
        "catalog",
        description="flat: one efficiency for every GPU and shape; catalog: per-GPU, per-shape achieved rates, "
        "memory-bound kernels and multi-NIC data-parallel bandwidth (cost_models/data/efficiency.json).",
    )


class CostProfile(Frozen):
    """Stage-time and memory coefficients of every runnable scheme for one (model, GPU, cluster)."""

    schema_version: Literal["hydraplan.profile/1"] = Field(PROFILE_SCHEMA)
    source: Literal["analytic", "profiled", "calibrated", "user"] = Field(
        "user",
        description="Who produced the coefficients: formulas (analytic), a fit to measurements "
        "(profiled), the analytic model with measured hardware parameters (calibrated), or a user.",
    )
    model: str | None = Field(None, description="Model name the profile is for.")
    gpu: str | None = Field(None, description="GPU name the profile is for.")
    time_unit: Literal["s", "ms"] = Field("s", description="Unit of a, b, c and grad_sync_s.")
    num_layers: Stages = Field(description="Transformer layers of the model.")
    gpu_memory_bytes: PositiveBytes | None = Field(None, description="Usable HBM per GPU, bytes.")
    memory_reserve_bytes: Bytes = Field(
        0.0, description="Bytes per GPU kept free (allocator fragmentation, workspace)."
    )
    grad_sync_s: float | None = Field(
        None,
        ge=0,
        le=limits.MAX_TIME_S,
        allow_inf_nan=False,
        description="Fixed gradient synchronisation time per step (time_unit).",
    )
    grad_sync_bandwidth_bytes_per_s: Rate | None = Field(
        None, description="Slowest-link bandwidth used to model gradient synchronisation."
    )
    grad_sync_exposed_fraction: float = Field(
        1.0,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="Share of the modelled gradient all-reduce not hidden behind the backward pass (1: no overlap).",
    )
    switch_bytes_per_weight_byte: float = Field(
        1.0,
        ge=1,
        le=16,
        allow_inf_nan=False,
        description="Bytes a strategy switch moves per byte of weight shard: 1 when the optimizer state is "
        "sharded over the flat rank space and stays put (ZeRO-1, the default); 3 when every GPU keeps the two "
        "AdamW moments of its own shard in the weights' dtype, as hydraplan's runtime does.",
    )
    schemes: list[SchemeCost] = Field(
        min_length=1, max_length=limits.MAX_NUM_GPUS, description="One entry per runnable scheme."
    )
    notes: str = Field("", description="Free text: assumptions, calibration error, provenance.")
    recipe: TrainingRecipe | None = Field(
        None, description="The training recipe an analytic or calibrated profile was built for (None: not recorded)."
    )
    provenance: ProfileProvenance | None = Field(
        None, description="Raw samples, fitted values, fit error, hardware, torch version and date of a measurement."
    )

    @model_validator(mode="after")
    def _capacities_derivable(self) -> CostProfile:
        seen: set[tuple[int, int, int]] = set()
        for index, scheme in enumerate(self.schemes):
            if scheme.key in seen:
                raise ValueError(f"schemes[{index}]: duplicate scheme {scheme.key}")
            if scheme.pp > self.num_layers:
                raise ValueError(f"schemes[{index}]: pp {scheme.pp} exceeds num_layers {self.num_layers}")
            try:
                scheme.scheme.check_layers(self.num_layers)
            except ValueError as error:
                raise ValueError(f"schemes[{index}]: {error}") from None
            seen.add(scheme.key)
            if scheme.capacity_tokens is not None:
                continue
            missing = [name for name in ("static_bytes", "activation_bytes_per_token") if getattr(scheme, name) is None]
            if self.gpu_memory_bytes is None:
                missing.append("gpu_memory_bytes (top level)")
            if missing:
                raise ValueError(
                    f"schemes[{index}].capacity_tokens is missing and cannot be derived: "
                    f"also missing {', '.join(missing)}"
                )
            if derive_capacity_tokens(self, scheme) < 1:
                raise ValueError(f"schemes[{index}] {scheme.key}: static memory leaves no room for activations")
        return self

    @property
    def seconds_per_unit(self) -> float:
        return 1e-3 if self.time_unit == "ms" else 1.0


def default_in_flight_micro_batches(pp: int, v: int = 1) -> int:
    """Micro-batches (v > 1: chunk micro-batches) whose activations the fullest rank holds at its
    peak, with as many micro-batches as the schedule keeps in flight: pp under 1F1B (stage 0); under
    interleaved 1F1B with groups of pp, rank 0's `2 (pp - 1) + (v - 1) pp` warm-up forwards plus one
    (`cost_models.pipeline_layout.in_flight_micro_batches`, Narayanan et al. 2021 §2.2.2). Every
    other rank holds fewer (2 fewer per rank), so a capacity that fits rank 0 fits every rank."""
    if v == 1:
        return pp
    return 2 * (pp - 1) + (v - 1) * pp + 1


def most_tokens(free_bytes: float, per_token: float, per_square: float, per_power: float = 0.0) -> int:
    """Largest integer T >= 0 with `per_token T + per_square T^2 + per_power T^LONGEST_POWER <=
    free_bytes` (coefficients >= 0); 2^62 when nothing grows with T. Without the power term, the
    quadratic's positive root; with it, a bisection below that root (the left side grows with T)."""
    if free_bytes <= 0:
        return 0
    if per_square > 0:
        bound = math.floor(
            (-per_token + math.sqrt(per_token * per_token + 4 * per_square * free_bytes)) / (2 * per_square)
        )
    elif per_token > 0:
        bound = math.floor(free_bytes / per_token)
    elif per_power > 0:
        bound = math.floor((free_bytes / per_power) ** (1 / LONGEST_POWER)) + 1
    else:
        return 2**62
    if per_power <= 0:
        return bound
    low, high = 0, bound + 1  # low fits, high does not
    while high - low > 1:
        middle = (low + high) // 2
        if per_token * middle + per_square * middle * middle + per_power * middle**LONGEST_POWER <= free_bytes:
            low = middle
        else:
            high = middle
    return low


def derive_capacity_tokens(profile: CostProfile, scheme: SchemeCost) -> int:
    """Largest token count T with in_flight * (m1*T + (m2 + m3)*T^2 + m4*T^2.5) <= memory - reserve
    - static.

    Packing bounds a micro-batch's sum of squared lengths, and the square of its longest sequence,
    by T^2 (and its longest by T), so the bound is safe whatever the lengths of the T tokens.
    """
    if scheme.capacity_tokens is not None:
        return scheme.capacity_tokens
    assert profile.gpu_memory_bytes is not None
    assert scheme.static_bytes is not None and scheme.activation_bytes_per_token is not None
    in_flight = scheme.in_flight_micro_batches or default_in_flight_micro_batches(scheme.pp, scheme.v)
    free_bytes = profile.gpu_memory_bytes - profile.memory_reserve_bytes - scheme.static_bytes
    return most_tokens(
        free_bytes,
        scheme.activation_bytes_per_token * in_flight,
        (scheme.activation_bytes_per_token_sq + scheme.activation_bytes_per_longest_sq) * in_flight,
        scheme.activation_bytes_per_longest_pow * in_flight,
    )


# ---------------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------------


class OversizePolicy(StrEnum):
    """What to do with a sequence longer than every scheme's capacity."""

    ERROR = "error"
    SPLIT = "split"
    DROP = "drop"


class SolverBackend(StrEnum):
    """Which solver plans the batch; `auto` runs them as an anytime pipeline."""

    AUTO = "auto"
    GREEDY = "greedy"
    LP = "lp"
    CPSAT = "cpsat"
    PULP = "pulp"


def _one_time_limit_error(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A bad budget is one error at its field (not one per branch of the union, located at the
    branch): the number's error, or that it is neither a number nor 'auto'."""
    try:
        return handler(value)
    except ValidationError as error:
        if isinstance(value, str):
            raise PydanticCustomError(
                "time_limit",
                "Input should be a number of seconds or 'auto', not the string {given}",
                {"given": repr(value[:40])},
            ) from None
        first = error.errors()[0]
        raise PydanticCustomError(first["type"], first["msg"]) from None


# a planning-time budget: seconds (a number, strictly: "0.2" is refused like a length "5"), or
# 'auto' (a share of the step, planner.budget)
TimeLimit = Annotated[
    Annotated[float, Strict(), Field(gt=0, le=600, allow_inf_nan=False)] | Literal["auto"],
    WrapValidator(_one_time_limit_error),
]


class SolverOptions(Frozen):
    """Every knob of one solve; CLI flags and API fields map onto this one type."""

    solver: SolverBackend = Field(SolverBackend.AUTO, description="Solver backend.")

    time_limit_s: TimeLimit = Field(
        2.0,
        description="Hard planning-time budget in seconds, or 'auto': half of the step time's floor (the area "
        "bound of the batch over every scheme), clipped to [0.5, 60] s; the plan says what it ran under "
        "(solver.time_limit_s).",
    )
    max_schemes: int = Field(3, ge=1, le=8, description="Most distinct schemes in a strategy (K).")
    # CP-SAT's random_seed is an int32.
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed for every randomised choice.")
    oversize: OversizePolicy = Field(
        OversizePolicy.ERROR, description="Policy for sequences longer than every capacity."
    )
    gap_tolerance: float = Field(
        0.01,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="Relative gap at or below which a plan is 'optimal' (one the clock cut is 'timeout_incumbent' "
        "whatever its gap).",
    )
    max_strategies_solved: int = Field(
        16,
        ge=1,
        le=100_000,
        description="Deterministic work limit: most strategies given a full solve. With a time "
        "limit that is not reached, the same request and seed give the same plan.",
    )
    strategy_pool: list[StrategyText] | None = Field(
        None,
        max_length=limits.MAX_POOL_STRATEGIES,
        description="Restrict the search to these strategies (e.g. '1x<8,1,2> + 6x<4,2,1>'); "
        "the lower bound then covers only the pool.",
    )


# a rank as a JSON object's key (a string of digits there, an int in Python)
RankKey = Annotated[int, Strict(False), Field(ge=0, lt=limits.MAX_NUM_GPUS)]


def _is_none(value: Any) -> bool:
    """`exclude_if` of an optional field added later: left out of the JSON when None, so requests
    and plans made without it keep their hashes and ids."""
    return value is None


def previous_strategy_fits(text: str | None, info: ValidationInfo) -> str | None:
    """Field validator: a previous strategy must run on the cluster of the fields before it
    (`num_gpus`, `gpus_per_node`), checked before any work (a pool is checked by `solve`)."""
    num_gpus, gpus_per_node = info.data.get("num_gpus"), info.data.get("gpus_per_node", 8)
    if text is not None and num_gpus is not None and gpus_per_node is not None:
        check_strategy_fits(text, num_gpus, gpus_per_node, "previous_strategy")
    return text


class PlanRequest(Frozen):
    """One global batch to plan on one cluster."""

    lengths: list[StrictInt] = Field(
        min_length=1,
        max_length=limits.MAX_SEQUENCES,
        description="Token length of every sequence of the global batch.",
    )
    num_gpus: NumGpus = Field(description="GPUs in the cluster (N).")
    gpus_per_node: GpusPerNode = Field(8, description="GPUs per node; TP groups stay inside one.")
    options: SolverOptions = Field(default_factory=SolverOptions)
    previous_strategy: StrategyText | None = Field(
        None,
        description="Strategy of the previous step (e.g. from its plan): changing it costs the "
        "re-sharding of the weights, and the planner switches only when the gain exceeds that.",
    )

    @field_validator("lengths")
    @classmethod
    def _bounded_lengths(cls, lengths: list[int]) -> list[int]:
        if min(lengths) < 1 or max(lengths) > limits.MAX_SEQUENCE_TOKENS:
            for index, length in enumerate(lengths):
                if length < 1:
                    raise ValueError(f"lengths[{index}] = {length}: every length must be >= 1")
                if length > limits.MAX_SEQUENCE_TOKENS:
                    raise ValueError(
                        f"lengths[{index}] = {length}: longer than the limit of {limits.MAX_SEQUENCE_TOKENS}"
                    )
        total = sum(lengths)
        if total > limits.MAX_BATCH_TOKENS:
            raise ValueError(f"the batch has {total} tokens, more than the limit of {limits.MAX_BATCH_TOKENS}")
        return lengths

    @model_validator(mode="after")
    def _whole_nodes(self) -> PlanRequest:
        if self.num_gpus > self.gpus_per_node and self.num_gpus % self.gpus_per_node:
            raise ValueError(f"num_gpus {self.num_gpus} is not a multiple of gpus_per_node {self.gpus_per_node}")
        return self

    rank_slowdowns: dict[RankKey, float] | None = Field(
        None,
        max_length=limits.MAX_NUM_GPUS,
        description="Known slow ranks: rank -> slowdown factor >= 1 (2.0: the rank takes twice the profile's "
        "time). A pipeline runs at its slowest rank's pace: its stage times are scaled by the largest factor "
        "among its ranks, and dispatch gives it less work (planner/slowdowns.py). A planning session fills it "
        "with the factors it estimated from measurements when the request gives none. Left out when None.",
        exclude_if=_is_none,
    )

    _previous_strategy_fits = field_validator("previous_strategy")(previous_strategy_fits)

    @model_validator(mode="after")
    def _known_ranks(self) -> PlanRequest:
        check_rank_slowdowns(self.rank_slowdowns, self.num_gpus)
        return self


def check_rank_slowdowns(rank_slowdowns: dict[int, float] | None, num_gpus: int) -> None:
    """ValueError naming the first rank outside the cluster or factor not finite in [1, limit]."""
    for rank, factor in (rank_slowdowns or {}).items():
        if not 0 <= rank < num_gpus:
            raise ValueError(f"rank_slowdowns: rank {rank} is not a rank of the {num_gpus} GPUs")
        if not (math.isfinite(factor) and 1.0 <= factor <= limits.MAX_RANK_SLOWDOWN):
            raise ValueError(
                f"rank_slowdowns: rank {rank} has factor {factor}; a slowdown factor must be finite, >= 1 and at most "
                f"{limits.MAX_RANK_SLOWDOWN:g}"
            )


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------


class SolveStatus(StrEnum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    TIMEOUT_INCUMBENT = "timeout_incumbent"


class SchemeModel(Frozen):
    tp: Degree
    pp: Stages
    cp: Degree
    v: Stages = Field(
        1,
        description="Model chunks per PP rank (interleaved 1F1B when > 1); left out of the JSON when 1.",
        exclude_if=single_chunk,
    )

    @property
    def scheme(self) -> ParallelScheme:
        return ParallelScheme(self.tp, self.pp, self.cp, self.v)


class MicroBatch(Frozen):
    """Sequences (or chunks of them) packed into one token stream, in execution order."""

    sequence_ids: list[int] = Field(max_length=limits.MAX_ITEMS, description="0-based indices into the input lengths.")
    lengths: list[int] = Field(
        max_length=limits.MAX_ITEMS, description="Tokens of each entry (a chunk's length when split)."
    )
    offsets: list[int] = Field(
        max_length=limits.MAX_ITEMS, description="Token offset of each entry in its input sequence."
    )
    num_tokens: int = Field(description="Sum of lengths.")
    stage_time_s: FiniteFloat = Field(description="Predicted forward+backward time on one PP stage.")


class PipelinePlan(Frozen):
    """One pipeline: its scheme, its GPUs and its micro-batches in 1F1B execution order."""

    index: int
    scheme: SchemeModel
    ranks: list[int] = Field(max_length=limits.MAX_NUM_GPUS, description="Global ranks, stage-major, then CP, then TP.")
    stage_ranks: list[Annotated[list[int], Field(max_length=limits.MAX_NUM_GPUS)]] = Field(
        max_length=limits.MAX_LAYERS, description="Ranks of each PP stage (TP x CP grid)."
    )
    capacity_tokens: int = Field(description="Most tokens per micro-batch for this scheme.")
    num_sequences: int
    num_tokens: int
    time_s: FiniteFloat = Field(description="Simulated 1F1B time of this pipeline.")
    micro_batches: list[MicroBatch] = Field(max_length=limits.MAX_ITEMS)
    slowdown: float | None = Field(
        None,
        description="The slowdown factor its stage times are scaled by: the largest of the plan's rank_slowdowns "
        "over its ranks, when above 1 (stage_time_s and time_s include it). Left out when None.",
        exclude_if=_is_none,
    )


class SolverStats(Frozen):
    backend: str = Field(description="Solver that produced the plan.")
    solve_time_s: float | None = Field(
        None,
        description="Not written any more: wall time would make two plans of one request differ (the CLI and "
        "the service report it beside the plan). Read from older plan files.",
    )
    cut_by_clock: bool = Field(
        False,
        description="True when the time limit (or a cancel), not the work limits, ended part of the search: "
        "the same request may then give another plan. False: the plan is reproducible byte for byte.",
    )
    num_schemes: int = Field(description="Valid schemes considered.")
    num_strategies: int = Field(description="Strategies enumerated (each bounded).")
    num_strategies_solved: int = Field(description="Strategies given a full dispatch + packing.")
    seed: int
    time_limit_s: float | None = Field(
        None, description="The budget the search ran under, in seconds (an 'auto' budget resolved)."
    )
    gap_tolerance: float | None = Field(
        None,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="The request's options.gap_tolerance, which the status was decided by ('optimal' when the gap "
        "is at most this); None in plans written before it was recorded.",
    )
    winner: str = Field(
        "search",
        description="The candidate the plan grew from: 'search' (a strategy the search found and solved) or the "
        "name of a shipped baseline whose own plan of the same batch entered the search as an incumbent and "
        "was polished there (so no shipped baseline's plan is faster).",
    )


class BaselineResult(Frozen):
    """A baseline's plan of the same batch, or why it could not plan it."""

    name: str
    strategy: str | None = Field(None, description="The baseline's strategy (null when it could not plan).")
    step_time_s: FiniteFloat | None = None
    speedup: FiniteFloat | None = Field(None, description="Baseline step time / plan step time.")
    error: str | None = Field(None, description="Why this baseline could not plan the batch.")

    @model_validator(mode="after")
    def _result_or_error(self) -> BaselineResult:
        results = (self.strategy, self.step_time_s, self.speedup)
        if (self.error is None) != all(value is not None for value in results):
            raise ValueError(f"baseline {self.name}: give strategy, step_time_s and speedup, or an error")
        return self


BOUND_CERTIFICATE_SCHEMA = "hydraplan.bound-certificate/1"
# the dual feasible functions of the packing bound (Fekete & Schepers 2001) a witness may name
DualFeasibleFunction = Literal[
    "f_eps(1/5)",
    "f_eps(1/4)",
    "f_eps(3/10)",
    "f_eps(1/3)",
    "f_eps(2/5)",
    "f_eps(9/20)",
    "f_eps(1/2)",
    "u_k(2)",
    "u_k(3)",
    "u_k(4)",
]


class StrategyWitness(Frozen):
    """One strategy of an expanded scheme set: its pipeline counts, the bound the solver claimed
    for it and the multipliers that prove most of it: those of the bound the search's tightening
    raised it by (the packing bound or the duals at multipliers off the grid), else the fluid
    dual's (any nonnegative multipliers give a valid bound, so a verifier only evaluates the duals
    at them)."""

    counts: list[Annotated[int, Field(ge=1)]] = Field(
        max_length=8, description="Pipelines per scheme, in the order of the set's schemes."
    )
    bound_s: FiniteFloat = Field(description="The solver's bound on this strategy's objective.")
    multipliers: list[Annotated[float, Field(ge=0, allow_inf_nan=False)]] = Field(
        max_length=8,
        description="Dual multipliers (those of the bound the search's tightening raised the strategy by, else "
        "the fluid dual's), one per scheme of the set.",
    )
    functions: list[DualFeasibleFunction] | None = Field(
        None,
        max_length=8,
        description="Where the packing bound priced each scheme's items by its own dual feasible function, those "
        "functions, one per scheme of the set (each pipeline's item sizes, at most 1 in all, map to images of at "
        "most 1 in all): f_eps(e) maps a size above 1 - e to 1, one below e to 0 and keeps the others; u_k(k) keeps "
        "x where (k+1) x is an integer, else maps it to floor((k+1) x) / k. Absent: every function alike on "
        "every scheme.",
    )

    @model_validator(mode="after")
    def _one_function_per_multiplier(self) -> StrategyWitness:
        if self.functions is not None and len(self.functions) != len(self.multipliers):
            raise ValueError(
                f"a witness has {len(self.functions)} functions for {len(self.multipliers)} multipliers: "
                "give one per scheme"
            )
        return self


class ExpandedSet(Frozen):
    """A scheme set the search expanded into its strategies: the verifier enumerates them itself and
    bounds each, with the listed multipliers where a strategy is listed."""

    schemes: list[Annotated[int, Field(ge=0)]] = Field(
        min_length=1, max_length=8, description="Indices into the certificate's schemes, increasing."
    )
    bound_s: FiniteFloat | None = Field(
        None, description="The solver's least bound over the set's strategies (null: none of them has a plan)."
    )
    strategies: list[StrategyWitness] = Field(
        default_factory=list,
        max_length=limits.MAX_CERTIFIED_STRATEGIES,
        description="Witnesses of the strategies whose bound is near the global one and of those the search's "
        "tightening raised (the others are bounded with the verifier's own multipliers).",
    )


class BoundCertificate(Frozen):
    """The data that proves a plan's `lower_bound_s` (`planner.verify_bound` checks it without the
    solver's bound code). The strategy space is every strategy of at most `max_schemes` distinct
    schemes of the request's profile that fits the cluster (`space` 'search'), the request's
    strategy pool ('pool') or the plan's strategy ('fixed'). Every scheme set of the space not
    listed in `expanded` is covered by its set bound, recomputed by the verifier."""

    schema_version: Literal["hydraplan.bound-certificate/1"] = BOUND_CERTIFICATE_SCHEMA
    space: Literal["search", "pool", "fixed"]
    max_schemes: int = Field(ge=1, le=8)
    schemes: list[str] = Field(
        max_length=limits.MAX_PROFILE_SCHEMES,
        description="The schemes the bounds price, '<tp,pp,cp>'; every other placeable scheme of the profile is "
        "dominated by one of them (same GPUs, no worse in any cost term).",
    )
    pricing_cap_s: FiniteFloat | None = Field(
        None,
        description="Step time under which set bounds price the 1F1B bubble into each item's work: a set's bound "
        "is then min(pricing_cap_s, priced bound), valid for any positive cap.",
    )
    expanded: list[ExpandedSet] = Field(default_factory=list, max_length=limits.MAX_CERTIFIED_SETS)


class Plan(Frozen):
    """The execution plan for one global batch (versioned, JSON round-trip)."""

    schema_version: Literal["hydraplan.plan/1"] = PLAN_SCHEMA
    plan_id: str = Field(description="Content hash of the plan (all of it but plan_id): same id, same plan.")
    request_hash: str | None = Field(
        None, description="Content hash of the canonical request and cost profile the plan was made for."
    )
    status: SolveStatus = Field(
        description="'timeout_incumbent': the clock (or a cancel) cut the search (solver.cut_by_clock), whatever "
        "the gap; else 'optimal' when the gap is within options.gap_tolerance, 'feasible' when it is not."
    )
    strategy: StrategyText = Field(description="E.g. '1x<8,1,2> + 6x<4,2,1>'.")
    num_gpus: NumGpus
    gpus_per_node: GpusPerNode
    step_time_s: FiniteFloat = Field(description="Slowest pipeline time plus gradient sync.")
    grad_sync_s: FiniteFloat
    previous_strategy: StrategyText | None = Field(None, description="Strategy of the previous step, if given.")
    switch_cost_s: FiniteFloat = Field(0.0, description="Re-sharding time to move from previous_strategy.")
    objective_s: FiniteFloat = Field(description="What the planner minimises: step_time_s + switch_cost_s.")
    lower_bound_s: FiniteFloat = Field(description="Valid lower bound on the optimal objective_s.")
    gap: FiniteFloat = Field(description="(objective_s - lower_bound_s) / objective_s.")
    input_lengths: list[TokenCount] = Field(
        max_length=limits.MAX_SEQUENCES, description="The request's lengths, indexed by sequence id."
    )
    dropped_sequence_ids: list[int] = Field(default_factory=list, max_length=limits.MAX_SEQUENCES)
    split_sequence_ids: list[int] = Field(default_factory=list, max_length=limits.MAX_SEQUENCES)
    pipelines: list[PipelinePlan] = Field(max_length=limits.MAX_NUM_GPUS)
    cost_profile: CostProfile = Field(description="Costs of the schemes used (for re-checking).")
    solver: SolverStats
    baselines: list[BaselineResult] = Field(default_factory=list, max_length=16)
    session_feedback: SessionFeedback | None = Field(
        None,
        description="Set on a plan a planning session made: the version of the session's refitted profile it was "
        "planned with, and the capacities lowered and the error jumps measured since the session's previous plan. "
        "Left out of plan_id when None, so plans made outside a session keep their ids.",
    )
    rank_slowdowns: dict[RankKey, float] | None = Field(
        None,
        max_length=limits.MAX_NUM_GPUS,
        description="The slow ranks and their factors the plan was made with (the request's rank_slowdowns, only "
        "factors above 1); each pipeline holding one says its factor in `slowdown`. Left out when None.",
        exclude_if=_is_none,
    )
    bound_certificate: BoundCertificate | None = Field(
        None,
        description="The data that proves lower_bound_s (`hydraplan check --bound` verifies it). Part of plan_id "
        "when set; left out of it when None, so plans made without one keep their ids.",
    )

    @model_validator(mode="after")
    def _bounded_schedule(self) -> Plan:
        """A plan to check or estimate is simulated: its 1F1B operations are bounded up front."""
        operations = sum(
            limits.schedule_operations(pipeline.scheme.pp * pipeline.scheme.v, len(pipeline.micro_batches))
            for pipeline in self.pipelines
        )
        if operations > limits.MAX_SCHEDULE_OPERATIONS:
            raise ValueError(
                f"the plan's pipelines have {operations} 1F1B operations (2 x stages x micro-batches), "
                f"more than the limit of {limits.MAX_SCHEDULE_OPERATIONS}"
            )
        return self

    @property
    def num_sequences(self) -> int:
        return len(self.input_lengths)


POOL_SCHEMA = "hydraplan.pool/1"


class PoolMemberModel(Frozen):
    strategy: str
    share: float = Field(description="Share of sample batches on which it is the pool's fastest member.")
    mean_step_time_s: float = Field(description="Mean step time over the batches it serves.")


class StrategyPoolFile(Frozen):
    """A pool of strategies a runtime prepares; `--strategy-pool` restricts planning to it."""

    schema_version: Literal["hydraplan.pool/1"] = POOL_SCHEMA
    strategies: list[str] = Field(min_length=1, description="The pool, best served first.")
    members: list[PoolMemberModel] = Field(default_factory=list)
    expected_step_time_s: float | None = Field(None, description="Mean over sample batches with the pool.")
    unrestricted_step_time_s: float | None = Field(None, description="Mean with each batch's best candidate.")
    best_single_step_time_s: float | None = Field(None, description="Mean with the best single strategy.")
    num_batches: int | None = None
    dataset: str | None = None
