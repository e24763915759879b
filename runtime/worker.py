"""The worker every rank runs: a plan's steps on this rank's shard, with cross-pipeline sync.

`run_worker(rank, world_size, spec)` is what `hydraplan run` spawns on each rank (`run_ranks`);
`python -m hydraplan.runtime.worker --plan plan.json` runs the same function under `torchrun`
(rank and world size from its environment). Each rank:

1. reads and checks the plan (`assignment.validate_plan`: refused before any compute);
2. finds its pipeline, stage, TP/CP ranks and builds the TP and CP groups (every rank creates
   every group, in one order, as `torch.distributed.new_group` requires);
3. builds its stage (`build_stage`, deterministic init by canonical name) and shards it
   (`parallelize_stage`);
4. builds the cross-pipeline gradient sync once for the strategy (`grad_sync.GradSync`);
5. per step: the plan's micro-batches under 1F1B (`pipeline_exec`), the sync, one AdamW step on
   its shard (AdamW is elementwise, so stepping every shard equals stepping the full model);
6. online with `post_measurements`: every rank sends rank 0 its measurements of the step
   (`step_measurements.rank_record`, one `gather_object`), and rank 0 hands the step's body to
   the planner before it asks for the next plan (`plan_feed.post_measurements`); what became of
   each step's body is rank 0's report's `loop`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import timedelta

import torch
import torch.distributed as dist

from hydraplan.planner.schemas import Plan
from hydraplan.runtime import faults, watchdog
from hydraplan.runtime.assignment import (
    PlanRefusedError,
    RankAssignment,
    assign_ranks,
    global_token_count,
    model_config_for,
)
from hydraplan.runtime.checkpoint import load_checkpoint, save_checkpoint
from hydraplan.runtime.cpu_allocator import pin_mmap_threshold, pinned_threshold
from hydraplan.runtime.data_feed import StepFeed
from hydraplan.runtime.faults import MicroBatchOutOfMemoryError
from hydraplan.runtime.grad_sync import GradSync
from hydraplan.runtime.interleaved_exec import run_interleaved_step
from hydraplan.runtime.launch import check_backend
from hydraplan.runtime.model import build_stage, stage_work
from hydraplan.runtime.parallel import cp_shard, parallelize_stage
from hydraplan.runtime.pipeline_exec import run_pipeline_step
from hydraplan.runtime.plan_feed import post_measurements, step_plans
from hydraplan.runtime.profiler import ProcessPeakMeter, static_bytes_of
from hydraplan.runtime.reshard import reshard
from hydraplan.runtime.run_io import resolve_run_io
from hydraplan.runtime.step_data import micro_batch
from hydraplan.runtime.step_measurements import measurements_body, pipeline_ratios, rank_record

__all__ = ["DTYPES", "NonFiniteLossError", "RunSpec", "make_optimizer", "run_worker"]

DTYPES = {"float32": torch.float32, "float64": torch.float64}


class NonFiniteLossError(RuntimeError):
    """The step's loss is NaN or infinite; the run stops there (every rank sees the same loss)."""


@dataclass(frozen=True)
class RunSpec:
    """What every rank runs (picklable: it travels to spawned ranks)."""

    plan_json: str = ""
    steps: int = 1
    dtype: str = "float32"
    lr: float = 1e-3
    weight_decay: float = 0.01
    init_seed: int = 0
    data_seed: int = 0
    collect_state: bool = False  # return shards and step-0 gradients (for --check)
    models_file: str | None = None
    inject_nan_step: int | None = None  # test hook: make this step's loss NaN
    plan_jsons: tuple[str, ...] = ()  # one plan per step (strategy switches); overrides plan_json, steps
    # real data and checkpoints (data_feed.py, checkpoint.py; run_io.resolve_run_io fills them)
    data_path: str | None = None  # a token directory (token_data.py); None: synthetic tokens by seed
    data_start: int = 0  # the first document of the run's first step
    first_step: int = 0  # the number of the run's first step (after --load: the steps already done)
    save_dir: str | None = None  # DCP checkpoint written after the last step
    load_dir: str | None = None  # DCP checkpoint loaded before the first step
    inject_oom: tuple[int, int] | None = None  # test hook: (step, micro-batch) runs out of memory
    # online (`plan_feed`): rank 0 plans each of `steps` steps with these (picklable) objects
    planner: object | None = None  # a `plan_feed.StepPlanner`
    next_lengths: object | None = None  # a `plan_feed.LengthSource`: step -> the batch's lengths
    faults: tuple[tuple[str, int, int], ...] = ()  # test hooks `(kind, rank, step)`, see `runtime.faults`
    slowdowns: tuple[tuple[int, int, float], ...] = ()  # fault hook `(rank, from_step, factor)`: slower compute
    post_measurements: bool = False  # online: rank 0 hands each step's measurements to `planner.record`

    def step_plans(self) -> list[str]:
        """The plan of every step."""
        return list(self.plan_jsons) if self.plan_jsons else [self.plan_json] * self.steps


