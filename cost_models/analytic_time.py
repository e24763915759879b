"""Analytic stage time of a scheme: FLOPs of a Llama-style layer, communication per token, and the
`a, b, c` coefficients they give at the rates of a `HardwareParams` set.

Split from `analytic` (which keeps the options, the memory model and the profile); the formulas
and their sources are unchanged, and with `HardwareParams.from_specs` the numbers are too.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from hydraplan.cost_models.hardware import HardwareParams
from hydraplan.cost_models.recipe import dp_bus_bandwidth, zero3_gather_bytes_per_micro_batch
from hydraplan.planner.schemas import GpuSpec, ModelSpec, SchemeCost
from hydraplan.planner.scheme import ParallelScheme

if TYPE_CHECKING:
    from hydraplan.cost_models.analytic import AnalyticOptions, SchemeMemory

Recompute = Literal["none", "selective", "selective-op", "full"]
RECOMPUTE_CHOICES = ("none", "selective", "selective-op", "full")

BF16_BYTES = 2
# The LM head is never recomputed: fwd+bwd = 3x forward (Narayanan et al. 2021 count 6hV).
HEAD_PASS_FACTOR = 3.0
FWD_FRACTION = 1 / 3


def fwd_fraction(recompute: Recompute) -> float:
    """Share of a stage's time in the forward pass: forward 1 : backward 2 (Narayanan et al. 2021
    §5.1), so 1/3; under full recompute the backward pass also reruns the forward, 1/(1+2+1) = 1/4
    (Korthikanti et al. 2022 §5: full recomputation adds a forward pass to the backward)."""
    if recompute == "full":
        return 1 / 4
    return 1 / 3.5 if recompute == "selective-op" else FWD_FRACTION


# ---------------------------------------------------------------------------------------------
# FLOPs (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
# Using Megatron-LM", §5.1: 2 FLOPs per multiply-add, backward = 2x forward)
# ---------------------------------------------------------------------------------------------


def linear_forward_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of one layer's weight matmuls: 2 per weight.

    Attention projections `2*(h*(h + 2*kv_dim) + h*h)`, MLP `2*(3 if gated else 2)*h*f`.
    """
    h, f = model.hidden_size, model.ffn_hidden_size
    attention = 2 * (h * (h + 2 * model.kv_dim) + h * h)
    mlp = 2 * (3 if model.gated_mlp else 2) * h * f
    return float(attention + mlp)


def attention_forward_flops_per_sq_token(model: ModelSpec, causal: bool) -> float:
    """Forward FLOPs of one layer's attention scores per squared sequence length.

    `Q K^T` and `softmax(.) V` cost `2*l^2*h` each for a sequence of length l: `4*l^2*h`; a causal
    mask halves it (only the lower triangle is computed by causal kernels).
    """
    return 4.0 * model.hidden_size * (0.5 if causal else 1.0)


