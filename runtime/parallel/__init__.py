"""Tensor and context parallelism of one pipeline stage (`parallelize_stage`), torchtitan-style:
the model code stays as it is and the parallelize function swaps its layers for sharded ones.

- `parallelize_stage(stage, tp=, cp=, tp_group=, cp_group=)`: the stage with TP-sharded weights
  (`runtime/parallel/tp.py`) and CP attention (`runtime/parallel/cp.py`); same forward contract.
  Under CP, give each rank its share of the batch with `cp_shard(batch, cp_rank, cp)`.
- `parameter_slices(module)`: for every parameter (canonical name), the index range of the full
  tensor it holds: the "one parameter space, many layouts" naming of the design.
- `reduce_replica_grads(module, group)`: sum gradients over ranks that hold the same slices (the
  CP group after backward).
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from hydraplan.runtime.batch import cp_shard
from hydraplan.runtime.model import DecoderStage
from hydraplan.runtime.parallel.comm import group_rank, group_size
from hydraplan.runtime.parallel.cp import ContextParallelAttentionCore
from hydraplan.runtime.parallel.tp import (
    ColumnParallelLinear,
    CopyBlockInput,
    RowParallelLinear,
    ShardedWeight,
    VocabParallelCrossEntropy,
    VocabParallelEmbedding,
    even_range,
)

__all__ = ["cp_shard", "parallelize_stage", "parameter_slices", "reduce_replica_grads"]


def _check_group(name: str, degree: int, group: dist.ProcessGroup | None) -> None:
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise ValueError(f"{name}: a positive integer is required, got {degree!r}")
    if degree > 1 and group_size(group) != degree:
        raise ValueError(f"{name}={degree} but its process group has {group_size(group)} ranks")


def parallelize_stage(
    stage_module: DecoderStage,
    *,
    tp: int,
    cp: int,
    tp_group: dist.ProcessGroup | None,
    cp_group: dist.ProcessGroup | None,
) -> DecoderStage:
    """Shard an unsharded stage in place for this rank of `tp_group` and `cp_group`; returns it.

    `tp` must divide `num_kv_heads` (and so `num_heads`); the MLP width and the vocabulary are cut
    into near-equal contiguous parts (any `tp`). Each rank keeps the slices of the full weights
    it owns, so shards hold exactly the single-process values.
    """
    cfg = stage_module.cfg
    _check_group("tp", tp, tp_group)
    _check_group("cp", cp, cp_group)
    if cfg.num_kv_heads % tp:
        raise ValueError(f"tp={tp} does not divide num_kv_heads={cfg.num_kv_heads} (nor perhaps num_heads)")
    if tp > 1:
        _shard_tensor_parallel(stage_module, tp, group_rank(tp_group), tp_group)
    if cp > 1:
        for layer in stage_module.layers.values():
            layer.attn.core = ContextParallelAttentionCore(cp_group)
    return stage_module


def _shard_tensor_parallel(stage: DecoderStage, tp: int, rank: int, group: dist.ProcessGroup | None) -> None:
    cfg = stage.cfg
    head_dim = cfg.head_dim
    q_rows = [bound * head_dim for bound in even_range(cfg.num_heads, tp, rank)]
    kv_rows = [bound * head_dim for bound in even_range(cfg.num_kv_heads, tp, rank)]
    ffn_rows = even_range(cfg.ffn_hidden_size, tp, rank)
    for layer in stage.layers.values():
        attn, mlp = layer.attn, layer.mlp
        attn.register_forward_pre_hook(CopyBlockInput(group))
        mlp.register_forward_pre_hook(CopyBlockInput(group))
        attn.wq = ColumnParallelLinear(attn.wq.weight, *q_rows, group)
        attn.wk = ColumnParallelLinear(attn.wk.weight, *kv_rows, group)
        attn.wv = ColumnParallelLinear(attn.wv.weight, *kv_rows, group)
        attn.wo = RowParallelLinear(attn.wo.weight, *q_rows, group)
        if mlp.w_gate is not None:
            mlp.w_gate = ColumnParallelLinear(mlp.w_gate.weight, *ffn_rows, group)
        mlp.w_up = ColumnParallelLinear(mlp.w_up.weight, *ffn_rows, group)
        mlp.w_down = RowParallelLinear(mlp.w_down.weight, *ffn_rows, group)
    vocab = even_range(cfg.vocab_size, tp, rank)
    if stage.embed is not None:
        stage.embed = VocabParallelEmbedding(stage.embed.weight, *vocab, group)
    if stage.lm_head is not None:
        stage.lm_head = ShardedWeight(stage.lm_head.weight, 0, *vocab)
    if stage.loss is not None:
        stage.loss = VocabParallelCrossEntropy(*vocab, group)


def parameter_slices(module: nn.Module) -> dict[str, tuple[slice, ...]]:
    """Canonical parameter name -> the index range of the full tensor this module's copy holds."""
    slices = {}
    for module_name, owner in module.named_modules():
        for name, parameter in owner.named_parameters(recurse=False):
            full = [slice(None)] * parameter.dim()
            shard = getattr(owner, "shard", None)
            if shard is not None:
                dim, start, stop = shard
                full[dim] = slice(start, stop)
            slices[f"{module_name}.{name}" if module_name else name] = tuple(full)
    return slices


def reduce_replica_grads(module: nn.Module, group: dist.ProcessGroup | None) -> None:
    """Sum every parameter's gradient over `group` in place (ranks holding the same slices)."""
    if group_size(group) == 1:
        return
    for parameter in module.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad, group=group)
