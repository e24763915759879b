"""Strategy switch: move weights and AdamW state from the old layout to the new one.

The same intersection math as the gradient sync (`grad_sync.py`): for every canonical tensor, the
box a rank holds in the new layout is cut by every old holder's box; each cell comes from one old
holder (the rank itself when it held the cell, so kept pieces never travel; else the old holder
with the fewest elements to send so far, the lowest rank on a tie, so that no rank serves all its
peers while others idle). A cell travels once per receiving rank, as one message holding the
parameter, `exp_avg` and `exp_avg_sq` of the cell (the planner prices that with
`switch_bytes_per_weight_byte` 3 in the profiles measured on this runtime). No rank gathers the
full model: each sends only the cells others need from it. Messages carry the index of their
transfer in one global order as their tag.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from hydraplan.runtime import watchdog
from hydraplan.runtime.grad_sync import Box, box_elements

__all__ = ["Transfer", "reshard", "transfers_between"]

STATE_KEYS = ("exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class Transfer:
    """Cell `box` of tensor `name` goes from rank `source` (old layout) to rank `target` (new)."""

    name: str
    box: Box
    source: int
    target: int


def _intersect(left: Box, right: Box) -> Box | None:
    cell = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(left, right))
    return cell if all(start < stop for start, stop in cell) else None


def transfers_between(old_layouts: list[dict], new_layouts: list[dict]) -> list[Transfer]:
    """Every cell each rank needs for its new boxes, and where it comes from (layouts by rank,
    `name -> (box, contributes)` as `grad_sync.local_layout` gives them)."""
    transfers, sending = [], [0] * len(old_layouts)
    for target, layout in enumerate(new_layouts):
        for name in sorted(layout):
            wanted = layout[name][0]
            holders = [(rank, old[name][0]) for rank, old in enumerate(old_layouts) if name in old]
            cuts = [
                sorted(
                    {bound for _, box in holders for bound in box[dim] if wanted[dim][0] <= bound <= wanted[dim][1]}
                    | set(wanted[dim])
                )
                for dim in range(len(wanted))
            ]
            for cell in itertools.product(*[list(zip(bounds, bounds[1:])) for bounds in cuts]):
                owners = [rank for rank, box in holders if _intersect(box, cell) == cell]
                if not owners:
                    raise ValueError(f"{name} cell {cell}: no rank of the old layout holds it")
                if target in owners:
                    source = target
                else:
                    source = min(owners, key=lambda rank: (sending[rank], rank))
                    sending[source] += box_elements(cell)
                transfers.append(Transfer(name, tuple(cell), source, target))
    return transfers


def _view(tensor: torch.Tensor, held: Box, cell: Box) -> torch.Tensor:
    for dim, ((held_start, _), (start, stop)) in enumerate(zip(held, cell)):
        tensor = tensor.narrow(dim, start - held_start, stop - start)
    return tensor


def _payload(parameter: torch.Tensor, state: dict, held: Box, cell: Box) -> torch.Tensor:
    parts = [_view(parameter.detach(), held, cell)] + [_view(state[key], held, cell) for key in STATE_KEYS]
    return torch.cat([part.reshape(-1) for part in parts])


def _unpack(flat: torch.Tensor, targets: list[torch.Tensor]) -> None:
    start = 0
    for target in targets:
        target.copy_(flat[start : start + target.numel()].view_as(target))
        start += target.numel()


def reshard(
    old_module: nn.Module,
    old_optimizer: torch.optim.Optimizer,
    old_layouts: list[dict],
    new_module: nn.Module,
    new_optimizer: torch.optim.Optimizer,
    new_layouts: list[dict],
) -> dict:
    """Fill `new_module`'s parameters and `new_optimizer`'s AdamW state from the old ones (collective
    over the world); returns the bytes this rank sent and the seconds it took."""
    started = time.perf_counter()
    rank = dist.get_rank()
    old_params, new_params = dict(old_module.named_parameters()), dict(new_module.named_parameters())
    old_state = {name: old_optimizer.state[p] for name, p in old_params.items()}
    step = next(iter(old_state.values()))["step"] if old_state else torch.tensor(0.0)
    new_state = {}
    for name, parameter in new_params.items():
        new_state[name] = {key: torch.zeros_like(parameter) for key in STATE_KEYS}
        new_optimizer.state[parameter] = {"step": step.clone(), **new_state[name]}
    ops, messages, sent_bytes, received_bytes, received = [], [], 0, 0, []
    for tag, transfer in enumerate(transfers_between(old_layouts, new_layouts)):
        if rank not in (transfer.source, transfer.target):
            continue
        if transfer.source == rank:
            payload = _payload(
                old_params[transfer.name], old_state[transfer.name], old_layouts[rank][transfer.name][0], transfer.box
            )
        if transfer.target == rank:
            held = new_layouts[rank][transfer.name][0]
            targets = [_view(new_params[transfer.name].data, held, transfer.box)]
            targets += [_view(new_state[transfer.name][key], held, transfer.box) for key in STATE_KEYS]
            if transfer.source == rank:
                _unpack(payload, targets)
                continue
            like = new_params[transfer.name]
            buffer = torch.empty(sum(t.numel() for t in targets), dtype=like.dtype, device=like.device)
            ops.append(dist.P2POp(dist.irecv, buffer, transfer.source, tag=tag))
            messages.append(["recv", transfer.source, tag])
            received.append((buffer, targets))
            received_bytes += buffer.numel() * buffer.element_size()
        else:
            ops.append(dist.P2POp(dist.isend, payload, transfer.target, tag=tag))
            messages.append(["send", transfer.target, tag])
            received.append((payload, None))  # kept alive until sent
            sent_bytes += payload.numel() * payload.element_size()
    if ops:  # every message of this rank in one batch: NCCL-safe (`runtime/p2p_order.py`)
        with watchdog.waiting():
            for work in dist.batch_isend_irecv(ops):
                work.wait()
    for buffer, targets in received:
        if targets is not None:
            _unpack(buffer, targets)
    # a cell's message is its parameter and the two AdamW moments: a third of it is weights
    return {
        "sent_bytes": sent_bytes,
        "weight_bytes": sent_bytes // 3,
        "received_bytes": received_bytes,
        "seconds": time.perf_counter() - started,
        "p2p_batches": [messages] if messages else [],
    }
