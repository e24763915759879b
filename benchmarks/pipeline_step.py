"""A minimal 2-stage 1F1B pipeline step on two gloo ranks, for the whole-step check of
`cost_model_accuracy.py` (benchmark only: the runtime's executor is issue 12's).

Rank `j` holds stage `j` of `<1,2,1>` (`runtime.model.build_stage`). Both ranks know the micro-
batches' lengths, so activations and their gradients travel without a header: stage 0 sends each
forward's output (`isend`, so the 1F1B order cannot deadlock), stage 1 sends back the gradient of
its input. The order of operations is the planner's own (`planner.simulate.stage_operations`).
Each operation's forward or backward is timed on the measuring thread's CPU clock (what the
profile measured), and the step's elapsed time between barriers is kept too.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from hydraplan.planner.simulate import stage_operations
from hydraplan.runtime.launch import run_ranks
from hydraplan.runtime.model import ModelConfig, PackedBatch, build_stage

NUM_STAGES = 2


def _rank_step(rank: int, world_size: int, lengths: Sequence[Sequence[int]], repeats: int) -> dict:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    cfg = ModelConfig.from_catalog("tiny")
    stage = build_stage(cfg, pp=NUM_STAGES, stage=rank, seed=0)
    batches = [PackedBatch.from_lengths(list(item), cfg.vocab_size, seed=index) for index, item in enumerate(lengths)]
    runs = []
    for repeat in range(repeats + 1):  # run 0 warms up
        durations, wall_s = _one_step(rank, stage, batches, cfg.hidden_size)
        if repeat:
            runs.append({"durations": durations, "wall_s": wall_s})
    return {"rank": rank, "runs": runs}


def _one_step(rank: int, stage, batches, hidden_size: int) -> tuple[dict, float]:
    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}
    pending = []
    durations: dict[str, float] = {}
    dist.barrier()
    started = time.perf_counter()
    for is_forward, index in stage_operations(rank, NUM_STAGES, len(batches)):
        batch = batches[index]
        shape = (batch.input_ids.shape[0], hidden_size)
        if is_forward:
            hidden = None
            if rank == 1:
                hidden = torch.empty(shape)
                dist.recv(hidden, 0)
                hidden.requires_grad_(True)
                inputs[index] = hidden
            clock = time.thread_time()
            outputs[index] = stage(batch, hidden)
            durations[f"F{index}"] = time.thread_time() - clock
            if rank == 0:
                pending.append(dist.isend(outputs[index].detach(), 1))
        else:
            grad = None
            if rank == 0:
                grad = torch.empty(shape)
                dist.recv(grad, 1)
            clock = time.thread_time()
            outputs.pop(index).backward(grad)
            durations[f"B{index}"] = time.thread_time() - clock
            if rank == 1:
                pending.append(dist.isend(inputs.pop(index).grad, 0))
    for work in pending:
        work.wait()
    dist.barrier()
    return durations, time.perf_counter() - started


def measure_step(lengths: Sequence[Sequence[int]], repeats: int = 3) -> list[dict]:
    """Per rank: every repeat's per-operation thread CPU seconds (`F3`, `B0`, ...) and wall seconds."""
    return run_ranks(_rank_step, NUM_STAGES, args=([list(item) for item in lengths], repeats), timeout_s=900.0)


def critical_path_s(
    durations: Sequence[dict[str, float]], num_micro_batches: int, transfer_s: Sequence[float]
) -> float:
    """The 1F1B step time rebuilt from measured operation times: each operation starts when its
    stage is free and its input has arrived (`transfer_s[i]`: one p2p transfer of micro-batch i)."""
    finish: dict[tuple[int, bool, int], float] = {}
    free = [0.0] * NUM_STAGES
    orders = [stage_operations(stage, NUM_STAGES, num_micro_batches) for stage in range(NUM_STAGES)]
    positions = [0] * NUM_STAGES
    while any(positions[stage] < len(orders[stage]) for stage in range(NUM_STAGES)):
        progressed = False
        for stage in range(NUM_STAGES):
            if positions[stage] == len(orders[stage]):
                continue
            is_forward, index = orders[stage][positions[stage]]
            ready = _ready_s(finish, stage, is_forward, index, transfer_s)
            if ready is None:
                continue
            start = max(free[stage], ready)
            free[stage] = finish[(stage, is_forward, index)] = (
                start + durations[stage][f"{'F' if is_forward else 'B'}{index}"]
            )
            positions[stage] += 1
            progressed = True
        assert progressed, "1F1B dependency cycle"
    return max(free)


def _ready_s(finish, stage: int, is_forward: bool, index: int, transfer_s: Sequence[float]) -> float | None:
    """When the operation's input is there (None: not yet computed)."""
    if is_forward:
        if stage == 0:
            return 0.0
        previous = finish.get((stage - 1, True, index))
        return None if previous is None else previous + transfer_s[index]
    if stage == NUM_STAGES - 1:
        return finish.get((stage, True, index), None)
    after = finish.get((stage + 1, False, index))
    return None if after is None else after + transfer_s[index]
