"""One training step of one rank's PP stage: the plan's micro-batches under the 1F1B schedule.

Between stages, activations (forward) and their gradients (backward) go point to point to the
rank with the same TP and CP position in the neighbouring stage, each preceded by a small shape
header (`[rows, cols]`, int64): micro-batches differ in tokens, so no buffer of a fixed sequence
length exists. Sends are non-blocking (`isend`, kept alive until the step ends) and receives
blocking, so a rank waits only for what the schedule says it depends on; the 1F1B order is
deadlock-free because every receive's matching send comes earlier in the sender's own order.
Messages of one micro-batch carry tags of their own, so order never depends on the transport.

The last stage's loss is the sum over its tokens divided by the step's global token count (every
token of every pipeline), so summed gradients equal those of single-process training on the
whole batch. Each op records its wall and thread CPU time, the thread CPU time of the model's own
forward or backward call in it (`compute_cpu_s`), the time spent waiting to receive (`wait_s`;
`transfer_s` of it after the header arrived: the payload's transfer, and `transfer_cpu_s`, the
process CPU time meanwhile) and every TP/CP collective it ran (`comm`: `[kind, bytes, wall_s,
cpu_s]` in call order, `runtime.comm_meter`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hydraplan.runtime import comm_meter
from hydraplan.runtime.assignment import RankAssignment, one_f_one_b
from hydraplan.runtime.batch import PackedBatch
from hydraplan.runtime.faults import oom_guard
from hydraplan.runtime.model import DecoderStage

__all__ = ["StepResult", "run_pipeline_step"]

HEADER_DIMS = 2


@dataclass
class StepResult:
    """What one rank's stage did in one step."""

    loss_sum: float = 0.0  # summed token losses on this rank (last stage only; 0 elsewhere)
    # {"op", "micro_batch", "tokens", "wall_s", "cpu_s", "compute_cpu_s", "wait_s", "transfer_s",
    #  "transfer_cpu_s", "comm"}
    ops: list[dict] = field(default_factory=list)
    sent_bytes: int = 0  # point-to-point bytes this rank sent (headers included)


class _Channel:
    """Shape-headed point-to-point messages of one step (tags: 4 per micro-batch)."""

    def __init__(self, dtype: torch.dtype, device: torch.device, result: StepResult) -> None:
        self.dtype, self.device = dtype, device
        self.result = result
        self.pending: list = []

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        payload = tensor.detach().contiguous()
        header = torch.tensor(payload.shape, dtype=torch.int64, device=payload.device)
        self.pending += [
            (dist.isend(header, peer, tag=2 * tag), header),
            (dist.isend(payload, peer, tag=2 * tag + 1), payload),
        ]
        self.result.sent_bytes += header.numel() * header.element_size() + payload.numel() * payload.element_size()

    def recv(self, peer: int, tag: int) -> tuple[torch.Tensor, float, float, float]:
        """The tensor, the seconds waited in all, those after the header came, and the process CPU
        seconds after the header came (gloo's threads receiving the payload)."""
        started = time.perf_counter()
        header = torch.empty(HEADER_DIMS, dtype=torch.int64, device=self.device)
        dist.recv(header, peer, tag=2 * tag)
        payload = torch.empty(tuple(header.tolist()), dtype=self.dtype, device=self.device)
        header_s, header_cpu = time.perf_counter(), time.process_time()
        dist.recv(payload, peer, tag=2 * tag + 1)
        ended = time.perf_counter()
        return payload, ended - started, ended - header_s, time.process_time() - header_cpu

    def wait_all(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()


def _forward_tag(micro_batch: int) -> int:
    return 2 * micro_batch


def _backward_tag(micro_batch: int) -> int:
    return 2 * micro_batch + 1


def run_pipeline_step(
    stage: DecoderStage,
    assignment: RankAssignment,
    batch_of: Callable[[int], PackedBatch],
    global_tokens: int,
    dtype: torch.dtype,
) -> StepResult:
    """Forward and backward every micro-batch of the plan on this rank's stage (gradients are
    accumulated in `.grad`; the caller synchronises and steps). `batch_of(i)` is micro-batch i as
    this rank sees it (its CP shard)."""
    result = StepResult()
    channel = _Channel(dtype, next(stage.parameters()).device, result)
    saved: dict[int, tuple[torch.Tensor | None, torch.Tensor, int]] = {}
    order = one_f_one_b(assignment.stage, assignment.scheme.pp, len(assignment.micro_batches))
    for is_forward, index in order:
        wall, cpu = time.perf_counter(), time.thread_time()
        # the guard names the micro-batch of an out-of-memory; the meter records its collectives
        with oom_guard("F" if is_forward else "B", assignment, index), comm_meter.recording() as collectives:
            if is_forward:
                batch = batch_of(index)
                timing = _forward(stage, assignment, batch, index, channel, saved, global_tokens, result)
            else:
                timing = _backward(assignment, index, channel, saved)
        result.ops.append(
            {
                "op": "F" if is_forward else "B",
                "micro_batch": index,
                "wall_s": time.perf_counter() - wall,
                "cpu_s": time.thread_time() - cpu,
                **timing,
                "comm": [[record.kind, record.num_bytes, record.wall_s, record.cpu_s] for record in collectives],
            }
        )
    channel.wait_all()
    return result


def _forward(stage, assignment, batch, index, channel, saved, global_tokens, result) -> dict:
    received = (0.0, 0.0, 0.0)
    hidden = None
    if not assignment.is_first_stage:
        hidden, *received = channel.recv(assignment.previous_rank, _forward_tag(index))
        hidden.requires_grad_(True)
    compute = time.thread_time()
    output = stage(batch, hidden)
    compute_cpu_s = time.thread_time() - compute
    if assignment.is_last_stage:
        result.loss_sum += float(output.detach())
        output = output / global_tokens
    else:
        channel.send(output, assignment.next_rank, _forward_tag(index))
    saved[index] = (hidden, output, batch.num_tokens)
    return _timing(batch.num_tokens, compute_cpu_s, *received)


def _backward(assignment, index, channel, saved) -> dict:
    hidden, output, tokens = saved.pop(index)
    received = (0.0, 0.0, 0.0)
    grad = None
    if not assignment.is_last_stage:
        grad, *received = channel.recv(assignment.next_rank, _backward_tag(index))
    compute = time.thread_time()
    output.backward(grad)
    compute_cpu_s = time.thread_time() - compute
    if hidden is not None:
        channel.send(hidden.grad, assignment.previous_rank, _backward_tag(index))
    return _timing(tokens, compute_cpu_s, *received)


def _timing(tokens: int, compute_cpu_s: float, wait_s: float, transfer_s: float, transfer_cpu_s: float) -> dict:
    return {
        "tokens": tokens,
        "compute_cpu_s": compute_cpu_s,
        "wait_s": wait_s,
        "transfer_s": transfer_s,
        "transfer_cpu_s": transfer_cpu_s,
    }
