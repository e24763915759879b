"""Checkpoints by canonical parameter slices with `torch.distributed.checkpoint` (DCP).

`--save DIR` after the last step and `--load DIR` before the first: the weights and the AdamW
state (the step count and both moments) of every canonical tensor (`layers.0.attn.wq.weight`,
its `exp_avg`, its `exp_avg_sq`), whatever strategy holds them.

**Saving.** Every rank's shard is a box of each canonical tensor (`grad_sync.local_layout`). The
boxes of all ranks cut each tensor into cells (the same intersection math as the gradient sync
and the strategy switch); each cell is written once, by one of the ranks holding it: the one given
the fewest elements so far (replicas: TP-replicated norms, other pipelines, CP ranks, the tied
embedding copy all hold equal values, so any holder will do and the writing is shared).
The cells become DCP *chunks* of the tensor's global shape: `_CellSavePlanner` describes them as
`WriteItem`s of type SHARD (offsets and sizes in the full tensor), and DCP's own global plan
checks that they tile each tensor exactly once (`_validate_global_plan`: in bounds, no overlap,
full volume) and writes them with `FileSystemWriter`.

**Loading.** DCP reshards on load: a rank asks for its new box of each tensor
(`create_read_items_for_chunk_list` intersects it with the saved chunks) and DCP copies exactly
those regions into its tensors, so a checkpoint saved under `<2,1,1> + <1,2,1>` loads under
`<1,1,2> + 2x<1,1,1>` with no rank reading more than its shard. DTensor is not used: the
pipelines of one strategy hold different meshes, and DCP's chunk metadata is what they share.

DCP works on gloo/CPU with torch 2.13 (`FileSystemWriter`/`FileSystemReader`, the default
process group). Beside DCP's files, rank 0 writes `hydraplan.json` (`hydraplan.checkpoint/1`):
the model, dtype, steps done, data cursor and every tensor's full shape, which the CLI reads
(no torch) to refuse a checkpoint of another model or dtype before any rank starts.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import LoadPlan, SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from hydraplan.runtime.assignment import PlanRefusedError
from hydraplan.runtime.grad_sync import Box, box_elements

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointError",
    "cells_by_rank",
    "full_shapes",
    "load_checkpoint",
    "read_checkpoint_meta",
    "save_checkpoint",
]

CHECKPOINT_FORMAT = "hydraplan.checkpoint/1"
META_FILE = "hydraplan.json"
MOMENTS = ("exp_avg", "exp_avg_sq")
STEP_KEY = "optim.step"


class CheckpointError(PlanRefusedError):
    """The checkpoint cannot be written or loaded for this run; the message is one line."""


def full_shapes(layouts: list[dict]) -> dict[str, tuple[int, ...]]:
    """Every canonical tensor's full shape: the furthest bound any rank holds (every pipeline
    holds the whole model, so the union of the boxes is the full tensor)."""
    shapes: dict[str, list[int]] = {}
    for layout in layouts:
        for name, (box, _) in layout.items():
            stops = [stop for _, stop in box]
            shapes[name] = [max(a, b) for a, b in zip(shapes.get(name, stops), stops)]
    return {name: tuple(shape) for name, shape in shapes.items()}


def cells_by_rank(layouts: list[dict]) -> list[dict[str, list[Box]]]:
    """For every rank, the cells of each canonical tensor it writes: the tensor cut by every
    rank's box bounds, each cell given to the holder that has been given the fewest elements so
    far (lowest rank on a tie), so replicas share the writing. Every rank computes the same."""
    owned: list[dict[str, list[Box]]] = [{} for _ in layouts]
    load = [0] * len(layouts)
    for name in sorted({name for layout in layouts for name in layout}):
        holders = [(rank, layout[name][0]) for rank, layout in enumerate(layouts) if name in layout]
        num_dims = len(holders[0][1])
        cuts = [sorted({bound for _, box in holders for bound in box[dim]}) for dim in range(num_dims)]
        for cell in itertools.product(*[list(zip(bounds, bounds[1:])) for bounds in cuts]):
            owners = [rank for rank, box in holders if all(b[0] <= c[0] and c[1] <= b[1] for b, c in zip(box, cell))]
            if owners:
                owner = min(owners, key=lambda rank: (load[rank], rank))
                load[owner] += box_elements(cell)
                owned[owner].setdefault(name, []).append(tuple(cell))
    return owned


def _narrow(tensor: torch.Tensor, held: Box, cell: Box) -> torch.Tensor:
    for dim, ((held_start, _), (start, stop)) in enumerate(zip(held, cell)):
        tensor = tensor.narrow(dim, start - held_start, stop - start)
    return tensor


def _keys(name: str) -> list[str]:
    return [f"model.{name}"] + [f"optim.{name}.{moment}" for moment in MOMENTS]


class _CellSavePlanner(dcp.DefaultSavePlanner):
    """Writes this rank's cells of every canonical tensor as DCP chunks (see the module)."""

    def __init__(self, boxes: dict[str, Box], cells: dict[str, list[Box]], shapes: dict[str, tuple[int, ...]]):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.boxes, self.cells, self.shapes = boxes, cells, shapes

    def create_local_plan(self) -> SavePlan:
        items = []
        for key, tensor in self.state_dict.items():
            if key == STEP_KEY:
                if self.is_coordinator:  # one copy of the (replicated) step count
                    items.append(_write_item(key, (), tensor, ()))
                continue
            for cell in self.cells.get(key, ()):
                items.append(_write_item(key, cell, tensor, self.shapes[key]))
        self.plan = SavePlan(items)
        return self.plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor:
        key = write_item.index.fqn
        tensor = self.state_dict[key]
        if key == STEP_KEY:
            return tensor
        sizes, offsets = write_item.tensor_data.chunk.sizes, write_item.tensor_data.chunk.offsets
        cell = tuple((start, start + size) for start, size in zip(offsets, sizes))
        return _narrow(tensor, self.boxes[key], cell).contiguous()