def make_optimizer(parameters, spec: RunSpec) -> torch.optim.Optimizer:
    """The one optimizer of both the ranks and the single-process check."""
    return torch.optim.AdamW(parameters, lr=spec.lr, weight_decay=spec.weight_decay, foreach=False)


def _device() -> torch.device:
    """Where this rank computes: its CUDA device under NCCL (`run_ranks` and torchrun set it),
    else the CPU. (The NCCL path has not run here: no GPU in CI.)"""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _build_groups(assignments: list[RankAssignment], me: RankAssignment):
    """Every TP and CP group of the strategy (collective: all ranks, one sorted order); this
    rank's two (None where the degree is 1)."""
    wanted = sorted(
        {a.tp_ranks for a in assignments if len(a.tp_ranks) > 1}
        | {a.cp_ranks for a in assignments if len(a.cp_ranks) > 1}
    )
    groups = {ranks: dist.new_group(list(ranks)) for ranks in wanted}
    return groups.get(me.tp_ranks), groups.get(me.cp_ranks)


def _planned_sync(plan: Plan, me: RankAssignment) -> dict:
    """The planner's gradient-sync model for this rank: a ring over every replica of the weights
    (`sum cp` over pipelines) of `grad_bytes_per_gpu` (`planner/cost.py` `grad_sync_s`)."""
    replicas = sum(pipeline.scheme.cp for pipeline in plan.pipelines)
    entry = next(
        (e for e in plan.cost_profile.schemes if e.scheme == me.scheme),
        None,
    )
    grad_bytes = entry.grad_bytes_per_gpu if entry is not None else 0.0
    ring = 2 * (replicas - 1) / replicas * grad_bytes if replicas > 1 else 0.0
    return {
        "replicas": replicas,
        "grad_bytes_per_gpu": grad_bytes,
        "ring_sent_bytes": ring,
        "grad_sync_s": plan.grad_sync_s,
    }


@dataclass
class _Layout:
    """This rank's part of one strategy: built once, kept while the strategy stays."""

    key: tuple
    me: RankAssignment
    stage: torch.nn.Module
    sync: GradSync
    optimizer: torch.optim.Optimizer


def _placement(plan: Plan) -> tuple:
    return tuple((str(p.scheme), tuple(p.ranks)) for p in plan.pipelines)


def _build_layout(plan: Plan, cfg, spec: RunSpec, rank: int) -> _Layout:
    """Groups, stage, gradient sync and optimizer of this rank under `plan`'s strategy (collective)."""
    assignments = assign_ranks(plan)
    me = assignments[rank]
    tp_group, cp_group = _build_groups(assignments, me)
    stage = build_stage(
        cfg,
        pp=me.scheme.pp,
        stage=me.stage,
        seed=spec.init_seed,
        dtype=DTYPES[spec.dtype],
        device=_device(),
        virtual_stages=me.scheme.v,
    )
    parallelize_stage(stage, tp=me.scheme.tp, cp=me.scheme.cp, tp_group=tp_group, cp_group=cp_group)
    sync = GradSync.build(stage, me.tp_rank)
    return _Layout(_placement(plan), me, stage, sync, make_optimizer(stage.parameters(), spec))


