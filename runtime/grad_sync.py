"""Gradient synchronisation across pipelines whose layouts differ, by canonical parameter slices.

Every rank holds slices of the same canonical parameters (`parameter_slices`: `layers.3.mlp.w_up
.weight` rows `[344, 688)` under TP 2, the whole tensor under TP 1). For each canonical tensor the
boundaries of every rank's slice cut it into *pieces* (the intersections of the slices); each piece
is held by a set of ranks, at most one per (pipeline, stage, CP rank) unless TP replicates it.
Sync = for every piece, the sum of its holders' gradients, given back to every holder:

- CP ranks hold partial gradients (their own tokens) and pipelines their own sequences: summed;
- TP ranks that replicate a weight (the norms) hold the *same* complete gradient (the Megatron f
  operator already summed it), so only TP rank 0 contributes and the others receive the sum;
- with tied embeddings the last stage's copy of `embed.weight` is one more holder: summed.

The pieces of one holder set travel together in one flat all-reduce (a bucket); the process
groups, one per holder set, are built once per strategy (`GradSync.build`), every rank creating
every group in one sorted order and reducing its buckets in that order (no deadlock across
groups). No rank gathers the full model: each exchanges only the layout (names and index ranges)
once, and reduces only the pieces it holds.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from hydraplan.runtime import watchdog
from hydraplan.runtime.parallel import parameter_slices

__all__ = ["Box", "GradSync", "box_elements", "Piece", "local_layout", "pieces_of"]

Box = tuple[tuple[int, int], ...]  # [start, stop) per dimension, in the full tensor


@dataclass(frozen=True)
class Piece:
    """One intersection cell of a canonical tensor and the ranks holding it."""

    name: str
    box: Box
    holders: tuple[int, ...]

    @property
    def num_elements(self) -> int:
        return box_elements(self.box)


def box_elements(box: Box) -> int:
    """Elements in a box of a tensor."""
    count = 1
    for start, stop in box:
        count *= stop - start
    return count


def local_layout(module: nn.Module, tp_rank: int) -> dict[str, tuple[Box, bool]]:
    """name -> (the box of the full tensor this rank holds, whether its gradient is contributed).

    A parameter TP leaves whole is replicated over the TP group: only TP rank 0 contributes it.
    """
    shapes = {name: tuple(parameter.shape) for name, parameter in module.named_parameters()}
    layout = {}
    for name, slices in parameter_slices(module).items():
        box = tuple(
            (0, size) if part == slice(None) else (part.start, part.stop) for part, size in zip(slices, shapes[name])
        )
        sharded = any(part != slice(None) for part in slices)
        layout[name] = (box, sharded or tp_rank == 0)
    return layout


def pieces_of(layouts: list[dict[str, tuple[Box, bool]]]) -> list[Piece]:
    """Every piece of every canonical tensor held by at least two ranks (`layouts` by rank)."""
    holders_of: dict[str, list[tuple[int, Box]]] = defaultdict(list)
    for rank, layout in enumerate(layouts):
        for name, (box, _) in layout.items():
            holders_of[name].append((rank, box))
    pieces = []
    for name in sorted(holders_of):
        holders = holders_of[name]
        num_dims = len(holders[0][1])
        cuts = [sorted({bound for _, box in holders for bound in box[dim]}) for dim in range(num_dims)]
        for cell in itertools.product(*[list(zip(bounds, bounds[1:])) for bounds in cuts]):
            owners = tuple(
                rank
                for rank, box in holders
                if all(box[dim][0] <= cell[dim][0] and cell[dim][1] <= box[dim][1] for dim in range(num_dims))
            )
            if len(owners) > 1:
                pieces.append(Piece(name, tuple(cell), owners))
    return pieces


def _local_view(tensor: torch.Tensor, held: Box, piece: Box) -> torch.Tensor:
    view = tensor
    for dim, ((held_start, _), (start, stop)) in enumerate(zip(held, piece)):
        view = view.narrow(dim, start - held_start, stop - start)
    return view


@dataclass
class GradSync:
    """The buckets and groups of one strategy; `sync(module)` reduces this rank's gradients."""

    rank: int
    layout: dict[str, tuple[Box, bool]]
    buckets: list[tuple[tuple[int, ...], list[Piece], dist.ProcessGroup | None]]
    layouts: list[dict[str, tuple[Box, bool]]]  # every rank's layout (what a strategy switch cuts)

    @classmethod
    def build(cls, module: nn.Module, tp_rank: int) -> GradSync:
        """Collective: every rank of the world calls it once per strategy, with its own stage."""
        rank, world_size = dist.get_rank(), dist.get_world_size()
        layout = local_layout(module, tp_rank)
        layouts: list = [None] * world_size
        dist.all_gather_object(layouts, layout)
        by_holders: dict[tuple[int, ...], list[Piece]] = defaultdict(list)
        for piece in pieces_of(layouts):
            by_holders[piece.holders].append(piece)
        buckets = []
        for holders in sorted(by_holders):
            group = None if len(holders) == world_size else dist.new_group(list(holders))
            if rank in holders:
                buckets.append((holders, by_holders[holders], group))
        return cls(rank, layout, buckets, layouts)

    @property
    def num_groups(self) -> int:
        return len(self.buckets)

    def sync(self, module: nn.Module) -> dict:
        """Sum every held piece's gradient over its holders, in place; returns byte counts."""
        parameters = dict(module.named_parameters())
        for parameter in parameters.values():
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
        sent_ring_bytes, buffer_bytes, elements, bucket_walls = 0.0, 0, 0, []
        for holders, pieces, group in self.buckets:
            views = [_local_view(parameters[p.name].grad, self.layout[p.name][0], p.box) for p in pieces]
            flat = torch.cat(
                [
                    view.reshape(-1) if self.layout[p.name][1] else torch.zeros_like(view).reshape(-1)
                    for p, view in zip(pieces, views)
                ]
            )
            started, cpu = time.perf_counter(), time.process_time()
            with watchdog.waiting():
                dist.all_reduce(flat, group=group)
            bucket_walls.append([list(holders), time.perf_counter() - started, time.process_time() - cpu])
            start = 0
            for view in views:
                view.copy_(flat[start : start + view.numel()].view_as(view))
                start += view.numel()
            size_bytes = flat.numel() * flat.element_size()
            num_ranks = len(holders)
            # a ring all-reduce sends 2(n-1)/n of the buffer per rank (Patarasuk & Yuan 2009)
            sent_ring_bytes += 2 * (num_ranks - 1) / num_ranks * size_bytes
            buffer_bytes += size_bytes
            elements += flat.numel()
        return {
            "num_buckets": len(self.buckets),
            "elements": elements,
            "buffer_bytes": buffer_bytes,
            "ring_sent_bytes": sent_ring_bytes,
            # [holders, wall seconds, process CPU seconds] of each bucket's all-reduce, in bucket order
            "bucket_walls_s": bucket_walls,
        }