def lm_head_forward_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of the output projection to the vocabulary: `2*h*V` per token."""
    return 2.0 * model.hidden_size * model.vocab_size


def linear_pass_factor(recompute: Recompute) -> float:
    """Forward+backward FLOPs of weight matmuls as a multiple of forward: 3, or 4 under full
    recompute (the forward runs again; Narayanan et al. 2021 §5.1); 3.5 under torchtitan's op-level
    selective checkpointing, which reruns every other matmul of the forward in the backward
    (torchtitan `parallelize_llama.py`, `_save_list` policy "recompute every other mm", 2024)."""
    if recompute == "full":
        return 4.0
    return 3.5 if recompute == "selective-op" else 3.0


def attention_pass_factor(recompute: Recompute, flash_attention: bool) -> float:
    """Forward+backward FLOPs of attention scores as a multiple of forward.

    Forward 1 + backward 2; full recompute reruns the forward (+1). Selective recompute reruns the
    core attention (+1, Korthikanti et al. 2022 §5) unless flash attention is used: its backward
    recomputes `Q K^T`, one of the two forward matmuls (+0.5, Dao et al. 2022, Algorithm 4), and
    Megatron-LM does not checkpoint the flash core attention again. torchtitan's "selective-op"
    saves the attention output, so its attention counts as under "selective".
    """
    factor = 3.0 + (1.0 if recompute == "full" else 0.0)
    if flash_attention:
        return factor + 0.5
    return factor + (1.0 if recompute == "selective" else 0.0)


def training_flops_per_token(
    model: ModelSpec,
    seq_len: int,
    recompute: Recompute = "full",
    causal: bool = False,
    flash_attention: bool = False,
) -> float:
    """Forward+backward FLOPs per token of a whole model for sequences of length `seq_len`.

    With the defaults (full recompute, non-causal, no flash) this is Narayanan et al. 2021's
    `F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h))` divided by the `B*s` tokens, for a GPT model.
    """
    per_layer = linear_forward_flops_per_token(model) * linear_pass_factor(recompute)
    per_layer += (
        attention_forward_flops_per_sq_token(model, causal)
        * seq_len
        * attention_pass_factor(recompute, flash_attention)
    )
    head = lm_head_forward_flops_per_token(model) * HEAD_PASS_FACTOR
    return model.num_layers * per_layer + head


# ---------------------------------------------------------------------------------------------
# Time per scheme
# ---------------------------------------------------------------------------------------------


def activation_scale(hardware: HardwareParams) -> float:
    """Stored activation bytes relative to the bf16 Korthikanti count (1.0 uncalibrated)."""
    return hardware.activation_element_bytes / BF16_BYTES * hardware.activation_memory_scale


def ring_all_reduce_factor(num_ranks: int) -> float:
    """Bytes each rank sends per byte of buffer in a ring all-reduce, `2(n-1)/n` (Patarasuk & Yuan
    2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations")."""
    return 2 * (num_ranks - 1) / num_ranks


def _link_bandwidth(gpu: GpuSpec, in_node: bool) -> float:
    """Per-GPU bandwidth of NVLink inside a node, else of the network."""
    if in_node:
        return gpu.intra_node_bandwidth_bytes_per_s
    return gpu.inter_node_bandwidth_bytes_per_s


def tp_collectives_per_micro_batch(model: ModelSpec, scheme: ParallelScheme) -> int:
    """TP collectives of one stage per micro-batch: two forward and two backward per layer."""
    return 0 if scheme.tp == 1 else 4 * (model.num_layers // scheme.pp)


def cp_messages_per_micro_batch(model: ModelSpec, scheme: ParallelScheme) -> int:
    """Ring-attention steps of one stage per micro-batch: cp-1 forward and 2(cp-1) backward per layer."""
    return 3 * (scheme.cp - 1) * (model.num_layers // scheme.pp)


def pp_messages_per_micro_batch(scheme: ParallelScheme) -> int:
    """Point-to-point transfers of one stage per micro-batch: the activation and its gradient."""
    return 0 if scheme.pp == 1 else 2


def comm_latency_s_per_micro_batch(
    model: ModelSpec, scheme: ParallelScheme, gpus_per_node: int, hardware: HardwareParams
) -> float:
    """Latency part of the per-micro-batch time `c`: one link latency per collective or message."""
    tp_s = tp_collectives_per_micro_batch(model, scheme) * hardware.intra_node_latency_s
    cp_s = cp_messages_per_micro_batch(model, scheme) * hardware.link_latency(scheme.tp * scheme.cp <= gpus_per_node)
    pp_s = pp_messages_per_micro_batch(scheme) * hardware.link_latency(scheme.num_gpus <= gpus_per_node)
    return tp_s + cp_s + pp_s


def tp_comm_s_per_token(
    model: ModelSpec, gpu: GpuSpec, scheme: ParallelScheme, hardware: HardwareParams | None = None
) -> float:
    """Tensor-parallel communication of one stage per micro-batch token.

    With sequence parallelism each layer runs all-gathers and reduce-scatters worth two all-reduces
    of the `2h`-byte activation forward and two backward (Korthikanti et al. 2022 §4.2.2), over
    NVLink; each GPU handles the `1/cp` of the tokens of its CP rank.
    """
    layers = model.num_layers // scheme.pp
    element_bytes = BF16_BYTES if hardware is None else hardware.activation_element_bytes
    bandwidth = gpu.intra_node_bandwidth_bytes_per_s if hardware is None else hardware.intra_node_bandwidth_bytes_per_s
    per_layer_bytes = 4 * ring_all_reduce_factor(scheme.tp) * element_bytes * model.hidden_size
    return layers * per_layer_bytes / scheme.cp / bandwidth


def cp_comm_s_per_token(
    model: ModelSpec,
    gpu: GpuSpec,
    scheme: ParallelScheme,
    gpus_per_node: int,
    hardware: HardwareParams | None = None,
) -> float:
    """Context-parallel (ring attention) communication of one stage per micro-batch token.

    Each layer passes the K and V blocks (`2*kv_dim*2` bytes per token, heads split over TP) around
    the ring, `(cp-1)/cp` of them per GPU, in the forward pass and twice that in the backward pass
    (K, V and their gradients) (Liu et al. 2023, "Ring Attention with Blockwise Transformers").
    NVLink if the TP x CP group fits in a node, else the network.
    """
    layers = model.num_layers // scheme.pp
    element_bytes = BF16_BYTES if hardware is None else hardware.activation_element_bytes
    kv_bytes = 2 * model.kv_dim * element_bytes / scheme.tp
    per_layer_bytes = 3 * (scheme.cp - 1) / scheme.cp * kv_bytes
    in_node = scheme.tp * scheme.cp <= gpus_per_node
    bandwidth = _link_bandwidth(gpu, in_node) if hardware is None else hardware.link_bandwidth(in_node)
    return layers * per_layer_bytes / bandwidth


def pp_comm_s_per_token(
    model: ModelSpec,
    gpu: GpuSpec,
    scheme: ParallelScheme,
    gpus_per_node: int,
    hardware: HardwareParams | None = None,
) -> float:
    """Pipeline point-to-point time of one stage per micro-batch token.

    The stage-boundary activation (`2h` bytes per token, split over TP by the scatter/gather
    optimisation and over CP) is sent forward and its gradient backward (Narayanan et al. 2021
    §4.1); over the network when the pipeline spans nodes.
    """
    if scheme.pp == 1:
        return 0.0
    element_bytes = BF16_BYTES if hardware is None else hardware.activation_element_bytes
    boundary_bytes = element_bytes * model.hidden_size / (scheme.tp * scheme.cp)
    in_node = scheme.num_gpus <= gpus_per_node
    bandwidth = _link_bandwidth(gpu, in_node) if hardware is None else hardware.link_bandwidth(in_node)
    return 2 * boundary_bytes / bandwidth


def attention_flops_per_sq_token_per_device(
    model: ModelSpec, scheme: ParallelScheme, options: AnalyticOptions
) -> float:
    """Forward+backward attention score FLOPs of one stage per squared sequence length, per device."""
    layers = model.num_layers // scheme.pp
    flops = (
        layers
        * attention_forward_flops_per_sq_token(model, options.causal)
        * attention_pass_factor(options.recompute, options.flash_attention)
    )
    return flops / scheme.gpus_per_stage


def attention_s_per_sq_token(
    model: ModelSpec,
    gpu: GpuSpec,
    scheme: ParallelScheme,
    options: AnalyticOptions,
    hardware: HardwareParams | None = None,
) -> float:
    """`a`: attention score time of one stage per squared sequence length.

    The achieved rate falls with the query heads per device (`hardware.attention_half_heads`);
    its fall with short sequences is linear in l and lands in `b` (`attention_short_s_per_token`).
    """
    hardware = hardware or HardwareParams.from_specs(gpu, options)
    heads_factor = 1.0 + hardware.attention_half_heads / (model.num_heads / scheme.tp)
    per_device = attention_flops_per_sq_token_per_device(model, scheme, options)
    return per_device / hardware.attention_flops_per_s * heads_factor


def attention_short_s_per_token(
    model: ModelSpec, scheme: ParallelScheme, options: AnalyticOptions, hardware: HardwareParams
) -> float:
    """Extra attention time per token from short local sequences: at a rate divided by
    `1 + l0 / (l / cp)`, `x * l^2` seconds become `x * l^2 + x * l0 * cp * l`."""
    if hardware.attention_half_length_tokens == 0:
        return 0.0
    per_device = attention_flops_per_sq_token_per_device(model, scheme, options)
    return per_device / hardware.attention_flops_per_s * hardware.attention_half_length_tokens * scheme.cp


def gemm_shapes(model: ModelSpec, tp: int) -> list[tuple[float, float]]:
    """(forward FLOPs per token, smaller per-device weight dimension) of one layer's GEMMs under TP.

    Megatron splits QKV, gate and up by columns and the output and down projections by rows
    (Shoeybi et al. 2019, "Megatron-LM", §3); the LM head is split over the vocabulary.
    """
    h, f, kv_dim = model.hidden_size, model.ffn_hidden_size, model.kv_dim
    mlp_in = 2 if model.gated_mlp else 1
    return [
        (2.0 * h * (h + 2 * kv_dim) / tp, min(h, (h + 2 * kv_dim) / tp)),
        (2.0 * h * h / tp, min(h / tp, h)),
        (2.0 * mlp_in * h * f / tp, min(h, f / tp)),
        (2.0 * f * h / tp, min(f / tp, h)),
    ]


def gemm_shape_penalty_flops(
    model: ModelSpec, scheme: ParallelScheme, options: AnalyticOptions, half_dim: float
) -> float:
    """FLOPs to add per token so that `(flops + penalty) / rate` charges every GEMM at its achieved
    rate `rate * d / (d + half_dim)`: `sum(flops_g * half_dim / d_g)` (per stage, before / tp*cp)."""
    if half_dim == 0:
        return 0.0
    layers = model.num_layers // scheme.pp
    per_layer = sum(flops * half_dim / dim for flops, dim in gemm_shapes(model, scheme.tp))
    head = lm_head_forward_flops_per_token(model) / scheme.tp
    head_penalty = head * half_dim / min(model.hidden_size, model.vocab_size / scheme.tp) * HEAD_PASS_FACTOR
    return (layers * per_layer * linear_pass_factor(options.recompute) + head_penalty) * scheme.tp


def matmul_s_per_token(
    model: ModelSpec,
    gpu: GpuSpec,
    scheme: ParallelScheme,
    options: AnalyticOptions,
    hardware: HardwareParams | None = None,
) -> float:
    """Compute part of `b`: weight matmuls of the last stage (its layers plus the LM head)."""
    hardware = hardware or HardwareParams.from_specs(gpu, options)
    layers = model.num_layers // scheme.pp
    flops = layers * linear_forward_flops_per_token(model) * linear_pass_factor(options.recompute)
    flops += lm_head_forward_flops_per_token(model) * HEAD_PASS_FACTOR
    flops += gemm_shape_penalty_flops(model, scheme, options, hardware.gemm_half_dim)
    return flops / scheme.gpus_per_stage / hardware.gemm_flops_per_s


def memory_bound_bytes_per_token(model: ModelSpec, scheme: ParallelScheme, element_bytes: float) -> float:
    """Bytes the memory-bound kernels of one stage move per token per device, forward+backward.

    Per layer and forward: two RMSNorms (read and write h), two residual adds (read 2h, write h),
    rotary on Q and K (read and write h + kv_dim) and the SwiGLU product (read 2f, write f), split
    over TP (sequence parallelism for the replicated part) and CP; the backward moves about twice
    that (3x in all). An estimate to be calibrated through `memory_bound_bytes_per_s`.
    """
    h, f = model.hidden_size, model.ffn_hidden_size
    per_layer = 4 * h + 6 * h + 2 * (h + model.kv_dim) + (3 * f if model.gated_mlp else 2 * f)
    layers = model.num_layers // scheme.pp
    return 3 * layers * per_layer * element_bytes / scheme.gpus_per_stage


def unsplit_s_per_token(model: ModelSpec, scheme: ParallelScheme, hardware: HardwareParams) -> float:
    """Per-token time every TP rank spends on work TP does not split (CP still splits the tokens)."""
    if hardware.unsplit_s_per_token_per_layer == 0:
        return 0.0
    return hardware.unsplit_s_per_token_per_layer * (model.num_layers // scheme.pp) / scheme.cp


def memory_bound_s_per_token(model: ModelSpec, scheme: ParallelScheme, hardware: HardwareParams) -> float:
    if math.isinf(hardware.memory_bound_bytes_per_s):
        return 0.0
    element_bytes = hardware.activation_element_bytes
    return memory_bound_bytes_per_token(model, scheme, element_bytes) / hardware.memory_bound_bytes_per_s


def zero3_gather_s_per_micro_batch(
    model: ModelSpec,
    scheme: ParallelScheme,
    num_gpus: int,
    gpus_per_node: int,
    options: AnalyticOptions,
    hardware: HardwareParams,
) -> float:
    """Exposed time of the zero3 weight all-gathers of one micro-batch (forward and backward) on
    the data-parallel bus bandwidth (one link per GPU under flat efficiency, like its gradient
    sync), for the replicas of a homogeneous strategy of this scheme; 0 for zero1 and zero2."""
    if options.sharding != "zero3":
        return 0.0
    replicas = max(1, num_gpus // scheme.num_gpus) * scheme.cp
    params = model.num_layers // scheme.pp * model.params_per_layer + model.embedding_params
    gathered = zero3_gather_bytes_per_micro_batch(params, scheme.tp, replicas)
    if options.efficiency == "flat":  # as the flat model's gradient sync: one link per GPU
        bandwidth = hardware.link_bandwidth(in_node=num_gpus <= gpus_per_node)
    else:
        bandwidth = dp_bus_bandwidth(
            scheme,
            num_gpus,
            gpus_per_node,
            hardware.intra_node_bandwidth_bytes_per_s,
            hardware.inter_node_bandwidth_bytes_per_s,
        )
    return gathered / bandwidth * options.dp_sync_exposed


def scheme_cost(
    model: ModelSpec,
    gpu: GpuSpec,
    scheme: ParallelScheme,
    gpus_per_node: int,
    memory: SchemeMemory,
    options: AnalyticOptions,
    hardware: HardwareParams | None = None,
    num_gpus: int | None = None,
) -> SchemeCost:
    """The profile entry of one runnable scheme (times in seconds).

    TP and CP communication count at their exposed shares (`options.tp_comm_exposed`,
    `cp_comm_exposed`); the forward share follows the recompute (`fwd_fraction`). With
    `num_gpus`, the entry carries its gradient all-reduce bytes and data-parallel bus bandwidth
    (`recipe.dp_bus_bandwidth`) and zero3 weight gathers land in `c`.
    """
    hardware = hardware or HardwareParams.from_specs(gpu, options)
    b = (
        matmul_s_per_token(model, gpu, scheme, options, hardware)
        + tp_comm_s_per_token(model, gpu, scheme, hardware) * options.tp_comm_exposed
        + cp_comm_s_per_token(model, gpu, scheme, gpus_per_node, hardware) * options.cp_comm_exposed
        + pp_comm_s_per_token(model, gpu, scheme, gpus_per_node, hardware)
        + attention_short_s_per_token(model, scheme, options, hardware)
        + memory_bound_s_per_token(model, scheme, hardware)
        + unsplit_s_per_token(model, scheme, hardware)
    )
    c = hardware.per_layer_overhead_s * (model.num_layers // scheme.pp)
    c += hardware.per_micro_batch_overhead_s + comm_latency_s_per_micro_batch(model, scheme, gpus_per_node, hardware)
    sync_fields: dict[str, float] = {}
    if num_gpus is not None:
        c += zero3_gather_s_per_micro_batch(model, scheme, num_gpus, gpus_per_node, options, hardware)
        if memory.grad_sync_bytes_per_gpu != memory.grad_bytes_per_gpu:
            sync_fields["grad_sync_bytes_per_gpu"] = memory.grad_sync_bytes_per_gpu
        if options.efficiency == "catalog":  # "flat": the profile's one link bandwidth, as before
            sync_fields["grad_sync_bandwidth_bytes_per_s"] = dp_bus_bandwidth(
                scheme,
                num_gpus,
                gpus_per_node,
                hardware.intra_node_bandwidth_bytes_per_s,
                hardware.inter_node_bandwidth_bytes_per_s,
            )
    return SchemeCost(
        tp=scheme.tp,
        pp=scheme.pp,
        cp=scheme.cp,
        a=attention_s_per_sq_token(model, gpu, scheme, options, hardware),
        b=b,
        c=c,
        fwd_fraction=fwd_fraction(options.recompute),
        capacity_tokens=memory.capacity_tokens,
        static_bytes=memory.static_bytes,
        activation_bytes_per_token=memory.activation_bytes_per_token,
        activation_bytes_per_token_sq=memory.activation_bytes_per_token_sq,
        in_flight_micro_batches=scheme.pp,
        grad_bytes_per_gpu=memory.grad_bytes_per_gpu,
        **sync_fields,
    )