def _write_item(key: str, cell: Box, tensor: torch.Tensor, shape: tuple[int, ...]) -> WriteItem:
    offsets = torch.Size([start for start, _ in cell])
    sizes = torch.Size([stop - start for start, stop in cell])
    return WriteItem(
        index=MetadataIndex(key, offsets),
        type=WriteItemType.SHARD if cell else WriteItemType.TENSOR,
        tensor_data=TensorWriteData(
            chunk=ChunkStorageMetadata(offsets=offsets, sizes=sizes),
            properties=TensorProperties.create_from_tensor(tensor),
            size=torch.Size(shape),
        ),
    )


class _BoxLoadPlanner(dcp.DefaultLoadPlanner):
    """Reads, for every tensor of the state dict, the saved chunks' overlap with this rank's box."""

    def __init__(self, boxes: dict[str, Box]):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.boxes = boxes

    def create_local_plan(self) -> LoadPlan:
        items = []
        for key, tensor in self.state_dict.items():
            box = self.boxes.get(key, ())
            local = ChunkStorageMetadata(
                offsets=torch.Size([start for start, _ in box]), sizes=torch.Size(tensor.shape)
            )
            items += create_read_items_for_chunk_list(key, self.metadata.state_dict_metadata[key], [local])
        return LoadPlan(items)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        # the state dict holds this rank's box of each tensor (a plain tensor); `index.offset` is
        # the box's place in the full tensor, and each read item's `dest_offsets` are within the box
        return self.state_dict[index.fqn]


def _boxes(layout: dict) -> dict[str, Box]:
    return {key: box for name, (box, _) in layout.items() for key in _keys(name)}


