"""Differentiable collectives for the parallel layers (one autograd rule each).

The tensor-parallel pair follows Megatron-LM (Shoeybi et al. 2019, arXiv 1909.08053, section 3):
`copy_to_group` is the identity forward and an all-reduce of the gradient backward (operator f);
`reduce_from_group` all-reduces forward and passes the gradient through backward (operator g).
Both assume what Megatron assumes: everything after `reduce_from_group` is computed identically
on every rank of the group, so each rank back-propagates the same upstream gradient.

Megatron-LM applies f once per block input (its QKV projection is one fused column-parallel
layer, and so is the MLP's first): `parallelize_stage` puts one `copy_to_group` at the input of
each attention and each MLP (a forward pre-hook), and the column-parallel linears inside do no
communication of their own. Per transformer layer and micro-batch: 2 activation all-reduces
forward (the row-parallel outputs) and 2 backward (the block inputs).

`gather_along_first_dim` (context parallelism) all-gathers equal-sized pieces into one tensor;
its backward sums every rank's gradient of the gathered tensor and keeps this rank's piece: one
reduce-scatter (`reduce_scatter_single`, the name torch 2.13 gives `reduce_scatter_tensor`; it
runs on gloo too), a 1/cp of the all-reduce it replaces in bytes received per rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hydraplan.runtime.comm_meter import timed

__all__ = ["copy_to_group", "gather_along_first_dim", "group_rank", "group_size", "reduce_from_group"]


def group_size(group: dist.ProcessGroup | None) -> int:
    return dist.get_world_size(group)


def group_rank(group: dist.ProcessGroup | None) -> int:
    return dist.get_rank(group)


def _all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    out = tensor.contiguous().clone()
    with timed("all_reduce", out.numel() * out.element_size()):
        dist.all_reduce(out, group=group)
    return out


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        return _all_reduce(tensor, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherAlongFirstDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        tensor = tensor.contiguous()
        size = group_size(group)
        gathered = tensor.new_empty((size * tensor.shape[0], *tensor.shape[1:]))
        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch 2.13's name
        with timed("all_gather", tensor.numel() * tensor.element_size()):
            all_gather(gathered, tensor, group=group)
        return gathered.view(size, *tensor.shape)

    @staticmethod
    def backward(ctx, grad):
        mine = grad.new_empty(grad.shape[1:])
        with timed("reduce_scatter", mine.numel() * mine.element_size()):
            _reduce_scatter(mine, grad.contiguous().flatten(0, 1), ctx.group)
        return mine, None


def _reduce_scatter(output: torch.Tensor, tensor: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    """`output` = this rank's slice (along the first dim) of `tensor` summed over the group."""
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    reduce_scatter(output, tensor, group=group)


def copy_to_group(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Identity; the gradient is summed over the group (input of a column-parallel layer)."""
    return _CopyToGroup.apply(tensor, group)


def reduce_from_group(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Sum over the group; the gradient passes through (output of a row-parallel layer)."""
    return _ReduceFromGroup.apply(tensor, group)


def gather_along_first_dim(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """`[group_size, *tensor.shape]`: every rank's equal-shaped tensor, by rank."""
    return _GatherAlongFirstDim.apply(tensor, group)