def run_worker(rank: int, world_size: int, spec: RunSpec) -> dict:
    """Run `spec` on this rank (inside an initialised default process group); returns its report."""
    watchdog.beat(spec.first_step, "setup")
    if _device().type == "cpu":
        pin_mmap_threshold()  # the heap the profile's memory was measured with (`runtime.cpu_allocator`)
    layout, steps, grads, grad_boxes, checkpoint, plans, feed = None, [], None, None, {}, [], None
    loop: list[dict] = []
    for index, (plan, cfg) in enumerate(step_plans(spec, rank, world_size)):
        step = spec.first_step + index
        plans.append(plan)
        faults.inject(spec.faults, "exit", rank, step)
        if index == 0:
            feed = StepFeed.open(spec, cfg.vocab_size)  # None: synthetic tokens
        switch = None
        if layout is None or layout.key != _placement(plan):
            watchdog.beat(step, "switch")
            new = _build_layout(plan, cfg, spec, rank)
            if layout is not None:
                switch = reshard(
                    layout.stage, layout.optimizer, layout.sync.layouts, new.stage, new.optimizer, new.sync.layouts
                )
                switch |= _planned_switch(plan)
            elif spec.load_dir is not None:
                checkpoint["loaded"] = load_checkpoint(spec.load_dir, new.stage, new.optimizer, new.sync.layouts)
            layout = new
        else:
            layout.me = assign_ranks(plan)[rank]  # the same layout, this step's micro-batches
        record = _one_step(plan, cfg, spec, layout, step, feed.documents(plan) if feed else None)
        record["switch"] = switch
        steps.append(record)
        if spec.collect_state and index == 0:
            grads = {name: p.grad.detach().clone() for name, p in layout.stage.named_parameters()}
            grad_boxes = {name: box for name, (box, _) in layout.sync.layout.items()}
        watchdog.beat(step, "optimizer")
        wall, cpu = time.perf_counter(), time.thread_time()
        layout.optimizer.step()
        record["optimizer_s"] = {"wall_s": time.perf_counter() - wall, "cpu_s": time.thread_time() - cpu}
        if spec.planner is not None and spec.post_measurements:
            watchdog.beat(step, "measurements")
            entry = _feed_back(spec, plan, layout, record, rank, step)
            if entry is not None:
                loop.append(entry)
    if spec.save_dir is not None:
        meta = _checkpoint_meta(spec, cfg, plans, feed)
        checkpoint["saved"] = save_checkpoint(spec.save_dir, layout.stage, layout.optimizer, layout.sync.layouts, meta)
    watchdog.beat(spec.first_step + len(steps), "done")
    me = layout.me
    report = {
        "rank": rank,
        "pipeline": me.pipeline_index,
        "scheme": str(me.scheme),
        "stage": me.stage,
        "tp_rank": me.tp_rank,
        "cp_rank": me.cp_rank,
        "num_sync_groups": layout.sync.num_groups,
        "planned_sync": _planned_sync(plans[-1], me),
        "cpu_mmap_threshold": pinned_threshold(),  # None on CUDA ranks
        "steps": steps,
        "checkpoint": checkpoint,
    }
    if spec.planner is not None and rank == 0:  # the plans the planner made (for --check and the report)
        report["plan_jsons"] = [plan.model_dump_json() for plan in plans]
        report["loop"] = loop
    if spec.collect_state:
        report["boxes"] = {name: box for name, (box, _) in layout.sync.layout.items()}
        report["params"] = {name: p.detach().cpu().clone() for name, p in layout.stage.named_parameters()}
        report["grads"] = {name: grad.cpu() for name, grad in grads.items()}
        report["grad_boxes"] = grad_boxes  # the first step's layout (a later switch changes "boxes")
    return report


def _feed_back(spec: RunSpec, plan: Plan, layout: _Layout, record: dict, rank: int, step: int) -> dict | None:
    """Every rank: send rank 0 this step's measurements (collective); rank 0: hand the step's
    body to the planner. Rank 0's entry of the report's `loop` (None on the other ranks)."""
    me = layout.me
    mine = rank_record(
        rank, me.pipeline_index, me.stage, record, record.get("peak_memory_bytes"), stage_work(layout.stage)
    )
    gathered: list | None = [None] * dist.get_world_size() if rank == 0 else None
    with watchdog.waiting():
        dist.gather_object(mine, gathered, dst=0)
    if rank != 0:
        return None
    try:
        body, ratios = measurements_body(plan, gathered), pipeline_ratios(plan, gathered)
    except Exception as exc:  # noqa: BLE001 - a body that cannot be built is reported, training goes on
        return {"step": step, "posted": False, "error": " ".join(f"{type(exc).__name__}: {exc}".split())}
    # per pipeline its ranks and measured / predicted time: the body names schemes, this the ranks
    return {**post_measurements(spec.planner, body, step), "pipeline_ratios": ratios}


