"""The training recipe's share of the analytic model: sharded static memory (ZeRO / FSDP), the
gradient synchronisation it implies, and the data-parallel bus bandwidth of a cluster.

Static bytes per GPU for a weight shard of `P` parameters (the stage's, split by TP), `Psi` the
whole model and `N` the GPUs the optimizer state is sharded over (Rajbhandari et al. 2020, "ZeRO:
Memory Optimizations Toward Training Trillion Parameter Models", §5: `(2 + 2 + K) Psi` unsharded
with K = 12 for fp32 master weights and Adam moments):

- `zero1` (optimizer state sharded, Megatron-LM's distributed optimizer): `P*(2 + g) + Psi*K/N`;
- `zero2` (also gradients): `2P + Psi*(g + K)/N`;
- `zero3` / `fsdp` (also weights, torchtitan's FSDP2): `Psi*(2 + g + K)/N` plus the gathered bf16
  weights of two layers (the running one and the prefetched one) and one layer's unsharded
  gradient before its reduce-scatter;

with `g` the gradient element (4 fp32, 2 bf16) and `K = 4 + 2*o` (fp32 master weights and two Adam
moments of `o` bytes each). Gradient synchronisation per step: an all-reduce of the gradients in
the reduce dtype for zero1 and zero2 (reduce-scatter + all-gather of the updated weights move the
same bytes), a reduce-scatter only for zero3 (half the bytes), whose weight all-gathers run every
micro-batch (forward and backward) and are charged there.
"""

from __future__ import annotations

from typing import Literal

from hydraplan.planner.schemas import ModelSpec
from hydraplan.planner.scheme import ParallelScheme

__all__ = [
    "DTYPE_BYTES",
    "Dtype",
    "Sharding",
    "dp_bus_bandwidth",
    "grad_sync_bytes",
    "normalise_sharding",
    "sharded_static_bytes",
    "zero3_gather_bytes_per_micro_batch",
]

Sharding = Literal["zero1", "zero2", "zero3"]
Dtype = Literal["fp32", "bf16"]
SHARDING_NAMES = ("zero1", "zero2", "zero3", "fsdp")
DTYPE_BYTES = {"fp32": 4, "bf16": 2}
BF16_BYTES = 2
MASTER_WEIGHT_BYTES = 4


def normalise_sharding(name: str) -> Sharding:
    """`fsdp` is ZeRO-3 (fully sharded weights, gradients and optimizer state)."""
    if name not in SHARDING_NAMES:
        raise ValueError(f"sharding must be one of {', '.join(SHARDING_NAMES)}, got {name!r}")
    return "zero3" if name == "fsdp" else name  # type: ignore[return-value]


def optimizer_bytes_per_param(optimizer_dtype: Dtype) -> int:
    """`K`: fp32 master weight plus Adam's two moments in `optimizer_dtype`."""
    return MASTER_WEIGHT_BYTES + 2 * DTYPE_BYTES[optimizer_dtype]


def sharded_static_bytes(
    model: ModelSpec,
    params_of_stage: int,
    tp: int,
    num_gpus: int,
    sharding: Sharding,
    grad_dtype: Dtype,
    optimizer_dtype: Dtype,
) -> float:
    """Weights, gradients and optimizer state per GPU (module docstring for the formulas).

    The sharded parts are spread over all `num_gpus` (a heterogeneous strategy re-shards the
    optimizer over every GPU, as the existing ZeRO-1 model did).
    """
    shard = params_of_stage / tp
    grad_bytes = DTYPE_BYTES[grad_dtype]
    optimizer_bytes = optimizer_bytes_per_param(optimizer_dtype)
    spread = model.num_params / num_gpus
    if sharding == "zero1":
        return shard * (BF16_BYTES + grad_bytes) + spread * optimizer_bytes
    if sharding == "zero2":
        return shard * BF16_BYTES + spread * (grad_bytes + optimizer_bytes)
    largest_unit = max(model.params_per_layer, model.embedding_params) / tp
    working = largest_unit * (2 * BF16_BYTES + grad_bytes)
    return spread * (BF16_BYTES + grad_bytes + optimizer_bytes) + working


def grad_sync_bytes(params_of_stage: int, tp: int, sharding: Sharding, reduce_dtype: Dtype) -> float:
    """Bytes per GPU whose ring all-reduce time equals the step's gradient synchronisation: the
    shard's gradients in the reduce dtype, half of them for zero3 (a reduce-scatter moves
    `(n-1)/n` of the buffer, an all-reduce `2(n-1)/n`)."""
    sync = params_of_stage / tp * DTYPE_BYTES[reduce_dtype]
    return sync / 2 if sharding == "zero3" else sync


def zero3_gather_bytes_per_micro_batch(params_of_stage: int, tp: int, num_replicas: int) -> float:
    """Bytes each GPU receives per micro-batch under zero3: the bf16 weights of its stage shard
    all-gathered in the forward and again in the backward pass, `2 * (n-1)/n * P * 2`."""
    if num_replicas <= 1:
        return 0.0
    return 2 * (num_replicas - 1) / num_replicas * params_of_stage / tp * BF16_BYTES


def replicas_per_node(scheme: ParallelScheme, gpus_per_node: int) -> int:
    """GPUs of one node holding the same weight shard when pipelines are placed contiguously:
    the CP ranks of each pipeline inside the node, times the pipelines the node holds."""
    pipelines_in_node = max(1, gpus_per_node // scheme.num_gpus)
    cp_in_node = min(scheme.cp, max(1, gpus_per_node // (scheme.tp * scheme.pp)))
    return pipelines_in_node * cp_in_node


def dp_bus_bandwidth(
    scheme: ParallelScheme,
    num_gpus: int,
    gpus_per_node: int,
    intra_bandwidth: float,
    inter_bandwidth: float,
) -> float:
    """Bus bandwidth per GPU of the gradient all-reduce of `scheme`'s replicas.

    Inside one node: NVLink. Across nodes NCCL runs one ring (channel) per NIC, so the `g`
    replicas a node holds move their buffer through `g` NICs at once: bus bandwidth
    `min(NVLink, g * NIC)` (NCCL's bus-bandwidth definition, nccl-tests doc/PERFORMANCE.md:
    busbw = algbw * 2(n-1)/n for all-reduce).
    """
    if num_gpus <= gpus_per_node:
        return intra_bandwidth
    return min(intra_bandwidth, replicas_per_node(scheme, gpus_per_node) * inter_bandwidth)
