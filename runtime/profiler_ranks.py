"""Measure a TP/CP scheme's stage on local ranks (`run_ranks`), and the collectives it needs.

Every rank builds the same stage, shards it with `parallelize_stage` (TP innermost, then CP: rank
`r` is TP rank `r % tp` of CP rank `r // tp`) and runs the same micro-batches, a CP rank on its
`cp_shard`. Each rank times its own forward+backward (`StageRunner`, the same code as one
process); the sample keeps the slowest rank's time and memory. Rank 0 decides, before every
micro-batch, whether the budget allows it and tells the others (one broadcast), so all ranks run
the same collectives; it appends each finished sample to a JSON-lines file, so samples taken
before an interruption survive the ranks being stopped. Ranks ignore SIGINT: Ctrl-C reaches the
parent, which stops them.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from hydraplan.planner.measurements import CollectiveSample, StageSample
from hydraplan.runtime.collectives import measure_collectives
from hydraplan.runtime.launch import run_ranks
from hydraplan.runtime.model import ModelConfig, build_stage
from hydraplan.runtime.parallel import parallelize_stage
from hydraplan.runtime.profiler import MeasureOptions, StageRunner

__all__ = ["measure_on_ranks", "read_samples"]

COLLECTIVE_SIZES_BYTES = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)
COLLECTIVE_REPEATS = 5
RANK_TIMEOUT_S = 3600.0


def _groups(tp: int, cp: int) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
    """This rank's TP and CP groups (every rank creates every group, as torch requires)."""
    rank = dist.get_rank()
    tp_group = cp_group = None
    for cp_rank in range(cp):
        ranks = [cp_rank * tp + tp_rank for tp_rank in range(tp)]
        group = dist.new_group(ranks) if tp > 1 else None
        if rank in ranks:
            tp_group = group
    for tp_rank in range(tp):
        ranks = [cp_rank * tp + tp_rank for cp_rank in range(cp)]
        group = dist.new_group(ranks) if cp > 1 else None
        if rank in ranks:
            cp_group = group
    return tp_group, cp_group


def _rank_body(
    rank: int,
    world_size: int,
    cfg: ModelConfig,
    jobs: Sequence[tuple[tuple[int, int, int], int]],
    batches: Sequence[tuple[str, Sequence[int]]],
    options: MeasureOptions,
    deadline: float,
    samples_path: str,
    collectives: bool,
    progress: Callable[[str], None] | None,
) -> int:
    """Measure every (scheme, stage) job in turn; each gets an equal share of the time left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if collectives:
        if rank == 0 and progress is not None:
            progress(f"collectives on {world_size} ranks")
        rows = measure_collectives(sizes_bytes=COLLECTIVE_SIZES_BYTES, repeats=COLLECTIVE_REPEATS)
        if rank == 0:
            _append(samples_path, [{"collective": row} for row in rows])
    done = 0
    for position, (scheme, stage) in enumerate(jobs):
        share = torch.tensor([time.time() + (deadline - time.time()) / (len(jobs) - position)], dtype=torch.float64)
        dist.broadcast(share, 0)  # rank 0's clock decides for everyone
        done += _measure_job(
            rank, world_size, cfg, scheme, stage, batches, options, float(share), samples_path, progress
        )
    return done


def _measure_job(rank, world_size, cfg, scheme, stage, batches, options, deadline, samples_path, progress) -> int:
    tp, pp, cp = scheme
    tp_group, cp_group = _groups(tp, cp)
    module = build_stage(cfg, pp=pp, stage=stage, seed=options.seed, dtype=options.dtype, attention=options.attention)
    module = parallelize_stage(module, tp=tp, cp=cp, tp_group=tp_group, cp_group=cp_group)
    cp_rank = rank // tp
    shard = (lambda batch: batch.cp_shard(cp_rank, cp)) if cp > 1 else None
    runner = StageRunner(cfg, pp, stage, options, module, shard=shard)
    done = 0
    for index, (mix, lengths) in enumerate(batches):
        go = torch.tensor([1 if time.time() < deadline else 0])
        dist.broadcast(go, 0)
        if not go.item():
            break
        local = runner.measure(mix, lengths, scheme)
        rows: list = [None] * world_size
        dist.all_gather_object(rows, local.model_dump(mode="json"))
        if rank == 0:
            sample = _slowest(rows)
            _append(samples_path, [sample.model_dump(mode="json")])
            if progress is not None:
                what = f"micro-batch {index + 1}/{len(batches)} ({sample.num_tokens} tokens, {sample.mix})"
                progress(f"<{tp},{pp},{cp}> stage {stage} on {world_size} ranks: {what}")
        done += 1
    return done


def _append(path: str, rows: Sequence[dict]) -> None:
    with open(path, "a", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")


def _slowest(rows: Sequence[dict]) -> StageSample:
    """One sample from every rank's: the slowest time, the largest memory; out of memory if any."""
    samples = [StageSample.model_validate(row) for row in rows]
    first = samples[0]
    if any(sample.oom for sample in samples):
        return first.model_copy(update={"oom": True, "time_s": None, "fwd_s": None})
    slowest = max(samples, key=lambda sample: sample.time_s or 0.0)
    memory = max(sample.activation_bytes or 0.0 for sample in samples)
    peaks = [sample.peak_bytes for sample in samples if sample.peak_bytes is not None]
    update = {"time_s": slowest.time_s, "fwd_s": slowest.fwd_s, "activation_bytes": memory}
    medians = [sample.peak_median_bytes for sample in samples if sample.peak_median_bytes is not None]
    update["peak_median_bytes"] = max(medians) if medians else None
    return first.model_copy(update={**update, "peak_bytes": max(peaks) if peaks else None})


def measure_on_ranks(
    cfg: ModelConfig,
    num_ranks: int,
    jobs: Sequence[tuple[tuple[int, int, int], int]],
    batches: Sequence[tuple[str, Sequence[int]]],
    options: MeasureOptions,
    deadline: float,
    samples_path: Path,
    collectives: bool = True,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[StageSample], list[CollectiveSample]]:
    """The collectives (when asked) and every `(scheme, stage)` job on `num_ranks` gloo ranks, in
    one launch, until `deadline` (epoch seconds); every scheme's `tp * cp` must be `num_ranks`.

    Rows are appended to `samples_path` as they finish and returned; on an interruption the caller
    reads the file (`read_samples`).
    """
    for scheme, _ in jobs:
        if scheme[0] * scheme[2] != num_ranks:
            raise ValueError(f"scheme <{scheme[0]},{scheme[1]},{scheme[2]}> does not run on {num_ranks} ranks")
    run_ranks(
        _rank_body,
        num_ranks,
        args=(cfg, list(jobs), list(batches), options, deadline, str(samples_path), collectives, progress),
        timeout_s=RANK_TIMEOUT_S,
        num_threads=options.num_threads,
    )
    return read_samples(samples_path)


def read_samples(path: Path) -> tuple[list[StageSample], list[CollectiveSample]]:
    """The stage samples and collective rows a rank run appended to `path` (none if absent)."""
    samples: list[StageSample] = []
    collectives: list[CollectiveSample] = []
    if not path.exists():
        return samples, collectives
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
            if "collective" in row:
                collectives.append(CollectiveSample.model_validate(row["collective"]))
            else:
                samples.append(StageSample.model_validate(row))
        except ValueError:  # a line cut by the interruption
            continue
    return samples, collectives
