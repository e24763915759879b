"""Context parallelism: each rank holds part of every sequence and attends to the whole sequence.

Written by hand (torch's `context_parallel` does not run on CPU). The batch is sharded with
`cp_shard` (`runtime/batch.py`): every sequence cut into `2*cp` chunks, rank r holding chunks r
and `2*cp-1-r`, with the tokens' positions in their full sequence. Weights are replicated; each
rank computes Q, K, V for its own tokens, then K and V of the whole micro-batch are all-gathered
(as Megatron-LM's context parallelism exchanges them, there by a ring; Liu et al. 2023, Ring
Attention, arXiv 2310.01889) and each local query attends to the keys of its own sequence at
positions up to its own. The backward of the all-gather sums the K/V gradients from every rank
back to their owners.

After backward, a rank's weight gradients hold only its own tokens' share: sum them over the CP
group (`reduce_replica_grads`) or in the runtime's gradient synchronisation. The last stage's
loss is the sum over the rank's own tokens; the sum over the group is the micro-batch's loss.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hydraplan.runtime.batch import CpLayout, PackedBatch
from hydraplan.runtime.parallel.comm import gather_along_first_dim, group_size

__all__ = ["ContextParallelAttentionCore", "full_order_index", "padded_tokens"]


def padded_tokens(layout: CpLayout) -> int:
    """Rows each rank contributes to the K/V all-gather: the largest local token count."""
    return max(sum(layout.local_lengths(rank)) for rank in range(layout.cp))


@functools.lru_cache(maxsize=64)
def full_order_index(layout: CpLayout) -> torch.Tensor:
    """For each token of the full stream, its row in the gathered `[cp * padded_tokens]` tensor
    (computed once per micro-batch layout, not once per layer)."""
    padded = padded_tokens(layout)
    index = torch.empty(sum(layout.full_lengths), dtype=torch.long)
    for rank in range(layout.cp):
        owned = torch.tensor(layout.local_token_indices(rank), dtype=torch.long)
        index[owned] = rank * padded + torch.arange(owned.numel())
    return index


class ContextParallelAttentionCore(nn.Module):
    """Replaces `PackedAttentionCore` under CP: all-gathers K/V, attends per sequence with causal
    masks on the full-sequence positions."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        super().__init__()
        self.group = group

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        layout = batch.cp_layout
        cp = group_size(self.group)
        if layout is None or layout.cp != cp:
            got = None if layout is None else layout.cp
            raise ValueError(f"context-parallel attention needs a cp_shard batch of cp={cp}, got {got}")
        k_full, v_full = self._gather(k, layout), self._gather(v, layout)
        outputs = []
        local_start, full_start = 0, 0
        for local_length, full_length in zip(batch.lengths, layout.full_lengths):
            local_end, full_end = local_start + local_length, full_start + full_length
            if local_length:
                positions = batch.position_ids[local_start:local_end]
                keys = torch.arange(full_length, device=q.device)
                mask = keys[None, :] <= positions[:, None]
                keys_values = k_full[full_start:full_end], v_full[full_start:full_end]
                outputs.append(_masked_sdpa(q[local_start:local_end], *keys_values, mask))
            local_start, full_start = local_end, full_end
        return torch.cat(outputs, dim=0) if outputs else q.new_zeros(q.shape)

    def _gather(self, tensor: torch.Tensor, layout: CpLayout) -> torch.Tensor:
        """`[T_full, heads, d]` in full-stream order from every rank's local `[T_local, heads, d]`."""
        pad = padded_tokens(layout) - tensor.shape[0]
        if pad:
            tensor = torch.cat([tensor, tensor.new_zeros(pad, *tensor.shape[1:])])
        gathered = gather_along_first_dim(tensor, self.group).flatten(0, 1)
        index = full_order_index(layout).to(tensor.device)
        return gathered.index_select(0, index)


def _masked_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1]
    )
    return out.transpose(0, 1)
