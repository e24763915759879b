"""One training step of one rank of an interleaved pipeline (`scheme.v > 1`): its v model chunks
under Megatron-Core's interleaved 1F1B, in the order the planner simulates.

Rank r of `pp` holds chunks c = 0..v-1, chunk c being virtual stage `c * pp + r` of `pp * v`
(`model.chunk_layer_ranges`). The rank runs `assignment.interleaved_order`, the order the
planner simulates with groups of pp (the rule it plans by, `simulate.interleaved_count_ok`): each
entry is a forward or a backward of one micro-batch on one chunk. A forward takes its input from the virtual stage
before it, which is on the previous rank of the ring (the last rank's chunk c feeds the first
rank's chunk c + 1), and sends its output to the next one; a backward the other way round. The
first virtual stage embeds, the last returns the summed token loss, divided by the step's global
token count before its backward, as in `pipeline_exec`.

Transfers on gloo: every receive of the step is posted before the first operation (each tensor's
shape is known: the micro-batch's tokens on this rank by the hidden size), each output is sent as
soon as it is computed, and all sends are waited for after the last operation. No rank then waits
for a message whose receive is not posted, whatever order the two ranks' operations interleave in,
so the schedule cannot deadlock on the transport (its data dependencies are acyclic: the planner's
`interleaved_dependency_order` releases every operation). Every message carries its own tag:
(virtual stage of the receiving operation, micro-batch, direction). NCCL would need Megatron's
paired exchanges instead (`runtime/p2p_order.py` does it for plain 1F1B); this executor is for
gloo. Each op records what `pipeline_exec` records, and the chunk it ran; its input's transfer is
the wait for its posted receive (`wait_s` = `transfer_s`, and the process CPU time meanwhile).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from hydraplan.runtime import comm_meter, watchdog
from hydraplan.runtime.assignment import RankAssignment, interleaved_order
from hydraplan.runtime.batch import PackedBatch
from hydraplan.runtime.faults import oom_guard, slow_down
from hydraplan.runtime.model import DecoderStage, chunk_layer_ranges
from hydraplan.runtime.pipeline_exec import StepResult

__all__ = ["message_tag", "run_interleaved_step"]


def message_tag(virtual_stage: int, micro_batch: int, num_micro_batches: int, is_forward: bool) -> int:
    """The tag of the message the operation on `virtual_stage` receives: the forward input of
    micro-batch i there, or the gradient of its output (backward)."""
    return 2 * (virtual_stage * num_micro_batches + micro_batch) + (0 if is_forward else 1)


def run_interleaved_step(
    stage: DecoderStage,
    assignment: RankAssignment,
    batch_of: Callable[[int], PackedBatch],
    global_tokens: int,
    dtype: torch.dtype,
    before_last_backward: Callable[[], None] | None = None,
    slowdown: float = 1.0,
) -> StepResult:
    """Forward and backward every micro-batch on every chunk of this rank (gradients accumulate in
    `.grad`), in the interleaved order; the arguments are `pipeline_exec.run_pipeline_step`'s."""
    scheme = assignment.scheme
    num_stages, num_chunks, num_micro = scheme.pp, scheme.v, len(assignment.micro_batches)
    last_virtual = num_stages * num_chunks - 1
    chunks = chunk_layer_ranges(stage.cfg.num_layers, num_stages, assignment.stage, num_chunks)
    order = interleaved_order(assignment.stage, num_stages, num_chunks, num_micro)
    batches = [batch_of(index) for index in range(num_micro)]
    device = next(stage.parameters()).device
    result = StepResult()
    inbox = _post_receives(assignment, order, batches, stage.cfg.hidden_size, dtype, device, result)
    sends: list = []
    saved: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor]] = {}
    for position, (is_forward, index, chunk) in enumerate(order):
        virtual = chunk * num_stages + assignment.stage
        wall, cpu = time.perf_counter(), time.thread_time()
        with oom_guard("F" if is_forward else "B", assignment, index), comm_meter.recording() as collectives:
            waited, waited_cpu = time.perf_counter(), time.process_time()
            incoming = None
            if (virtual > 0) if is_forward else (virtual < last_virtual):
                work, tensor = inbox.pop((virtual, index, is_forward))
                with watchdog.waiting():
                    work.wait()
                incoming = tensor
            wait_s, wait_cpu_s = time.perf_counter() - waited, time.process_time() - waited_cpu
            if before_last_backward is not None and position == len(order) - 1 and not is_forward:
                before_last_backward()
            compute = time.thread_time()
            if is_forward:
                output = _forward(stage, batches[index], incoming, chunks[chunk])
                slow_down(compute, slowdown)
                if virtual == last_virtual:
                    result.loss_sum += float(output.detach())
                    output = output / global_tokens
                else:
                    tag = message_tag(virtual + 1, index, num_micro, True)
                    sends.append(_send(output, assignment.ring_next_rank, tag, result))
                saved[(index, chunk)] = (incoming, output)
            else:
                hidden, output = saved.pop((index, chunk))
                output.backward(incoming)
                slow_down(compute, slowdown)
                if virtual > 0:
                    tag = message_tag(virtual - 1, index, num_micro, False)
                    sends.append(_send(hidden.grad, assignment.ring_previous_rank, tag, result))
            compute_cpu_s = time.thread_time() - compute
        result.ops.append(
            {
                "op": "F" if is_forward else "B",
                "micro_batch": index,
                "chunk": chunk,
                "tokens": batches[index].num_tokens,
                "wall_s": time.perf_counter() - wall,
                "cpu_s": time.thread_time() - cpu,
                "compute_cpu_s": compute_cpu_s,
                "wait_s": wait_s,
                "transfer_s": wait_s,
                "transfer_cpu_s": wait_cpu_s,
                "comm": [[record.kind, record.num_bytes, record.wall_s, record.cpu_s] for record in collectives],
            }
        )
    with watchdog.waiting():
        for work, _ in sends:
            work.wait()
    return result


def _forward(stage: DecoderStage, batch: PackedBatch, hidden: torch.Tensor | None, layers: range) -> torch.Tensor:
    if hidden is not None:
        hidden.requires_grad_(True)
    return stage(batch, hidden, layers=layers)


def _post_receives(assignment, order, batches, hidden_size, dtype, device, result: StepResult) -> dict:
    """Every message this rank receives in the step, posted now: {(virtual stage, micro-batch,
    is_forward): (work, tensor)} (see the module docstring)."""
    num_stages, num_micro = assignment.scheme.pp, len(batches)
    last_virtual = num_stages * assignment.scheme.v - 1
    inbox = {}
    batch_ops = []
    for is_forward, index, chunk in order:
        virtual = chunk * num_stages + assignment.stage
        if not ((virtual > 0) if is_forward else (virtual < last_virtual)):
            continue
        peer = assignment.ring_previous_rank if is_forward else assignment.ring_next_rank
        tensor = torch.empty((batches[index].input_ids.shape[0], hidden_size), dtype=dtype, device=device)
        tag = message_tag(virtual, index, num_micro, is_forward)
        inbox[(virtual, index, is_forward)] = (dist.irecv(tensor, peer, tag=tag), tensor)
        batch_ops.append(["recv", peer, tag])
    result.p2p_batches.append(batch_ops)
    return inbox


def _send(tensor: torch.Tensor, peer: int, tag: int, result: StepResult):
    """Post one send now; the caller waits for it after the step (the tensor stays referenced)."""
    payload = tensor.detach().contiguous()
    result.sent_bytes += payload.numel() * payload.element_size()
    result.p2p_batches.append([["send", peer, tag]])
    return dist.isend(payload, peer, tag=tag), payload
