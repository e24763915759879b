"""Differentiable collectives for the parallel layers (one autograd rule each).

The tensor-parallel pair follows Megatron-LM (Shoeybi et al. 2019, arXiv 1909.08053, section 3):
`copy_to_group` is the identity forward and an all-reduce of the gradient backward (operator f);
`reduce_from_group` all-reduces forward and passes the gradient through backward (operator g).
Both assume what Megatron assumes: everything after `reduce_from_group` is computed identically
on every rank of the group, so each rank back-propagates the same upstream gradient.

`gather_along_first_dim` (context parallelism) all-gathers equal-sized pieces; its backward sums
every rank's gradient of the gathered tensor and keeps this rank's piece (a reduce-scatter,
written as all-reduce + slice because gloo has no reduce-scatter).
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
        pieces = [torch.empty_like(tensor) for _ in range(group_size(group))]
        with timed("all_gather", tensor.numel() * tensor.element_size()):
            dist.all_gather(pieces, tensor.contiguous(), group=group)
        return torch.stack(pieces)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group)[group_rank(ctx.group)], None


def copy_to_group(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Identity; the gradient is summed over the group (input of a column-parallel layer)."""
    return _CopyToGroup.apply(tensor, group)


def reduce_from_group(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Sum over the group; the gradient passes through (output of a row-parallel layer)."""
    return _ReduceFromGroup.apply(tensor, group)


def gather_along_first_dim(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """`[group_size, *tensor.shape]`: every rank's equal-shaped tensor, by rank."""
    return _GatherAlongFirstDim.apply(tensor, group)
