"""Measured collective times on the local ranks: the latency + bytes/bandwidth curves the cost
models fit (`cost_models/`), taken with the same process groups the runtime uses.

Call `measure_collectives` on every rank inside `run_ranks` (or any initialised process group);
every rank returns the same rows. `bytes` is the buffer each rank contributes: the all-reduce
buffer, each rank's part of an all-gather (the output is `ranks` times larger), the message of a
send/recv. A repeat's time is the slowest rank's (the collective ends when its last rank does),
between barriers; the row holds the median over repeats, after one untimed warm-up.
send/recv pairs rank 2i with 2i+1 (one direction), so it needs at least two ranks.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["COLLECTIVE_OPS", "DEFAULT_SIZES_BYTES", "measure_collectives"]

COLLECTIVE_OPS = ("all_reduce", "all_gather", "send_recv")
DEFAULT_SIZES_BYTES = (1 << 10, 1 << 14, 1 << 18, 1 << 22)
FLOAT32_BYTES = 4


def _run_once(op: str, buffer: torch.Tensor, group, rank: int, ranks: int, pieces: list[torch.Tensor]) -> None:
    if op == "all_reduce":
        dist.all_reduce(buffer, group=group)
    elif op == "all_gather":
        dist.all_gather(pieces, buffer, group=group)
    else:
        peer = rank + 1 if rank % 2 == 0 else rank - 1
        if peer >= ranks:  # the odd rank out of an odd group sits this one out
            return
        global_peer = dist.get_global_rank(group, peer) if group is not None else peer
        if rank % 2 == 0:
            dist.send(buffer, global_peer, group=group)
        else:
            dist.recv(buffer, global_peer, group=group)


def _time_op(op: str, size_bytes: int, repeats: int, group, device: torch.device) -> float:
    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    buffer = torch.ones(max(1, size_bytes // FLOAT32_BYTES), dtype=torch.float32, device=device)
    pieces = [torch.empty_like(buffer) for _ in range(ranks)] if op == "all_gather" else []
    samples = []
    for repeat in range(repeats + 1):
        dist.barrier(group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        _run_once(op, buffer, group, rank, ranks, pieces)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        if repeat:  # repeat 0 is the warm-up
            samples.append(float(elapsed))
    return statistics.median(samples)


def measure_collectives(
    ops: Sequence[str] = COLLECTIVE_OPS,
    sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES,
    repeats: int = 5,
    group: dist.ProcessGroup | None = None,
    device: str | torch.device | None = None,
) -> list[dict]:
    """Rows `{op, ranks, bytes, seconds}` for every op and size (see the module docstring).

    `device`: where the buffers live (default: the current CUDA device under NCCL, else the CPU).
    """
    unknown = [op for op in ops if op not in COLLECTIVE_OPS]
    if unknown:
        raise ValueError(f"unknown collectives {unknown}; valid: {', '.join(COLLECTIVE_OPS)}")
    if repeats < 1 or any(size < 1 for size in sizes_bytes):
        raise ValueError("repeats and every size must be positive")
    ranks = dist.get_world_size(group)
    if device is None:
        nccl = dist.get_backend(group) == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    device = torch.device(device)
    rows = []
    for op in ops:
        if op == "send_recv" and ranks < 2:
            continue
        for size in sizes_bytes:
            actual = max(1, size // FLOAT32_BYTES) * FLOAT32_BYTES
            seconds = _time_op(op, size, repeats, group, device)
            rows.append({"op": op, "ranks": ranks, "bytes": actual, "seconds": seconds})
    return rows
