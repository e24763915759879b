"""One executed step's measurements as the planning session takes them (issue 31, closed loop).

In an online run rank 0 gathers every rank's `rank_record` of the step (`worker.run_worker`)
and builds the body of `POST /v1/sessions/{id}/measurements` (`measurements_body`), which the
service's `MeasurementsBody` accepts and the local planner applies in-process:

- per pipeline of the plan, per micro-batch: the stage-time model's features (tokens and the sum
  of squared lengths of the plan's micro-batch: split chunks count with their own length) and its
  measured stage time, forward + backward on the pipeline's slowest PP stage, each op's time as
  `runtime.step_timing.op_times` counts it on the `cpu` clock (the model's call and the runtime's
  bookkeeping in thread CPU time on the stage's slowest TP/CP rank, plus its TP/CP collectives);
  `fwd_s` is that stage's forward. Thread CPU time, not wall time: the ranks oversubscribe the
  cores here, so a rank's wall clock holds its neighbours' work (DESIGN.md, "CPU timing");
- per pipeline, its ranks' peak memory (`torch.cuda.max_memory_allocated` on CUDA; on CPU ranks
  on the pinned heap, `runtime.cpu_allocator`, the stage's static bytes plus the process's resident
  growth over the step net of the gradients it allocated, `worker._peak_memory_bytes`; left out
  where neither exists: an unpinned CPU heap's peak is its history, not the step's);
- the gradient sync's buckets as `all_reduce` collectives (their holders, bytes and the mean
  process CPU time of the holders' wait, the `cpu` clock of `step_timing`).

Per pipeline also each rank's compute over the measured micro-batches (`rank_compute_s`) and,
where every rank sent its stage's work coefficients (`runtime.model.stage_work`: forward FLOPs per
token and per squared length of the modules it holds), each rank's expected work for them
(`rank_work`; stages differ by the LM head), so that the session can tell a slow rank from the
others of its pipeline (`cost_models.rank_speed`).

Beside the body, `pipeline_ratios` gives each pipeline's measured stage time over the time its
plan predicted (the plan's `stage_time_s` of the same micro-batches), with its ranks: the body
names schemes only (the refit is per scheme), this names the ranks a slow pipeline runs on. It
goes to the run's report (`loop`). The body carries the same per pipeline (`ranks`,
`predicted_s`, the plan's `slowdown`): the session estimates per-rank slowdown factors from them
(`cost_models.rank_speed`) and its next plans give the slow ranks' pipelines less work.

The body is bounded as the service bounds it (`MAX_*`, equal to `api/service/loop_schemas.py`'s,
a test holds them equal): past a bound, micro-batches are thinned evenly (every k-th kept, the
body says how many were left out in `left_out`, which the caller strips before posting).
Pure Python, no torch: the tests build it from plain dictionaries.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from hydraplan.planner.schemas import Plan
from hydraplan.runtime.step_timing import op_times

__all__ = [
    "MAX_COLLECTIVES",
    "MAX_MEASURED_PIPELINES",
    "MAX_PIPELINE_MICRO_BATCHES",
    "MAX_STEP_MICRO_BATCHES",
    "measurements_body",
    "pipeline_ratios",
    "rank_record",
]

MAX_MEASURED_PIPELINES = 4096
MAX_PIPELINE_MICRO_BATCHES = 4096
MAX_STEP_MICRO_BATCHES = 65_536
MAX_COLLECTIVES = 1024
OP_KEYS = ("op", "micro_batch", "cpu_s", "compute_cpu_s", "comm")


def rank_record(
    rank: int,
    pipeline: int,
    stage: int,
    step_record: dict,
    peak_memory_bytes: float | None,
    work: tuple[float, float] | None = None,
) -> dict:
    """What one rank sends rank 0 of one step: its ops (the keys the stage time needs), its
    gradient sync's buckets, its peak memory (None where unknown) and, where known, its stage's
    work coefficients (forward FLOPs per token and per squared sequence length)."""
    sync = step_record.get("sync") or {}
    return {
        **({"work": list(work)} if work is not None else {}),
        "rank": rank,
        "pipeline": pipeline,
        "stage": stage,
        "ops": [{key: op[key] for key in OP_KEYS if key in op} for op in step_record["ops"]],
        "buckets": [
            [list(holders), float(cpu_s), int(num_bytes)]
            for (holders, _, cpu_s), num_bytes in zip(sync.get("bucket_walls_s", []), sync.get("bucket_bytes", []))
        ],
        "peak_memory_bytes": peak_memory_bytes,
    }


def measurements_body(plan: Plan, records: Sequence[dict]) -> dict:
    """The measurements body of the step `plan` ran, from every rank's `rank_record`."""
    by_pipeline: dict[int, dict[int, list[list[dict]]]] = {}
    peaks: dict[int, list[float | None]] = {}
    rank_records: dict[int, dict[int, dict]] = {}
    for record in records:
        by_pipeline.setdefault(record["pipeline"], {}).setdefault(record["stage"], []).append(record["ops"])
        peaks.setdefault(record["pipeline"], []).append(record.get("peak_memory_bytes"))
        if "rank" in record:
            rank_records.setdefault(record["pipeline"], {})[record["rank"]] = record
    pipelines = []
    for pipeline in plan.pipelines[:MAX_MEASURED_PIPELINES]:
        entry = _pipeline_entry(
            pipeline,
            by_pipeline.get(pipeline.index, {}),
            peaks.get(pipeline.index, []),
            rank_records.get(pipeline.index, {}),
        )
        if entry is not None:
            pipelines.append(entry)
    left_out = _thin(pipelines)
    body = {"pipelines": pipelines, "collectives": _collectives(records)}
    feedback = plan.session_feedback
    if feedback is not None:
        body["profile_version"] = feedback.profile_version
    if left_out:
        body["left_out"] = left_out
    return body