def _cpu_peak_meter() -> ProcessPeakMeter | None:
    """On a CPU rank on the pinned heap (`runtime.cpu_allocator`), the process's peak meter entered
    at the step's start; None on CUDA, on an unpinned heap (its peak is the heap's history, not the
    step's) and where Linux's `VmHWM` is not resettable."""
    if dist.get_backend() == "nccl" or pinned_threshold() is None or not ProcessPeakMeter.available():
        return None
    return ProcessPeakMeter().__enter__()


def _peak_memory_bytes(stage: torch.nn.Module, meter: ProcessPeakMeter | None) -> float | None:
    """The step's peak as the planner's memory model counts it (`SchemeCost.static_bytes` plus the
    in-flight activations). On CUDA the allocator's peak (reset at the step's start). On a CPU rank
    with `meter`: the stage's static bytes (weights, gradients and Adam's two moments,
    `static_bytes_of`, as the profile's) plus the resident growth over the step net of the
    gradients the step allocated (freed at its start, and counted in the static bytes). None else."""
    if dist.get_backend() == "nccl":
        return float(torch.cuda.max_memory_allocated())
    if meter is None:
        return None
    meter.__exit__(None, None, None)
    grads = sum(p.numel() * p.element_size() for p in stage.parameters() if p.requires_grad)
    return static_bytes_of(stage) + max(0.0, meter.bytes - grads)


def _planned_switch(plan: Plan) -> dict:
    """What the plan says of the switch into it (`benchmarks/switch_bytes.py` sets the planner's
    per-GPU loads of `planner/switching.py` beside the bytes this rank moved)."""
    return {"planned_switch_cost_s": plan.switch_cost_s, "previous_strategy": plan.previous_strategy}


def _checkpoint_meta(spec: RunSpec, cfg, plans: list[Plan], feed: StepFeed | None) -> dict:
    """What `hydraplan.json` records beside DCP's files (the CLI checks it on --load)."""
    data = None if feed is None else {"path": os.path.abspath(feed.data.path), "next_document": feed.next_document}
    return {
        "model": cfg.name,
        "dtype": spec.dtype,
        "steps_done": spec.first_step + len(plans),
        "strategy": plans[-1].strategy,
        "data": data,
        "lr": spec.lr,
        "weight_decay": spec.weight_decay,
    }


