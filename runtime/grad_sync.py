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

The pieces of one holder set and one layer travel together in one flat all-reduce (a bucket;
the head and final norm, each decoder layer, the embedding: the order in which backward finishes
their gradients); the process groups, one per holder set, are built once per strategy
(`GradSync.build`), every rank creating every group in one sorted order. No rank gathers the
full model: each exchanges only the layout (names and index ranges) once, and reduces only the
pieces it holds.

Overlap (as PyTorch DDP and Megatron-LM's distributed optimizer do): `arm()` before the step's
last backward registers nothing new but makes the parameters' post-accumulate-grad hooks count
(hooks registered once per strategy); when every parameter of a bucket has its final gradient,
the bucket's all-reduce starts (`async_op=True`) while backward goes on with the layers below.
Buckets start in one global order, the same on every rank (layer from the last down, then the
holder set): a rank whose next bucket is not ready yet holds the later ones back, so the ranks
sharing two groups always start them in the same order (no cross-group deadlock, NCCL-safe).
`sync()` after backward starts what is left, waits for every bucket in order and writes the sums
back; the optimizer step comes after it. The sums are the same as a blocking all-reduce's.
"""

from __future__ import annotations

import itertools
import re
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


def layer_key(name: str) -> int:
    """The order in which backward finishes a parameter's gradient, latest first: the head and
    final norm, decoder layers from the last down, the embedding last (sorted descending)."""
    found = re.match(r"layers\.(\d+)\.", name)
    if found:
        return int(found.group(1))
    return -1 if name.startswith("embed.") else 1 << 30


@dataclass
class _Bucket:
    """One flat all-reduce: pieces of one holder set and one layer."""

    holders: tuple[int, ...]
    layer: int
    pieces: list[Piece]
    group: dist.ProcessGroup | None
    names: frozenset[str]


@dataclass
class GradSync:
    """The buckets and groups of one strategy; `sync(module)` reduces this rank's gradients."""

    rank: int
    layout: dict[str, tuple[Box, bool]]
    buckets: list[_Bucket]  # this rank's, in the global start order
    layouts: list[dict[str, tuple[Box, bool]]]  # every rank's layout (what a strategy switch cuts)
    num_groups: int = 0  # holder sets this rank belongs to (one process group each)

    def __post_init__(self) -> None:
        self._armed = False
        self._ready: set[str] = set()
        self._started: list[tuple[dist.Work | None, torch.Tensor, list, float]] = []
        self._parameters: dict[str, nn.Parameter] = {}
        self._hooks: list = []

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
        groups = 0
        for holders in sorted(by_holders):
            group = None if len(holders) == world_size else dist.new_group(list(holders))
            if rank not in holders:
                continue
            groups += 1
            by_layer: dict[int, list[Piece]] = defaultdict(list)
            for piece in by_holders[holders]:
                by_layer[layer_key(piece.name)].append(piece)
            for layer, pieces in by_layer.items():
                buckets.append(_Bucket(holders, layer, pieces, group, frozenset(p.name for p in pieces)))
        buckets.sort(key=lambda bucket: (-bucket.layer, bucket.holders))
        sync = cls(rank, layout, buckets, layouts, groups)
        sync._attach(module)
        return sync

    def _attach(self, module: nn.Module) -> None:
        self._parameters = dict(module.named_parameters())
        for name, parameter in self._parameters.items():
            self._hooks.append(parameter.register_post_accumulate_grad_hook(self._hook(name)))

    def _hook(self, name: str):
        def on_gradient(parameter: nn.Parameter) -> None:
            if self._armed:
                self._ready.add(name)
                self._start_ready()

        return on_gradient

    def arm(self) -> None:
        """The next backward is this step's last on this rank: start buckets as they are ready."""
        self._armed, self._ready, self._started = True, set(), []

    def _start_ready(self) -> None:
        """Start the next buckets, in order, while each is ready."""
        while len(self._started) < len(self.buckets):
            bucket = self.buckets[len(self._started)]
            if not bucket.names <= self._ready:
                return
            self._start(bucket)

    def _start(self, bucket: _Bucket) -> None:
        views = []
        for piece in bucket.pieces:
            parameter = self._parameters[piece.name]
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            views.append(_local_view(parameter.grad, self.layout[piece.name][0], piece.box))
        flat = torch.cat(
            [
                view.reshape(-1) if self.layout[p.name][1] else torch.zeros_like(view).reshape(-1)
                for p, view in zip(bucket.pieces, views)
            ]
        )
        work = dist.all_reduce(flat, group=bucket.group, async_op=True)
        self._started.append((work, flat, views, time.perf_counter()))

    def sync(self, module: nn.Module) -> dict:
        """Start the buckets not started during backward, wait for every one in order and write the
        sums back; returns byte counts and, per bucket, the wait after backward (the exposed part)."""
        if not self._armed:
            self._started = []
        self._armed = False
        for parameter in module.parameters():
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
        overlapped = len(self._started)
        while len(self._started) < len(self.buckets):
            self._start(self.buckets[len(self._started)])
        sent_ring_bytes, buffer_bytes, elements, bucket_walls, bucket_bytes = 0.0, 0, 0, [], []
        for bucket, (work, flat, views, _) in zip(self.buckets, self._started):
            started, cpu = time.perf_counter(), time.process_time()
            with watchdog.waiting():
                work.wait()
            bucket_walls.append([list(bucket.holders), time.perf_counter() - started, time.process_time() - cpu])
            start = 0
            for view in views:
                view.copy_(flat[start : start + view.numel()].view_as(view))
                start += view.numel()
            size_bytes = flat.numel() * flat.element_size()
            num_ranks = len(bucket.holders)
            # a ring all-reduce sends 2(n-1)/n of the buffer per rank (Patarasuk & Yuan 2009)
            sent_ring_bytes += 2 * (num_ranks - 1) / num_ranks * size_bytes
            buffer_bytes += size_bytes
            bucket_bytes.append(size_bytes)
            elements += flat.numel()
        self._started, self._ready = [], set()
        return {
            "num_buckets": len(self.buckets),
            "num_started_in_backward": overlapped,
            "elements": elements,
            "buffer_bytes": buffer_bytes,
            "ring_sent_bytes": sent_ring_bytes,
            # [holders, wall seconds, process CPU seconds] of each bucket's wait after backward, in order
            "bucket_walls_s": bucket_walls,
            "bucket_bytes": bucket_bytes,  # each bucket's buffer, in the same order
        }