def pipeline_ratios(plan: Plan, records: Sequence[dict]) -> list[dict]:
    """Per pipeline: its ranks and its measured over predicted stage time (summed over its
    measured micro-batches), from every rank's `rank_record` of the step."""
    stages: dict[int, dict[int, list[list[dict]]]] = {}
    for record in records:
        stages.setdefault(record["pipeline"], {}).setdefault(record["stage"], []).append(record["ops"])
    ratios = []
    for pipeline in plan.pipelines:
        measured = _measured_times(pipeline, stages.get(pipeline.index, {}))
        predicted = sum(pipeline.micro_batches[index].stage_time_s for index in measured)
        if measured and predicted > 0:
            ratio = sum(time_s for _, time_s in measured.values()) / predicted
            ratios.append({"pipeline": pipeline.index, "ranks": list(pipeline.ranks), "measured_over_predicted": ratio})
    return ratios


def _measured_times(pipeline, stages: dict[int, list[list[dict]]]) -> dict[int, tuple[float, float]]:
    """Micro-batch index -> (forward, forward + backward) on its slowest stage, where measured."""
    per_stage = [op_times(stage_ops, "cpu") for stage_ops in stages.values()]
    measured = {}
    for index in range(len(pipeline.micro_batches)):
        times = [
            (ops[(True, index)].duration_s, ops[(True, index)].duration_s + ops[(False, index)].duration_s)
            for ops in per_stage
            if (True, index) in ops and (False, index) in ops
        ]
        if times:
            measured[index] = max(times, key=lambda pair: pair[1])
    return measured


def _pipeline_entry(
    pipeline,
    stages: dict[int, list[list[dict]]],
    peaks: list[float | None],
    rank_records: dict[int, dict],
) -> dict | None:
    """One pipeline's entry: its measured micro-batches, when every rank knows it their peaks, and
    when every rank sent its record, each rank's compute over the measured micro-batches (and,
    where every rank sent its work coefficients, its expected work for them)."""
    measured = _measured_times(pipeline, stages)
    micro_batches = []
    for index, work in enumerate(pipeline.micro_batches):
        if index not in measured:
            continue
        fwd_s, time_s = measured[index]  # the slowest stage's forward and its sum
        if time_s <= 0:
            continue
        entry = {
            "num_tokens": sum(work.lengths),
            "sum_sq_tokens": sum(length * length for length in work.lengths),
            "time_s": time_s,
        }
        if 0 < fwd_s < time_s:
            entry["fwd_s"] = fwd_s
        micro_batches.append(entry)
    known = [peak for peak in peaks if peak is not None and peak > 0]
    peak_memory = known if known and len(known) == len(peaks) else None
    if not micro_batches and peak_memory is None:
        return None
    scheme = pipeline.scheme
    degrees = {"tp": scheme.tp, "pp": scheme.pp, "cp": scheme.cp, **({"v": scheme.v} if scheme.v > 1 else {})}
    entry = {"scheme": degrees, "micro_batches": micro_batches}
    predicted_s = sum(pipeline.micro_batches[index].stage_time_s for index in measured if measured[index][1] > 0)
    if micro_batches and predicted_s > 0:  # what the session estimates slow ranks from (`cost_models.rank_speed`)
        entry["ranks"] = list(pipeline.ranks)
        entry["predicted_s"] = predicted_s
        if pipeline.slowdown is not None:
            entry["slowdown"] = pipeline.slowdown
        ops = {rank: record["ops"] for rank, record in rank_records.items()}
        computes = _rank_compute_s(pipeline.ranks, ops, set(measured))
        if computes is not None:
            entry["rank_compute_s"] = computes
            works = [rank_records[rank].get("work") for rank in pipeline.ranks]
            expected = _rank_work(pipeline, works, sorted(measured)) if None not in works else None
            if expected is not None:
                entry["rank_work"] = expected
    if peak_memory is not None:
        entry["peak_memory_bytes"] = peak_memory[: scheme.tp * scheme.pp * scheme.cp]
    return entry


