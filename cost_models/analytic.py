"""Analytic cost profile: stage-time coefficients and memory of every scheme, from specs alone.

For a scheme `<tp, pp, cp>` and a micro-batch of sequences `l_1..l_k`, one PP stage's
forward+backward time is modelled as `a * sum(l_i^2) + b * sum(l_i) + c` (the form Hydraulis fits,
arXiv 2412.07894), with

- `a`: the attention score FLOPs (quadratic in each sequence's own length) at a share of peak;
- `b`: the weight-matmul FLOPs at a share of peak, plus TP, CP and PP communication per token;
- `c`: a per-layer launch/synchronisation overhead per micro-batch (and ZeRO-3's weight gathers).

Modelling choices (conservative where they must be):

- Layers are split evenly: `pp` must divide `num_layers` (uneven splits are not enumerated).
- The LM head runs on the last stage, which is taken as the bottleneck stage for time.
- TP and CP communication add to `b` at the recipe's exposed shares (1: not overlapped).
- `fwd_fraction` is 1/3 (forward ~ 1/3 of forward+backward FLOPs), 1/4 under full recompute,
  where the recomputed forward runs in the backward pass (`analytic_time.fwd_fraction`).
- Memory follows Korthikanti et al. 2022 with a 1F1B schedule (stage 0 holds `pp` micro-batches)
  and the recipe's ZeRO sharding (`recipe`); the default is ZeRO-1 sharding of the fp32 optimizer
  state over all GPUs, as Hydraulis trains. ZeRO-3 under pipeline parallelism reshards every
  micro-batch by default; `AnalyticOptions.zero3_pipeline="per-step"` prices torchtitan's FSDP2,
  which keeps each stage unsharded for the whole step (`pipelined_fsdp_bytes`).
- The training recipe and the per-GPU efficiencies are `AnalyticOptions` fields; the default
  efficiency is the per-GPU catalog (`efficiency="flat"` with the other defaults reproduces the
  model before issue 13 exactly).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from hydraplan.cost_models.analytic_time import (
    BF16_BYTES,
    RECOMPUTE_CHOICES,
    Recompute,
    _link_bandwidth,
    activation_scale,
    pp_comm_s_per_token,
    pp_messages_per_micro_batch,
    ring_all_reduce_factor,
    scheme_cost,
    training_flops_per_token,
)
from hydraplan.cost_models.efficiency import gpu_efficiency
from hydraplan.cost_models.hardware import HardwareParams
from hydraplan.cost_models.pipeline_layout import PipelineSplit, chunk_layers, in_flight_micro_batches
from hydraplan.cost_models.recipe import (
    DTYPE_BYTES,
    Dtype,
    Sharding,
    grad_sync_bytes,
    normalise_sharding,
    sharded_static_bytes,
)
from hydraplan.planner import limits
from hydraplan.planner.schemas import CostProfile, GpuSpec, ModelSpec, SchemeCost, TrainingRecipe, most_tokens
from hydraplan.planner.scheme import ParallelScheme

__all__ = [
    "RankMemory",
    "rank_memory_terms",
    "AnalyticOptions",
    "HardwareParams",
    "Recompute",
    "activation_bytes_per_layer",
    "build_profile",
    "pipelined_fsdp_bytes",
    "candidate_schemes",
    "ring_all_reduce_factor",
    "training_flops_per_token",
]

FP32_BYTES = 4
# fp32 vocabulary-sized tensors per token the loss holds at its peak (AnalyticOptions.loss)
LOSS_VOCAB_COPIES = {"fused": 1, "eager": 3}
ZERO3_PIPELINE_CHOICES = ("per-micro-batch", "per-step")
GIB = 2**30
# bf16 weight + fp32 gradient accumulator per parameter of the GPU's own weight shard.
WEIGHT_AND_GRAD_BYTES_PER_PARAM = BF16_BYTES + FP32_BYTES
# fp32 master weight + Adam m and v per parameter, sharded over all GPUs (ZeRO-1,
# Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models").
OPTIMIZER_BYTES_PER_PARAM = 3 * FP32_BYTES


@dataclass(frozen=True)
class AnalyticOptions:
    """Assumptions of the analytic model; every default is a documented guess to be calibrated.

    - `matmul_efficiency` 0.55: share of dense BF16 peak reached by the weight matmuls; Megatron-LM
      reports 52% of A100 peak end to end for GPT at scale (Narayanan et al. 2021, Table 1).
    - `attention_efficiency` 0.45: share of peak reached by (flash) attention; FlashAttention-2
      reaches 50-73% of A100 peak forward and less backward (Dao 2023, Fig. 4-7), varlen packing
      and ring-attention chunks lower it further.
    - `causal` True: a causal mask halves the attention score FLOPs.
    - `recompute` "selective": Korthikanti et al. 2022 selective (core-attention) recomputation;
      "selective-op" torchtitan's op-level policy (every other matmul and all elementwise ops rerun);
      "full" stores only each layer's input and reruns its forward in the backward pass.
    - `flash_attention` True: no attention score matrix is stored (Dao et al. 2022).
    - `memory_reserve_fraction` 0.08: GPU memory kept free for the allocator's fragmentation,
      NCCL buffers and the CUDA context.
    - `per_layer_overhead_s` 6e-5: launch and synchronisation time per layer per micro-batch,
      forward plus backward (~a dozen kernels at ~5 us each; an assumption).
    - `min_capacity_tokens` 1024: schemes holding fewer tokens per micro-batch are not runnable.
    - `max_cp` 16: the largest context-parallel degree enumerated (powers of two).
    - `loss` "fused": the loss holds one fp32 vocabulary-sized tensor per token at the peak (`4 V`
      bytes: Megatron-LM's fused vocab-parallel cross-entropy computes the gradient in its logits
      buffer); "eager": PyTorch's `cross_entropy` on fp32 logits, as torchtitan's train loop calls
      it (`cross_entropy(pred.flatten(0, 1).float(), ...)`, `del pred` before `loss.backward()`),
      holds three at the start of the backward: the log-probabilities `log_softmax` saved, their
      incoming gradient and the gradient `log_softmax`'s backward produces (`12 V`).
    - `zero3_pipeline` "per-micro-batch": how ZeRO-3 / FSDP runs under pipeline parallelism (pp > 1;
      ignored otherwise and for zero1/zero2). "per-micro-batch" (the default, unchanged): weights
      gathered layer by layer and resharded in every micro-batch's forward and backward, gradients
      reduce-scattered as they are produced, so a rank holds its shards plus a few gathered layers
      (`recipe.sharded_static_bytes`). "per-step": the stage's weights stay unsharded from the
      first micro-batch's forward to the last one's backward and its gradients accumulate
      unsharded until the last micro-batch, reduce-scattered once per step: what torchtitan runs
      (FSDP2 `reshard_after_forward=False` when PP is on; `torch.distributed.pipelining` turns off
      gradient sync and resharding after backward for every micro-batch but the last). The rank
      then also holds its stage's unsharded bf16 weights and an unsharded gradient accumulator in
      `grad_dtype` (FSDP2 accumulates in its reduce dtype, fp32 in torchtitan), priced by
      `pipelined_fsdp_bytes`.

    The training recipe (issue 13; `cost_models.recipe` cites the memory formulas):

    - `sharding` "zero1": optimizer state sharded (Megatron-LM's distributed optimizer); "zero2"
      also gradients; "zero3" (alias "fsdp") also weights, gathered layer by layer each pass.
    - `grad_dtype` "fp32": the gradient buffer (Megatron's fp32 main_grad); "bf16" halves it.
    - `grad_reduce_dtype` "bf16": the dtype the gradients are all-reduced in.
    - `optimizer_dtype` "fp32": Adam's moments (master weights are fp32 either way).
    - `dp_sync_exposed` 1.0: share of the gradient synchronisation not hidden behind the backward
      pass (Megatron `--overlap-grad-reduce`, FSDP's prefetching lower it); `tp_comm_exposed`
      and `cp_comm_exposed` 1.0 the same for TP collectives (`--tp-comm-overlap`, async TP) and
      ring-attention transfers (overlapped with the attention of the previous block by design).
    - `efficiency` "catalog" (the default, validated against published runs in
      `benchmarks/published.py`): per-GPU, per-shape achieved rates from
      `cost_models/data/efficiency.json` where the GPU has an entry (a GPU without one keeps the
      flat efficiencies above), memory-bound kernels from HBM bandwidth, NCCL bus efficiencies,
      and each scheme's data-parallel bus bandwidth over all NICs of a node
      (`recipe.dp_bus_bandwidth`); "flat" (the model before issue 13): the flat efficiencies
      above and the profile's one link bandwidth for gradient sync.
    """

    matmul_efficiency: float = 0.55
    attention_efficiency: float = 0.45
    causal: bool = True
    recompute: Recompute = "selective"
    flash_attention: bool = True
    memory_reserve_fraction: float = 0.08
    per_layer_overhead_s: float = 6e-5
    min_capacity_tokens: int = 1024
    max_cp: int = 16
    sharding: Sharding = "zero1"
    grad_dtype: Dtype = "fp32"
    grad_reduce_dtype: Dtype = "bf16"
    optimizer_dtype: Dtype = "fp32"
    dp_sync_exposed: float = 1.0
    tp_comm_exposed: float = 1.0
    cp_comm_exposed: float = 1.0
    efficiency: Literal["catalog", "flat"] = "catalog"
    loss: Literal["fused", "eager"] = "fused"
    zero3_pipeline: Literal["per-micro-batch", "per-step"] = "per-micro-batch"

    @classmethod
    def from_recipe(cls, recipe: TrainingRecipe | None, **values: object) -> AnalyticOptions:
        """The options of a `TrainingRecipe` (None: the defaults), other fields from `values`."""
        fields = {} if recipe is None else recipe.model_dump()
        return cls(**fields, **values)  # type: ignore[arg-type]

    def recipe(self) -> TrainingRecipe:
        """The recipe part of these options, as recorded in the profile."""
        names = TrainingRecipe.model_fields
        return TrainingRecipe(**{name: getattr(self, name) for name in names})

    def __post_init__(self) -> None:
        object.__setattr__(self, "sharding", normalise_sharding(self.sharding))
        for name in ("grad_dtype", "grad_reduce_dtype", "optimizer_dtype"):
            if getattr(self, name) not in DTYPE_BYTES:
                raise ValueError(f"{name} must be fp32 or bf16, got {getattr(self, name)!r}")
        for name in ("dp_sync_exposed", "tp_comm_exposed", "cp_comm_exposed"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if self.loss not in LOSS_VOCAB_COPIES:
            raise ValueError(f"loss must be fused or eager, got {self.loss!r}")
        if self.zero3_pipeline not in ZERO3_PIPELINE_CHOICES:
            raise ValueError(f"zero3_pipeline must be per-micro-batch or per-step, got {self.zero3_pipeline!r}")
        if self.efficiency not in ("catalog", "flat"):
            raise ValueError(f"efficiency must be catalog or flat, got {self.efficiency!r}")
        for name in ("matmul_efficiency", "attention_efficiency"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        if not 0 <= self.memory_reserve_fraction < 1:
            raise ValueError(f"memory_reserve_fraction must be in [0, 1), got {self.memory_reserve_fraction}")
        if self.recompute not in RECOMPUTE_CHOICES:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_CHOICES)}, got {self.recompute!r}")
        if self.per_layer_overhead_s < 0:
            raise ValueError(f"per_layer_overhead_s must be >= 0, got {self.per_layer_overhead_s}")
        if self.min_capacity_tokens < 1 or self.max_cp < 1:
            raise ValueError("min_capacity_tokens and max_cp must be >= 1")


# ---------------------------------------------------------------------------------------------
# Activation memory (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
# Transformer Models", §4), generalised to GQA, gated MLPs and no dropout
# ---------------------------------------------------------------------------------------------


def activation_coefficients(
    model: ModelSpec,
    tp: int,
    sequence_parallel: bool,
    recompute: Recompute,
    flash_attention: bool,
    dropout: bool,
) -> tuple[float, float]:
    """Stored activation bytes of one layer per GPU: (per token, per squared sequence length).

    Korthikanti's per-token bytes, in units of h for a GPT layer (34h in all):
    - kept whole by TP, split by sequence parallelism: two norm inputs 4h, attention input 2h, MLP
      input 2h, and with dropout the two 1-byte dropout masks 2h;
    - split by TP: Q 2h, K and V 2*kv_dim each, output-projection input 2h, MLP inner 4f (GeLU input
      and output; fused SwiGLU keeps its 2f-wide input and the f-wide product: 6f).
    The score matrix costs 5 bytes per head per l^2 (softmax output 2, dropout mask 1, dropout
    output 2; 2 bytes without dropout), dropped by selective recompute or flash attention. Full
    recompute keeps only the layer input, 2h (split by SP).
    """
    h, kv_dim, f = model.hidden_size, model.kv_dim, model.ffn_hidden_size
    sp_divisor = tp if sequence_parallel else 1
    if recompute == "full":
        return BF16_BYTES * h / sp_divisor, 0.0
    if recompute == "selective-op":
        return selective_op_bytes_per_token(model, tp, sp_divisor), 0.0
    replicated = 8 * h + (2 * h if dropout else 0)
    mlp_inner = 6 * f if model.gated_mlp else 4 * f
    tensor_split = 4 * h + 4 * kv_dim + mlp_inner
    per_token = replicated / sp_divisor + tensor_split / tp
    if recompute == "selective" or flash_attention:
        return per_token, 0.0
    score_bytes = 5 if dropout else 2
    return per_token, model.num_heads * score_bytes / tp


def selective_op_bytes_per_token(model: ModelSpec, tp: int, sp_divisor: int) -> float:
    """Stored bytes per token of one layer under torchtitan's op-level selective checkpointing:
    the layer input (2h, split by SP), the attention output (2h) and every other matmul output
    (half of q 2h, k and v 2*kv_dim each, o 2h, the MLP's 2f per input projection and its 2h
    output); norms and activations are recomputed (torchtitan `parallelize_llama.py`, 2024)."""
    h, kv_dim, f = model.hidden_size, model.kv_dim, model.ffn_hidden_size
    mlp_in = 2 if model.gated_mlp else 1
    matmul_outputs = BF16_BYTES * (3 * h + 2 * kv_dim + mlp_in * f)
    return BF16_BYTES * h / sp_divisor + (BF16_BYTES * h + matmul_outputs / 2) / tp


def activation_bytes_per_layer(
    model: ModelSpec,
    seq_len: int,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool = True,
    recompute: Recompute = "none",
    flash_attention: bool = False,
    dropout: bool = True,
) -> float:
    """Activation bytes one layer stores per GPU for `micro_batch` sequences of `seq_len` tokens.

    Reproduces Korthikanti et al. 2022 for a GPT layer (f=4h, MHA, dropout): `s*b*h*(34 + 5as/h)`
    without parallelism, `s*b*h*(10 + 24/t + 5as/(ht))` with TP, `s*b*h*(34/t + 5as/(ht))` with
    TP+SP, without the `5as` term under selective recompute, and `2sbh` (`/t` with SP) under full
    recompute. See `activation_coefficients` for the generalisation.
    """
    per_token, per_sq_token = activation_coefficients(model, tp, sequence_parallel, recompute, flash_attention, dropout)
    return seq_len * micro_batch * per_token + micro_batch * seq_len**2 * per_sq_token


# ---------------------------------------------------------------------------------------------
# Schemes
# ---------------------------------------------------------------------------------------------


def _divisors(value: int) -> list[int]:
    return [d for d in range(1, value + 1) if value % d == 0]


def candidate_schemes(model: ModelSpec, num_gpus: int, gpus_per_node: int, max_cp: int) -> list[ParallelScheme]:
    """Schemes valid by shape (memory not checked), sorted.

    tp divides the query and kv head counts and the GPUs per node (TP stays in a node); pp divides
    the layers (even splits only); cp is a power of two up to `max_cp`; `tp*pp*cp <= num_gpus`.
    """
    tps = [tp for tp in _divisors(gpus_per_node) if model.num_heads % tp == 0 and model.num_kv_heads % tp == 0]
    cps = [2**k for k in range(max_cp.bit_length()) if 2**k <= max_cp]
    return sorted(
        ParallelScheme(tp, pp, cp)
        for tp in tps
        for pp in _divisors(model.num_layers)
        for cp in cps
        if tp * pp * cp <= num_gpus
    )


# ---------------------------------------------------------------------------------------------
# Memory per scheme
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SchemeMemory:
    """One scheme's memory model per GPU (bytes); `capacity_tokens` may be below the minimum."""

    static_bytes: float
    activation_bytes_per_token: float
    activation_bytes_per_token_sq: float
    capacity_tokens: int
    grad_bytes_per_gpu: float
    grad_sync_bytes_per_gpu: float = 0.0


def stage_params(model: ModelSpec, pp: int) -> tuple[int, int]:
    """Parameters of the first and of the last PP stage of an even split (equal when pp == 1).

    The first stage holds the embedding, the last the LM head (Megatron keeps a copy of a tied
    embedding there for the head).
    """
    layers = model.num_layers // pp
    return _rank_params(model, pp, 0, layers), _rank_params(model, pp, pp - 1, layers)


def static_bytes(
    model: ModelSpec, params_of_stage: int, tp: int, num_gpus: int, options: AnalyticOptions | None = None
) -> float:
    """Weights, gradients and optimizer state of the GPU's stage shard under the recipe's sharding
    (`recipe.sharded_static_bytes`; the default recipe is ZeRO-1 with fp32 gradients)."""
    options = options or AnalyticOptions()
    return sharded_static_bytes(
        model, params_of_stage, tp, num_gpus, options.sharding, options.grad_dtype, options.optimizer_dtype
    )


def pipelined_fsdp_bytes(model: ModelSpec, params_of_stage: int, tp: int, pp: int, options: AnalyticOptions) -> float:
    """Bytes a pipeline rank holds on top of `static_bytes` when FSDP keeps its stage unsharded for
    the whole step (`AnalyticOptions.zero3_pipeline` "per-step"; 0 otherwise, for pp == 1 and for
    zero1/zero2, which keep their weights whole anyway).

    What torchtitan + FSDP2 + `torch.distributed.pipelining` hold, read in their source:

    - torchtitan `torchtitan/parallelisms/parallelize_llama.py` `apply_fsdp` at 9dec370 (the commit
      of the December 2024 benchmarks): `reshard_after_forward = False` for every transformer block
      and the root module when PP is on ("to avoid per-microbatch all-gathers"), param dtype
      `training.mixed_precision_param` (bf16 by default), reduce dtype
      `training.mixed_precision_reduce` (fp32, the only choice; `config_manager.py` at 9dec370);
      still the default at b5bcd76 (`torchtitan/distributed/fsdp.py`, policy "default":
      `not pp_enabled`);
    - `torch/distributed/pipelining/stage.py` (`backward_maybe_with_nosync`, late 2024, read
      through the search tools; the exact torch commit of the runs, 1963fc8, was not read): for an
      FSDP stage every micro-batch's backward runs with `set_requires_gradient_sync(False)` and
      `set_reshard_after_backward(False)`; only after the last one is FSDP's post-backward
      (reduce-scatter, reshard) run, by hand in the 2024 versions, as a schedule action later;
    - FSDP2 `FSDPParam.to_accumulated_grad_if_needed` / `accumulate_unsharded_grad_if_needed`
      (`torch/distributed/_composable/fsdp/_fsdp_param.py`, same reading): without gradient sync
      the unsharded gradient is upcast to the reduce dtype and accumulated there.

    So from the first micro-batch's forward to the last one's backward the rank holds its stage's
    weights unsharded (`P/tp * 2` bytes, bf16) and, from its first backward on, an unsharded
    gradient accumulator (`P/tp * g`, `g` the bytes of `grad_dtype`: fp32 for torchtitan's fp32
    reduce). zero3's working term (`recipe.sharded_static_bytes`: two gathered bf16 layers and one
    layer's unsharded gradient) is kept but for the two gathered layers (at most the stage's
    weights), which the resident weights now cover; what stays of it is one unit's gradient in
    flight (its bf16 gradient before it is added to the accumulator, its reduce-scatter buffer at
    the last micro-batch). Charged together with the in-flight micro-batches' activations: exact
    once a step has more micro-batches than the rank keeps in flight (1F1B's steady state holds
    both), one micro-batch's activations too many when the rank's first backward is also its last
    forward (the gradients appear as the activations start to go).
    """
    if options.zero3_pipeline != "per-step" or options.sharding != "zero3" or pp == 1:
        return 0.0
    largest_unit = max(model.params_per_layer, model.embedding_params) / tp
    shard = params_of_stage / tp
    resident = shard * (BF16_BYTES + DTYPE_BYTES[options.grad_dtype])
    return resident - BF16_BYTES * min(2 * largest_unit, shard)


def scheme_memory(
    model: ModelSpec,
    gpu: GpuSpec,
    scheme: ParallelScheme,
    num_gpus: int,
    options: AnalyticOptions,
    hardware: HardwareParams | None = None,
    virtual_stages: int = 1,
    split: PipelineSplit = "even",
    micro_batches: int | None = None,
    group_size: int | None = None,
) -> SchemeMemory:
    """Static memory, stored activations per token, and the capacity of one scheme.

    Every pipeline rank is checked: its layers and the micro-batches it keeps in flight
    (`pipeline_layout`; the defaults, an even split under 1F1B with as many micro-batches as it
    can hold, make rank 0 with `pp` in flight and the last rank the binding ones, Narayanan et al.
    2021 §2.2.1). The first rank holds the embedding, the last the LM head and the fp32 logits
    (`4*V` bytes per token, split over TP and CP). Full recompute needs one layer's full
    activations as working memory in the backward pass. CP splits every sequence's tokens, so
    per-GPU bytes per token are divided by cp. Llama models have no dropout. `hardware` scales the
    stored activations by its element size (bf16: 1) and its measured-over-modelled activation
    scale (1 uncalibrated). `virtual_stages`, `split`, `micro_batches` and `group_size` describe
    schedules the planner does not run (interleaving, Megatron-Core's uneven splits); the
    published-run validation prices them (`benchmarks/published.py`).
    """
    ranks = rank_memory_terms(
        model, scheme, num_gpus, options, hardware, virtual_stages, split, micro_batches, group_size
    )
    usable = gpu.memory_bytes * (1 - options.memory_reserve_fraction)
    bounds = [most_tokens(usable - rank.static_bytes, rank.bytes_per_token, rank.bytes_per_sq_token) for rank in ranks]
    largest_params = max(rank.params for rank in ranks)
    layers = chunk_layers(model.num_layers, scheme.pp, virtual_stages, split)
    per_token, per_sq = _stored_coefficients(model, scheme, options, hardware)
    return SchemeMemory(
        static_bytes=max(rank.static_bytes for rank in ranks),
        activation_bytes_per_token=sum(layers[0]) * per_token,
        activation_bytes_per_token_sq=sum(layers[0]) * per_sq,
        capacity_tokens=min(bounds),
        grad_bytes_per_gpu=largest_params / scheme.tp * BF16_BYTES,
        grad_sync_bytes_per_gpu=grad_sync_bytes(largest_params, scheme.tp, options.sharding, options.grad_reduce_dtype),
    )


@dataclass(frozen=True)
class RankMemory:
    """One pipeline rank's memory: `static + bytes_per_token * T + bytes_per_sq_token * sum(l^2)`
    at its peak, for micro-batches of T tokens (its in-flight micro-batches included)."""

    rank: int
    params: int
    static_bytes: float
    bytes_per_token: float
    bytes_per_sq_token: float

    def peak_bytes(self, lengths: Sequence[int]) -> float:
        return (
            self.static_bytes
            + self.bytes_per_token * sum(lengths)
            + self.bytes_per_sq_token * sum(x * x for x in lengths)
        )


def _stored_coefficients(
    model: ModelSpec, scheme: ParallelScheme, options: AnalyticOptions, hardware: HardwareParams | None
) -> tuple[float, float]:
    scale = 1.0 if hardware is None else activation_scale(hardware)
    per_token, per_sq = activation_coefficients(
        model, scheme.tp, True, options.recompute, options.flash_attention, dropout=False
    )
    return per_token / scheme.cp * scale, per_sq / scheme.cp * scale


def rank_memory_terms(
    model: ModelSpec,
    scheme: ParallelScheme,
    num_gpus: int,
    options: AnalyticOptions,
    hardware: HardwareParams | None = None,
    virtual_stages: int = 1,
    split: PipelineSplit = "even",
    micro_batches: int | None = None,
    group_size: int | None = None,
) -> list[RankMemory]:
    """The memory terms of every pipeline rank that can bind (`scheme_memory` for what they hold)."""
    tp, pp, cp = scheme.tp, scheme.pp, scheme.cp
    layers = chunk_layers(model.num_layers, pp, virtual_stages, split)
    in_flight = in_flight_micro_batches(pp, virtual_stages, micro_batches, group_size)
    scale = 1.0 if hardware is None else activation_scale(hardware)
    per_token, per_sq = _stored_coefficients(model, scheme, options, hardware)
    work, work_sq = 0.0, 0.0
    if options.recompute == "full":
        work, work_sq = activation_coefficients(model, tp, True, "none", options.flash_attention, dropout=False)
        work, work_sq = work / cp * scale, work_sq / cp * scale
    logits = LOSS_VOCAB_COPIES[options.loss] * FP32_BYTES * model.vocab_size / (tp * cp)
    # Under an even 1F1B split a middle rank holds fewer parameters and no more micro-batches in
    # flight than rank 0: only the two ends can bind.
    plain = virtual_stages == 1 and split == "even"
    ranks = []
    for rank in sorted({0, pp - 1}) if plain else range(pp):
        params = _rank_params(model, pp, rank, sum(layers[rank]))
        stored_layers = sum(count * chunk for count, chunk in zip(in_flight[rank], layers[rank]))
        head = logits if rank == pp - 1 else 0.0
        ranks.append(
            RankMemory(
                rank=rank,
                params=params,
                static_bytes=static_bytes(model, params, tp, num_gpus, options)
                + pipelined_fsdp_bytes(model, params, tp, pp, options),
                bytes_per_token=stored_layers * per_token + work + head,
                bytes_per_sq_token=stored_layers * per_sq + work_sq,
            )
        )
    return ranks


def _rank_params(model: ModelSpec, pp: int, rank: int, layers: int) -> int:
    """Parameters of one pipeline rank holding `layers` layers: the whole model when pp == 1,
    else the embedding on the first rank and the LM head on the last."""
    if pp == 1:
        return model.num_params
    ends = (rank == 0) + (rank == pp - 1)
    return layers * model.params_per_layer + ends * model.embedding_params


# ---------------------------------------------------------------------------------------------
# The profile
# ---------------------------------------------------------------------------------------------


def _check_cluster(num_gpus: int, gpus_per_node: int) -> None:
    if num_gpus < 1 or gpus_per_node < 1:
        raise ValueError(f"num_gpus ({num_gpus}) and gpus_per_node ({gpus_per_node}) must be >= 1")
    if num_gpus > gpus_per_node and num_gpus % gpus_per_node:
        raise ValueError(f"num_gpus {num_gpus} is not a multiple of gpus_per_node {gpus_per_node}")
    if num_gpus > limits.MAX_NUM_GPUS:
        raise ValueError(f"num_gpus {num_gpus} is more than the limit of {limits.MAX_NUM_GPUS}")
    if gpus_per_node > limits.MAX_GPUS_PER_NODE:  # scheme enumeration walks the node's divisors
        raise ValueError(f"gpus_per_node {gpus_per_node} is more than the limit of {limits.MAX_GPUS_PER_NODE}")


def _does_not_fit(
    model: ModelSpec,
    gpu: GpuSpec,
    num_gpus: int,
    memories: dict[ParallelScheme, SchemeMemory],
    options: AnalyticOptions,
) -> ValueError:
    """The error for a cluster where no scheme is runnable, naming the closest scheme."""
    usable = gpu.memory_bytes * (1 - options.memory_reserve_fraction)
    prefix = f"{model.name} does not fit in {num_gpus} x {gpu.name}"
    best, best_memory = max(memories.items(), key=lambda item: item[1].capacity_tokens)
    if best_memory.capacity_tokens > 0:
        return ValueError(
            f"{prefix}: the best scheme {best} holds {best_memory.capacity_tokens} tokens per "
            f"micro-batch, below min_capacity_tokens={options.min_capacity_tokens}"
        )
    least, least_memory = min(memories.items(), key=lambda item: item[1].static_bytes)
    return ValueError(
        f"{prefix}: even the scheme with the least static memory, {least}, needs "
        f"{least_memory.static_bytes / GIB:.1f} GiB "
        f"static memory per GPU of {gpu.memory_bytes / GIB:.1f} GiB "
        f"({usable / GIB:.1f} GiB usable after the {options.memory_reserve_fraction:.0%} reserve)"
    )


def build_profile(
    model: ModelSpec,
    gpu: GpuSpec,
    num_gpus: int,
    gpus_per_node: int,
    options: AnalyticOptions = AnalyticOptions(),
    hardware: HardwareParams | None = None,
    virtual_stages: Sequence[int] = (),
) -> CostProfile:
    """The analytic `CostProfile` of every runnable scheme of `model` on `num_gpus` x `gpu`.

    `hardware` replaces the parameters derived from the GPU's specs and `options` (what
    `cost_models.calibrate` fits); None keeps the uncalibrated ones. Raises `ValueError` naming
    the closest scheme when no scheme fits in memory. Each `v > 1` of `virtual_stages` adds the
    interleaved entry `<tp,pp,cp,v>` of every runnable scheme with pp > 1 whose layers split into
    pp x v chunks and that fits in memory under that schedule (`interleaved_scheme_cost`); the
    planner's search does not enumerate them, a strategy or pool that names one uses them.
    """
    _check_cluster(num_gpus, gpus_per_node)
    for chunks in virtual_stages:
        if isinstance(chunks, bool) or not isinstance(chunks, int) or not 1 <= chunks <= limits.MAX_LAYERS:
            raise ValueError(f"virtual stages must be integers in [1, {limits.MAX_LAYERS}], got {chunks!r}")
    memories = {
        scheme: scheme_memory(model, gpu, scheme, num_gpus, options, hardware)
        for scheme in candidate_schemes(model, num_gpus, gpus_per_node, options.max_cp)
    }
    schemes = [
        scheme_cost(model, gpu, scheme, gpus_per_node, memory, options, hardware, num_gpus)
        for scheme, memory in memories.items()
        if memory.capacity_tokens >= options.min_capacity_tokens
    ]
    if not schemes:
        raise _does_not_fit(model, gpu, num_gpus, memories, options)
    plain_entries = list(schemes)  # each v > 1 from the plain entries only (not from another v's)
    for chunks in sorted(set(virtual_stages) - {1}):
        for entry in plain_entries:
            scheme = ParallelScheme(entry.tp, entry.pp, entry.cp, chunks) if entry.pp > 1 else None
            if scheme is None or model.num_layers % (scheme.pp * chunks):
                continue
            memory = scheme_memory(model, gpu, scheme.plain, num_gpus, options, hardware, virtual_stages=chunks)
            if memory.capacity_tokens >= options.min_capacity_tokens:
                schemes.append(
                    interleaved_scheme_cost(model, gpu, scheme, gpus_per_node, memory, options, hardware, num_gpus)
                )
    multi_node = num_gpus > gpus_per_node
    bandwidth = _link_bandwidth(gpu, in_node=not multi_node)
    notes = _notes(num_gpus, gpus_per_node, options)
    if hardware is not None:
        bandwidth = hardware.link_bandwidth(in_node=not multi_node)
        notes += f" Hardware parameters: {hardware}."
    elif options.efficiency == "catalog" and gpu_efficiency(gpu.name) is not None:
        notes += f" Per-GPU efficiencies: {gpu_efficiency(gpu.name).source}"
    return CostProfile(
        source="analytic",
        model=model.name,
        gpu=gpu.name,
        time_unit="s",
        num_layers=model.num_layers,
        gpu_memory_bytes=gpu.memory_bytes,
        memory_reserve_bytes=gpu.memory_bytes * options.memory_reserve_fraction,
        grad_sync_bandwidth_bytes_per_s=bandwidth,
        grad_sync_exposed_fraction=options.dp_sync_exposed,
        recipe=options.recipe(),
        schemes=schemes,
        notes=notes,
    )


def _notes(num_gpus: int, gpus_per_node: int, options: AnalyticOptions) -> str:
    return (
        f"analytic model for {num_gpus} GPUs, {gpus_per_node} per node; options: {options}. "
        "Even PP layer splits only; LM head charged to the last (bottleneck) stage; TP/CP "
        "communication and gradient sync at their exposed shares of the recipe; capacity from 1F1B "
        "stage 0 (pp micro-batches in flight) and "
        "the last stage (one micro-batch plus fp32 logits); static_bytes is the larger stage's and "
        "activation_bytes_per_token stage 0's. Uncalibrated: efficiencies are assumptions."
    )


def interleaved_scheme_cost(
    model: ModelSpec,
    gpu: GpuSpec,
    scheme: ParallelScheme,
    gpus_per_node: int,
    memory: SchemeMemory,
    options: AnalyticOptions,
    hardware: HardwareParams | None = None,
    num_gpus: int | None = None,
) -> SchemeCost:
    """The profile entry of an interleaved scheme (`scheme.v > 1`): the coefficients of one chunk.

    A chunk does `1/v` of its rank's compute, as `scheme_cost` prices it for `<tp,pp,cp>`, and
    its own point-to-point traffic: each chunk receives and sends the stage-boundary activation
    and its gradient, the bytes and latency a plain stage pays once (`pp_comm_s_per_token`,
    `pp_messages_per_micro_batch`; Narayanan et al. 2021 §2.2.2: interleaving multiplies the
    pipeline's point-to-point traffic by v). So a rank's micro-batch costs the plain stage time
    plus `(v - 1)` boundary transfers. `memory` is `scheme_memory(..., virtual_stages=v)`: its
    capacity is the least over every rank under the interleaved schedule (groups of pp); the
    entry's activation bytes are one chunk's, and its in-flight count rank 0's chunk micro-batches.
    """
    if scheme.v == 1:
        raise ValueError(f"scheme {scheme} is not interleaved (v 1): use scheme_cost")
    plain = scheme_cost(model, gpu, scheme.plain, gpus_per_node, memory, options, hardware, num_gpus)
    params = hardware or HardwareParams.from_specs(gpu, options)
    p2p_b = pp_comm_s_per_token(model, gpu, scheme.plain, gpus_per_node, params)
    p2p_c = pp_messages_per_micro_batch(scheme.plain) * params.link_latency(scheme.num_gpus <= gpus_per_node)
    return chunk_entry(plain, scheme.v, p2p_b, p2p_c)  # plain: priced with the interleaved memory


def chunk_entry(plain: SchemeCost, chunks: int, p2p_s_per_token: float, p2p_s_per_micro_batch: float) -> SchemeCost:
    """The entry `<tp,pp,cp,chunks>` from the plain one's: one chunk does `1/v` of the stage's work
    (`a`, `b`, `c` and the stored activations, the layers split evenly) and its own boundary
    transfers (`p2p_s_per_token`, `p2p_s_per_micro_batch`: the activation and its gradient, which
    the plain `b` and `c` hold once); the in-flight count is rank 0's under interleaving with
    groups of pp (`pipeline_layout.in_flight_micro_batches`). A given capacity is kept: the caller
    states the capacity under the interleaved schedule (or drops it to have it derived)."""
    if chunks < 2 or plain.v != 1 or plain.pp < 2:
        raise ValueError(f"chunk_entry needs a plain entry with pp > 1 and chunks > 1, got {plain.key} x {chunks}")
    return plain.model_copy(
        update={
            "v": chunks,
            "a": plain.a / chunks,
            "b": max(0.0, plain.b - p2p_s_per_token) / chunks + p2p_s_per_token,
            "c": max(0.0, plain.c - p2p_s_per_micro_batch) / chunks + p2p_s_per_micro_batch,
            "activation_bytes_per_token": None
            if plain.activation_bytes_per_token is None
            else plain.activation_bytes_per_token / chunks,
            "activation_bytes_per_token_sq": plain.activation_bytes_per_token_sq / chunks,
            "in_flight_micro_batches": sum(in_flight_micro_batches(plain.pp, chunks)[0]),
        }
    )