def _one_step(plan: Plan, cfg, spec: RunSpec, layout: _Layout, step: int, documents=None) -> dict:
    me, stage, dtype = layout.me, layout.stage, DTYPES[spec.dtype]
    global_tokens = global_token_count(plan)
    layout.optimizer.zero_grad(set_to_none=True)
    watchdog.beat(step, "compute")
    if dist.get_backend() == "nccl":
        torch.cuda.reset_peak_memory_stats()
    meter = _cpu_peak_meter()
    slowdown = faults.slowdown_factor(spec.slowdowns, me.rank, step)
    started = time.perf_counter()

    def batch_of(index: int):
        watchdog.beat(step, "compute")  # a long step beats at every micro-batch
        if index == 0:
            faults.inject(spec.faults, "stop", me.rank, step)
        if spec.inject_oom == (step, index):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected by the test hook)")
        work = me.micro_batches[index]
        batch = micro_batch(work, plan.input_lengths, spec.data_seed, step, cfg.vocab_size, documents).to(_device())
        return cp_shard(batch, me.cp_rank, me.scheme.cp) if me.scheme.cp > 1 else batch

    try:
        execute = run_interleaved_step if me.num_chunks > 1 else run_pipeline_step
        result = execute(stage, me, batch_of, global_tokens, dtype, layout.sync.arm, slowdown)
    except MicroBatchOutOfMemoryError as exc:
        raise exc.at_step(step) from None
    compute_s = time.perf_counter() - started
    faults.inject(spec.faults, "hang", me.rank, step)
    watchdog.beat(step, "sync")
    sync_started, sync_cpu = time.perf_counter(), time.thread_time()
    sync_bytes = layout.sync.sync(stage)
    sync_s, sync_cpu_s = time.perf_counter() - sync_started, time.thread_time() - sync_cpu
    peak_memory_bytes = _peak_memory_bytes(stage, meter)
    contributes = me.is_last_stage and me.tp_rank == 0
    loss = torch.tensor([result.loss_sum if contributes else 0.0], dtype=torch.float64, device=_device())
    watchdog.beat(step, "loss")
    with watchdog.waiting():
        dist.all_reduce(loss)
    value = float(loss) / global_tokens
    if spec.inject_nan_step == step:
        value = math.nan
    if not math.isfinite(value):
        raise NonFiniteLossError(f"step {step}: the loss is {value} (stopped before the optimizer step)")
    return {
        "step": step,
        "pipeline": me.pipeline_index,  # this rank's place in the step's strategy
        "stage": me.stage,
        "scheme": str(me.scheme),
        "loss": value,
        "global_tokens": global_tokens,
        "pipeline_s": compute_s,
        "sync_s": sync_s,
        "sync_cpu_s": sync_cpu_s,
        "p2p_sent_bytes": result.sent_bytes,
        "p2p_batches": result.p2p_batches,
        "sync": sync_bytes,
        "ops": result.ops,
        "slowdown": slowdown,
        "peak_memory_bytes": peak_memory_bytes,
    }


def main(argv: list[str] | None = None) -> int:
    """`torchrun --nproc-per-node N -m hydraplan.runtime.worker --plan plan.json [--report out.json]`."""
    parser = argparse.ArgumentParser(prog="python -m hydraplan.runtime.worker")
    parser.add_argument("--plan", required=True)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--models-file", help="extra model catalog (the plan names its model)")
    parser.add_argument("--report", help="rank 0 writes every rank's report (JSON) here")
    for flag in ("--data", "--save", "--load"):  # as `hydraplan run` (runtime/run_io.py)
        parser.add_argument(flag)
    parser.add_argument("--data-start", type=int)
    parser.add_argument(
        "--stall-timeout-s", type=float, default=60.0, help="a rank that makes no progress this long exits (code 1)"
    )
    args = parser.parse_args(argv)
    with open(args.plan, encoding="utf-8") as handle:
        spec = RunSpec(plan_json=handle.read(), steps=args.steps, dtype=args.dtype, models_file=args.models_file)
    plan = Plan.model_validate_json(spec.plan_json)
    try:  # refused before joining the group, with one line
        run_io = resolve_run_io(
            [plan] * spec.steps,
            model_config_for(plan, spec.models_file),
            spec.dtype,
            data=args.data,
            data_start=args.data_start,
            save=args.save,
            load=args.load,
        )
    except PlanRefusedError as exc:
        print(f"hydraplan worker: error: {exc}", file=sys.stderr)
        return 2
    spec = replace(spec, **run_io)
    if args.backend == "nccl":
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        try:
            check_backend("nccl", local_ranks)
        except ValueError as exc:
            print(f"hydraplan worker: error: {exc}", file=sys.stderr)
            return 2
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(args.backend, timeout=timedelta(seconds=args.stall_timeout_s))
    try:
        try:
            with watchdog.LocalWatchdog(dist.get_rank(), args.stall_timeout_s):
                report = run_worker(dist.get_rank(), dist.get_world_size(), spec)
        except PlanRefusedError as exc:  # every rank refuses the same plan before any compute
            print(f"hydraplan worker: rank {dist.get_rank()}: error: {exc}", file=sys.stderr)
            return 2
        reports: list = [None] * dist.get_world_size()
        dist.all_gather_object(reports, report)
        if dist.get_rank() == 0:
            print(f"hydraplan worker: {len(reports)} ranks, losses {[s['loss'] for s in reports[0]['steps']]}")
            if args.report:
                with open(args.report, "w", encoding="utf-8") as handle:
                    json.dump(
                        {"spec": {k: v for k, v in asdict(spec).items() if k != "plan_json"}, "ranks": reports}, handle
                    )
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