def save_checkpoint(
    path: str, module: nn.Module, optimizer: torch.optim.Optimizer, layouts: list[dict], meta: dict
) -> dict:
    """Write this rank's cells of its weights and AdamW state to `path` (collective over the world);
    rank 0 adds `hydraplan.json` with `meta`. Returns the bytes this rank wrote and the seconds."""
    started = time.perf_counter()
    rank = dist.get_rank()
    state, step = {}, None
    for name, parameter in module.named_parameters():
        optimizer_state = optimizer.state[parameter]
        state[f"model.{name}"] = parameter.detach()
        for moment in MOMENTS:
            state[f"optim.{name}.{moment}"] = optimizer_state[moment]
        step = float(optimizer_state["step"])
    state[STEP_KEY] = torch.tensor(step, dtype=torch.float64)
    shapes = {key: shape for name, shape in full_shapes(layouts).items() for key in _keys(name)}
    cells = {key: cells for name, cells in cells_by_rank(layouts)[rank].items() for key in _keys(name)}
    planner = _CellSavePlanner(_boxes(layouts[rank]), cells, shapes)
    Path(path).mkdir(parents=True, exist_ok=True)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(path), planner=planner)
    written = sum(item.tensor_data.chunk.sizes.numel() for item in planner.plan.items if item.index.fqn != STEP_KEY)
    if rank == 0:
        document = dict(meta, format=CHECKPOINT_FORMAT, optimizer_step=step, parameters=full_shapes(layouts))
        (Path(path) / META_FILE).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    dist.barrier()
    element_bytes = next(iter(state.values())).element_size()
    return {"written_bytes": written * element_bytes, "seconds": time.perf_counter() - started}


def load_checkpoint(path: str, module: nn.Module, optimizer: torch.optim.Optimizer, layouts: list[dict]) -> dict:
    """Fill this rank's parameters and AdamW state from `path` (collective over the world), after
    checking the checkpoint's tensors and shapes are this model's. Returns the bytes it read."""
    started = time.perf_counter()
    rank = dist.get_rank()
    meta = read_checkpoint_meta(path)
    expected = {name: list(shape) for name, shape in full_shapes(layouts).items()}
    saved = {name: list(shape) for name, shape in meta["parameters"].items()}
    if saved != expected:
        differing = sorted(set(saved) ^ set(expected)) or sorted(n for n in saved if saved[n] != expected[n])
        raise CheckpointError(
            f"--load {path}: its tensors differ from the model's ({differing[0]}: saved "
            f"{saved.get(differing[0])}, the model {expected.get(differing[0])})"
        )
    parameters = dict(module.named_parameters())
    state = {}
    for name, parameter in parameters.items():
        state[f"model.{name}"] = parameter.data
        for moment in MOMENTS:
            state[f"optim.{name}.{moment}"] = torch.zeros_like(parameter.data)
    state[STEP_KEY] = torch.zeros((), dtype=torch.float64)
    planner = _BoxLoadPlanner(_boxes(layouts[rank]))
    dcp.load(state, storage_reader=dcp.FileSystemReader(path), planner=planner)
    step = float(state[STEP_KEY])
    for name, parameter in parameters.items():
        optimizer.state[parameter] = {
            "step": torch.tensor(step, dtype=torch.float32),
            **{moment: state[f"optim.{name}.{moment}"] for moment in MOMENTS},
        }
    read = sum(tensor.numel() * tensor.element_size() for key, tensor in state.items() if key != STEP_KEY)
    return {"read_bytes": read, "optimizer_step": step, "seconds": time.perf_counter() - started}


def read_checkpoint_meta(path: str) -> dict:
    """`hydraplan.json` of a checkpoint directory, checked (one-line `CheckpointError` otherwise)."""
    meta_path = Path(path) / META_FILE
    if not Path(path).is_dir():
        raise CheckpointError(f"--load {path}: not a directory")
    if not meta_path.is_file() or not (Path(path) / ".metadata").is_file():
        raise CheckpointError(f"--load {path}: not a hydraplan checkpoint (no {META_FILE} or DCP .metadata)")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise CheckpointError(f"--load {path}: {META_FILE} is not JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"--load {path}: {META_FILE} is not {CHECKPOINT_FORMAT}")
    for key in ("model", "dtype", "steps_done", "parameters"):
        if key not in meta:
            raise CheckpointError(f"--load {path}: {META_FILE} has no {key!r}")
    return meta
