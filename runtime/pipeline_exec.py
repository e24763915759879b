"""One training step of one rank's PP stage: the plan's micro-batches under the 1F1B schedule.

Between stages, activations (forward) and their gradients (backward) go point to point to the
rank with the same TP and CP position in the neighbouring stage, each preceded by a small shape
header (`[rows, cols]`, int64): micro-batches differ in tokens, so no buffer of a fixed sequence
length exists. NCCL-safe by construction (`runtime/p2p_order.py`): before each op, the previous
op's outgoing message and this op's incoming one are posted together (`batch_isend_irecv`, one
batch for the headers, one for the payloads), Megatron-LM's pairing; `find_nccl_deadlock` replays
the batches every rank posted (`StepResult.p2p_batches`, in the report) under NCCL's ordering
and rendezvous rules, and the tests run it on every schedule they execute. Messages of one
micro-batch carry tags of their own (gloo matches by tag, NCCL by order: both agree here).

The last stage's loss is the sum over its tokens divided by the step's global token count (every
token of every pipeline), so summed gradients equal those of single-process training on the
whole batch. Each op records its wall and thread CPU time, the thread CPU time of the model's own
forward or backward call in it (`compute_cpu_s`), the time spent in the exchange that brought its
input (`wait_s`, the previous op's send included; `transfer_s` of it after the headers arrived:
the payloads' round, and `transfer_cpu_s`, the process CPU time meanwhile) and every TP/CP
collective it ran (`comm`: `[kind, bytes, wall_s, cpu_s]` in call order, `runtime.comm_meter`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hydraplan.runtime import comm_meter, watchdog
from hydraplan.runtime.assignment import RankAssignment, one_f_one_b
from hydraplan.runtime.batch import PackedBatch
from hydraplan.runtime.faults import oom_guard, slow_down
from hydraplan.runtime.model import DecoderStage
from hydraplan.runtime.p2p_order import Exchange, stage_exchanges, tag_of

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
    # every batch of point-to-point messages posted together, in order: [["send"|"recv", peer, tag], ...]
    p2p_batches: list[list[list]] = field(default_factory=list)


class _Channel:
    """Shape-headed point-to-point exchanges of one step: each exchange posts its sends and
    receives together (`batch_isend_irecv`), first the `[rows, cols]` headers, then the payloads
    (allocated from the received headers). Tags: 2 per message (header, payload)."""

    def __init__(self, dtype: torch.dtype, device: torch.device, result: StepResult) -> None:
        self.dtype, self.device = dtype, device
        self.result = result

    def exchange(
        self, sends: list[tuple[torch.Tensor, int, int]], recvs: list[tuple[int, int]]
    ) -> tuple[list[torch.Tensor], tuple[float, float, float]]:
        """Send each `(tensor, peer, tag)` and receive each `(peer, tag)`, all posted together;
        returns the received tensors and (seconds in all, seconds of the payload round, process CPU
        seconds of the payload round)."""
        started = time.perf_counter()
        payloads = [tensor.detach().contiguous() for tensor, _, _ in sends]
        headers_out = [torch.tensor(p.shape, dtype=torch.int64, device=self.device) for p in payloads]
        headers_in = [torch.empty(HEADER_DIMS, dtype=torch.int64, device=self.device) for _ in recvs]
        self._post(
            [(h, peer, 2 * tag) for h, (_, peer, tag) in zip(headers_out, sends)],
            [(h, peer, 2 * tag) for h, (peer, tag) in zip(headers_in, recvs)],
        )
        received = [torch.empty(tuple(h.tolist()), dtype=self.dtype, device=self.device) for h in headers_in]
        payload_s, payload_cpu = time.perf_counter(), time.process_time()
        self._post(
            [(p, peer, 2 * tag + 1) for p, (_, peer, tag) in zip(payloads, sends)],
            [(r, peer, 2 * tag + 1) for r, (peer, tag) in zip(received, recvs)],
        )
        ended = time.perf_counter()
        self.result.sent_bytes += sum(
            h.numel() * h.element_size() + p.numel() * p.element_size() for h, p in zip(headers_out, payloads)
        )
        return received, (ended - started, ended - payload_s, time.process_time() - payload_cpu)

    def _post(self, sends: list, recvs: list) -> None:
        """One batch: every send and receive posted at once, then waited for (NCCL-safe)."""
        ops = [dist.P2POp(dist.isend, tensor, peer, tag=tag) for tensor, peer, tag in sends]
        ops += [dist.P2POp(dist.irecv, tensor, peer, tag=tag) for tensor, peer, tag in recvs]
        self.result.p2p_batches.append(
            [["send", peer, tag] for _, peer, tag in sends] + [["recv", peer, tag] for _, peer, tag in recvs]
        )
        with watchdog.waiting():
            for work in dist.batch_isend_irecv(ops):
                work.wait()


def run_pipeline_step(
    stage: DecoderStage,
    assignment: RankAssignment,
    batch_of: Callable[[int], PackedBatch],
    global_tokens: int,
    dtype: torch.dtype,
    before_last_backward: Callable[[], None] | None = None,
    slowdown: float = 1.0,
) -> StepResult:
    """Forward and backward every micro-batch of the plan on this rank's stage (gradients are
    accumulated in `.grad`; the caller synchronises and steps). `batch_of(i)` is micro-batch i as
    this rank sees it (its CP shard); `before_last_backward()` is called before the step's last
    backward (the gradient sync then starts its buckets as they become ready: `GradSync.arm`).
    `slowdown` > 1 makes every model call that many times slower (a fault hook: `faults.slow_down`)."""
    result = StepResult()
    channel = _Channel(dtype, next(stage.parameters()).device, result)
    saved: dict[int, tuple[torch.Tensor | None, torch.Tensor, int]] = {}
    num_stages = assignment.scheme.pp
    order = one_f_one_b(assignment.stage, num_stages, len(assignment.micro_batches))
    exchanges: dict[int, list[Exchange]] = {}  # by the op they come before, in order
    for exchange in stage_exchanges(assignment.stage, num_stages, len(assignment.micro_batches)):
        exchanges.setdefault(exchange.before_op, []).append(exchange)
    outbox: dict[tuple[int, int], torch.Tensor] = {}  # (direction, micro-batch) -> the tensor to send
    for position, (is_forward, index) in enumerate(order):
        wall, cpu = time.perf_counter(), time.thread_time()
        # the guard names the micro-batch of an out-of-memory; the meter records its collectives
        with oom_guard("F" if is_forward else "B", assignment, index), comm_meter.recording() as collectives:
            batch = batch_of(index) if is_forward else None  # before the exchange: its own faults first
            inbox, received = _exchanges(channel, assignment, exchanges.get(position, []), outbox)
            if before_last_backward is not None and position == len(order) - 1 and not is_forward:
                before_last_backward()
            if is_forward:
                timing = _forward(
                    stage, assignment, batch, index, inbox, outbox, saved, global_tokens, result, slowdown
                )
            else:
                timing = _backward(assignment, index, inbox, outbox, saved, slowdown)
        result.ops.append(
            {
                "op": "F" if is_forward else "B",
                "micro_batch": index,
                "wall_s": time.perf_counter() - wall,
                "cpu_s": time.thread_time() - cpu,
                **timing,
                **dict(zip(("wait_s", "transfer_s", "transfer_cpu_s"), received)),
                "comm": [[record.kind, record.num_bytes, record.wall_s, record.cpu_s] for record in collectives],
            }
        )
    _exchanges(channel, assignment, exchanges.get(len(order), []), outbox)
    return result


def _exchanges(channel: _Channel, assignment: RankAssignment, exchanges: list[Exchange], outbox: dict):
    """Post `exchanges` in turn (each: the previous op's output and this op's input together);
    returns {(direction, micro-batch): tensor} received and the receive timing (zeros without one)."""
    rank_of = {+1: assignment.next_rank, -1: assignment.previous_rank}
    inbox: dict = {}
    timing = (0.0, 0.0, 0.0)
    for exchange in exchanges:
        sends = [(outbox.pop(key), rank_of[key[0]], tag_of(key[0] > 0, key[1])) for key in exchange.sends]
        recvs = [(rank_of[d], tag_of(d < 0, index)) for d, index in exchange.recvs]
        tensors, took = channel.exchange(sends, recvs)
        inbox.update(zip(exchange.recvs, tensors))
        timing = tuple(total + part for total, part in zip(timing, took))
    if not inbox:  # sends only: no op waits for an input here
        timing = (0.0, 0.0, 0.0)
    return inbox, timing


def _forward(stage, assignment, batch, index, inbox, outbox, saved, global_tokens, result, slowdown) -> dict:
    hidden = None
    if not assignment.is_first_stage:
        hidden = inbox[(-1, index)]
        hidden.requires_grad_(True)
    compute = time.thread_time()
    output = stage(batch, hidden)
    slow_down(compute, slowdown)
    compute_cpu_s = time.thread_time() - compute
    if assignment.is_last_stage:
        result.loss_sum += float(output.detach())
        output = output / global_tokens
    else:
        outbox[(+1, index)] = output
    saved[index] = (hidden, output, batch.num_tokens)
    return _timing(batch.num_tokens, compute_cpu_s)


def _backward(assignment, index, inbox, outbox, saved, slowdown) -> dict:
    hidden, output, tokens = saved.pop(index)
    grad = None if assignment.is_last_stage else inbox[(+1, index)]
    compute = time.thread_time()
    output.backward(grad)
    slow_down(compute, slowdown)
    compute_cpu_s = time.thread_time() - compute
    if hidden is not None:
        outbox[(-1, index)] = hidden.grad
    return _timing(tokens, compute_cpu_s)


def _timing(tokens: int, compute_cpu_s: float) -> dict:
    return {"tokens": tokens, "compute_cpu_s": compute_cpu_s}