def _rank_compute_s(ranks: Sequence[int], rank_ops: dict[int, list[dict]], measured: set[int]) -> list[float] | None:
    """Each rank's compute time (`compute_cpu_s` of its forward and backward ops) over the measured
    micro-batches, in `ranks` order; None for a one-rank pipeline, or where a rank sent no ops or
    no positive compute (nothing to tell its ranks apart by)."""
    if len(ranks) < 2 or any(rank not in rank_ops for rank in ranks):
        return None
    computes = [
        sum(op.get("compute_cpu_s") or 0.0 for op in rank_ops[rank] if op.get("micro_batch") in measured)
        for rank in ranks
    ]
    return computes if min(computes) > 0 else None


def _rank_work(pipeline, works: list[list[float]], measured: list[int]) -> list[float] | None:
    """Each rank's expected forward FLOPs over the measured micro-batches, from its work
    coefficients (per token, per squared length), in the order of the pipeline's ranks; None
    where a rank's comes to no work."""
    batches = [pipeline.micro_batches[index].lengths for index in measured]
    features = [(sum(lengths), sum(length * length for length in lengths)) for lengths in batches]
    expected = [
        sum(per_token * tokens + per_square * squares for tokens, squares in features)
        for per_token, per_square in works
    ]
    return expected if expected and min(expected) > 0 else None


def _thin(pipelines: list[dict]) -> int:
    """Keep every pipeline under `MAX_PIPELINE_MICRO_BATCHES` and the step under
    `MAX_STEP_MICRO_BATCHES` micro-batches, evenly and at least one per pipeline (in place); how
    many were left out."""
    total = sum(len(entry["micro_batches"]) for entry in pipelines)
    share = MAX_STEP_MICRO_BATCHES / total if total > MAX_STEP_MICRO_BATCHES else 1.0
    keeps = [min(MAX_PIPELINE_MICRO_BATCHES, max(1, int(len(e["micro_batches"]) * share))) for e in pipelines]
    while sum(keeps) > MAX_STEP_MICRO_BATCHES:  # the floor of one each overshot: trim the largest
        largest = max(range(len(keeps)), key=keeps.__getitem__)
        keeps[largest] -= 1
    left_out = 0
    for entry, keep in zip(pipelines, keeps):
        measured = entry["micro_batches"]
        if keep < len(measured):
            entry["micro_batches"] = [measured[(i * len(measured)) // keep] for i in range(keep)]
            left_out += len(measured) - keep
            if "predicted_s" in entry:  # the prediction of the kept ones: the pipeline's ratio unchanged
                kept_share = sum(mb["time_s"] for mb in entry["micro_batches"]) / sum(mb["time_s"] for mb in measured)
                entry["predicted_s"] *= kept_share
    return left_out


def _collectives(records: Sequence[dict]) -> list[dict]:
    """The gradient sync's buckets, one `all_reduce` each: the holders' mean CPU time."""
    buckets: dict[tuple[tuple[int, ...], int, int], list[float]] = {}
    for record in records:
        seen: dict[tuple[tuple[int, ...], int], int] = {}  # the k-th bucket of these holders and size
        for holders, cpu_s, num_bytes in record.get("buckets", []):
            key = (tuple(holders), num_bytes)
            seen[key] = seen.get(key, -1) + 1
            buckets.setdefault((*key, seen[key]), []).append(cpu_s)
    collectives = []
    for (holders, num_bytes, _), times in buckets.items():
        seconds = statistics.fmean(times)
        if len(holders) >= 2 and num_bytes > 0 and seconds > 0:
            collectives.append({"op": "all_reduce", "ranks": len(holders), "bytes": num_bytes, "seconds": seconds})
    return collectives[:MAX_COLLECTIVES]
