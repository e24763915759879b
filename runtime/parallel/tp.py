"""Tensor parallelism of a stage: column/row-parallel linears, vocabulary-parallel embedding and loss.

Megatron-LM's layout (Shoeybi et al. 2019, arXiv 1909.08053): in attention, `wq`, `wk`, `wv` are
split by output rows (column-parallel: each rank computes whole heads, `num_heads / tp` query and
`num_kv_heads / tp` key/value heads, so grouped-query attention stays local) and `wo` by input
columns (row-parallel, one all-reduce); in the MLP, `w_gate`, `w_up` by rows and `w_down` by
columns. The embedding table and the LM head are split by vocabulary rows; the loss is the
vocabulary-parallel cross-entropy (a max, a sum of exponentials and the target logit, each reduced
over the group), so no rank holds all logits. Norm weights are replicated: their inputs are
replicated and the gradients reaching them are already summed by the f operator, so they come
out whole and identical on every rank.

Every sharded module records `shard = (dim, start, stop)`: the index range of the full tensor it
holds (`parameter_slices` in `runtime/parallel/__init__.py` reads it).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hydraplan.runtime.batch import IGNORE_INDEX
from hydraplan.runtime.comm_meter import timed
from hydraplan.runtime.parallel.comm import copy_to_group, reduce_from_group

__all__ = [
    "ColumnParallelLinear",
    "CopyBlockInput",
    "RowParallelLinear",
    "VocabParallelCrossEntropy",
    "VocabParallelEmbedding",
    "ShardedWeight",
    "even_range",
]


def even_range(size: int, parts: int, index: int) -> tuple[int, int]:
    """`[start, stop)` of part `index` when `size` is cut into `parts` near-equal contiguous parts."""
    return size * index // parts, size * (index + 1) // parts


def _slice_parameter(weight: torch.Tensor, dim: int, start: int, stop: int) -> nn.Parameter:
    return nn.Parameter(weight.detach().narrow(dim, start, stop - start).clone())


class ShardedWeight(nn.Module):
    """A slice of a full weight along `dim`, used as it is by the module that owns it (LM head)."""

    def __init__(self, weight: torch.Tensor, dim: int, start: int, stop: int) -> None:
        super().__init__()
        self.weight = _slice_parameter(weight, dim, start, stop)
        self.shard = (dim, start, stop)


class ColumnParallelLinear(ShardedWeight):
    """Output rows `[start, stop)` of `x @ W.T`, no communication: the f operator sits once at the
    input of the block that holds it (`copy_block_input`), as for Megatron-LM's fused QKV."""

    def __init__(self, weight: torch.Tensor, start: int, stop: int, group: dist.ProcessGroup | None) -> None:
        super().__init__(weight, 0, start, stop)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class CopyBlockInput:
    """A forward pre-hook putting the f operator (`copy_to_group`) on a block's first argument:
    one gradient all-reduce for all the column-parallel linears that read it (attention's
    wq/wk/wv, the MLP's w_gate/w_up). A hook keeps the block's canonical parameter names."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group

    def __call__(self, module: nn.Module, args: tuple) -> tuple:
        return (copy_to_group(args[0], self.group), *args[1:])


class RowParallelLinear(ShardedWeight):
    """Input columns `[start, stop)`: a partial `x_shard @ W_shard.T`, summed over the group (g)."""

    def __init__(self, weight: torch.Tensor, start: int, stop: int, group: dist.ProcessGroup | None) -> None:
        super().__init__(weight, 1, start, stop)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return reduce_from_group(F.linear(x, self.weight), self.group)


class VocabParallelEmbedding(ShardedWeight):
    """Rows `[start, stop)` of the table; tokens outside them look up zeros, summed over the group."""

    def __init__(self, weight: torch.Tensor, start: int, stop: int, group: dist.ProcessGroup | None) -> None:
        super().__init__(weight, 0, start, stop)
        self.group = group

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        start, stop = self.shard[1], self.shard[2]
        outside = (token_ids < start) | (token_ids >= stop)
        local = F.embedding((token_ids - start).masked_fill(outside, 0), self.weight)
        return reduce_from_group(local.masked_fill(outside[:, None], 0.0), self.group)


class VocabParallelCrossEntropy(nn.Module):
    """Summed cross-entropy over a vocabulary split across the group (Megatron-LM's form).

    With local logits `z` (vocabulary rows `[start, stop)`): `m = max over all ranks` (a constant
    shift, no gradient), `loss = log(sum_ranks sum exp(z - m)) - (z_target - m)` per token.
    """

    def __init__(self, vocab_start: int, vocab_stop: int, group: dist.ProcessGroup | None) -> None:
        super().__init__()
        self.vocab_start, self.vocab_stop = vocab_start, vocab_stop
        self.group = group

    def forward(self, x: torch.Tensor, head_weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = F.linear(copy_to_group(x, self.group), head_weight)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        shift = logits.detach().max(dim=-1).values
        with timed("all_reduce", shift.numel() * shift.element_size()):
            dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=self.group)
        shifted = logits - shift[:, None]
        sum_exp = reduce_from_group(shifted.exp().sum(dim=-1), self.group)
        counted = labels != IGNORE_INDEX
        local = counted & (labels >= self.vocab_start) & (labels < self.vocab_stop)
        index = (labels - self.vocab_start).clamp(0, logits.shape[-1] - 1)
        target_local = shifted.gather(1, index[:, None]).squeeze(1).masked_fill(~local, 0.0)
        target = reduce_from_group(target_local, self.group)
        return ((sum_exp.log() - target) * counted).sum()
