"""A measured step's time, rebuilt the way the planner models it: slowest pipeline + gradient sync.

On this 2-core machine the ranks oversubscribe the cores, so no rank's wall clock is the step's
parallel time. From every rank's report (`worker.run_worker`) the step is rebuilt instead:

- **ops**: each forward or backward of one micro-batch on one PP stage lasts its *compute* (the
  thread CPU time of the op on the stage's slowest TP/CP rank: the model's own call plus the
  runtime's bookkeeping around it) plus its *collectives* (the k-th TP/CP collective of the op is
  one call on every rank of the stage: `runtime.comm_meter`);
- **edges**: a forward waits for the same micro-batch's forward on the stage before, a backward
  for its backward on the stage after, each plus the measured transfer of the activation (or its
  gradient): the receive after the shape header arrived;
- an interleaved pipeline (v chunks per rank, `interleaved_exec`) is the same graph over its
  `pp * v` virtual stages, each rank running its chunks in the planner's interleaved order;
- the **pipeline time** is the longest path through that 1F1B graph (every op also waits for the
  op before it on its stage), and the path is kept, so its time splits into model compute,
  runtime bookkeeping, collectives and transfers (no idle time lies on a longest path);
- **gradient sync**: each bucket of `grad_sync.GradSync` is one all-reduce over its holders; a
  rank's sync is the sum over its buckets, the step's the largest over ranks, added after the
  slowest pipeline as the planner adds `grad_sync_s` (`planner/cost.py`);

Communication has three clocks (`clock`): `cpu` (default), the process CPU time during the call,
the mean over its participants (gloo's threads doing the copies and reductions: the work, as the
ops' compute is counted). Every participant of a ring all-reduce or all-gather does the same work
and gloo's calling thread sleeps while it waits for a late peer (measured on the 2-core dev
machine: two gloo ranks, one 0.5 s late to a 1 MB all-reduce; the other spent 0.000 s of thread
CPU time and 0.003 s of process CPU time in the call), so the participants' figures are
copies of one quantity that differ by the noise of oversubscribed cores (the process's other
threads run in the window too): their largest is biased upwards, their mean is not.
`cpu-busiest` takes that largest (an upper figure); `wall`, the least wall time among the
participants (the last to arrive waits for nobody, but on oversubscribed cores it still waits to
be scheduled again, so this too is an upper figure there).
- the **optimizer** (AdamW on each shard, thread CPU, the largest over ranks) is reported beside:
  the planner's step time has no optimizer term.

Pure Python (no torch): the benchmark and the tests build it from plain dictionaries.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from hydraplan.planner.scheme import ParallelScheme
from hydraplan.runtime.assignment import interleaved_order, one_f_one_b

__all__ = [
    "CLOCKS",
    "CriticalPath",
    "OpTime",
    "StepTiming",
    "critical_path",
    "interleaved_critical_path",
    "op_times",
    "step_timing",
]

OpKey = tuple[int, bool, int]  # (stage, is_forward, micro_batch)


@dataclass(frozen=True)
class OpTime:
    """One op of one stage, its parts in seconds (`transfer_s`: its input's transfer)."""

    model_s: float  # the model's forward or backward call, thread CPU
    bookkeeping_s: float = 0.0  # the rest of the op's thread CPU (batch, headers, sends)
    collectives_s: float = 0.0  # TP/CP collectives, least wall time per call over the stage's ranks
    transfer_s: float = 0.0  # the p2p transfer of the op's input from the neighbouring stage

    @property
    def duration_s(self) -> float:
        """How long the op holds its stage."""
        return self.model_s + self.bookkeeping_s + self.collectives_s


@dataclass(frozen=True)
class CriticalPath:
    """The longest path through one pipeline's executed 1F1B graph and what it is made of."""

    total_s: float
    model_s: float
    bookkeeping_s: float
    collectives_s: float
    transfer_s: float
    ops: tuple[OpKey, ...]  # the path, first op first

    @property
    def overhead(self) -> float:
        """How much longer the path is than the model compute on it (0.05 = 5% over)."""
        return self.total_s / self.model_s - 1 if self.model_s > 0 else 0.0

    @property
    def runtime_overhead(self) -> float:
        """How much longer the path is than the ops' own work on it: the model compute and the
        TP/CP collectives inside the layers (what a scheme's profiled stage time holds); the rest
        is the runtime's bookkeeping and the point-to-point transfers."""
        work = self.model_s + self.collectives_s
        return self.total_s / work - 1 if work > 0 else 0.0


def critical_path(times: dict[OpKey, OpTime], num_stages: int, num_micro_batches: int) -> CriticalPath:
    """Longest path of the 1F1B schedule with these op times (every (stage, F/B, micro-batch))."""
    if num_micro_batches == 0:
        return CriticalPath(0.0, 0.0, 0.0, 0.0, 0.0, ())
    orders = [[(stage, *op) for op in one_f_one_b(stage, num_stages, num_micro_batches)] for stage in range(num_stages)]
    return _longest_path(orders, lambda key: _dependency(key, num_stages), times)


def interleaved_critical_path(
    times: dict[OpKey, OpTime], num_stages: int, num_chunks: int, num_micro_batches: int
) -> CriticalPath:
    """Longest path of the interleaved 1F1B schedule (groups of pp) with these op times, keyed
    (virtual stage, F/B, micro-batch): rank r runs `assignment.interleaved_order`, its chunk c being
    virtual stage `c * pp + r`; a forward waits for the virtual stage before, a backward for the
    one after (the path's `ops` name virtual stages)."""
    if num_micro_batches == 0:
        return CriticalPath(0.0, 0.0, 0.0, 0.0, 0.0, ())
    orders = [
        [
            (chunk * num_stages + rank, is_forward, index)
            for is_forward, index, chunk in interleaved_order(rank, num_stages, num_chunks, num_micro_batches)
        ]
        for rank in range(num_stages)
    ]
    return _longest_path(orders, lambda key: _dependency(key, num_stages * num_chunks), times)


def _longest_path(orders: list[list[OpKey]], dependency_of, times: dict[OpKey, OpTime]) -> CriticalPath:
    """Every op starts when the op before it on its rank and the op it consumes (plus the
    transfer) have finished; the longest path, walked back from the last op to finish."""
    finish: dict[OpKey, float] = {}
    came_from: dict[OpKey, tuple[OpKey | None, bool]] = {}  # predecessor, and whether via an edge
    previous: list[OpKey | None] = [None] * len(orders)
    cursor = [0] * len(orders)
    remaining = sum(len(order) for order in orders)
    while remaining:
        progressed = False
        for rank, order in enumerate(orders):
            while cursor[rank] < len(order):
                key = order[cursor[rank]]
                dependency = dependency_of(key)
                if dependency is not None and dependency not in finish:
                    break
                on_rank = finish[previous[rank]] if previous[rank] is not None else 0.0
                arrives = finish[dependency] + times[key].transfer_s if dependency is not None else 0.0
                if dependency is not None and arrives > on_rank:
                    came_from[key] = (dependency, True)
                else:
                    came_from[key] = (previous[rank], False)
                finish[key] = max(on_rank, arrives) + times[key].duration_s
                previous[rank] = key
                cursor[rank] += 1
                remaining -= 1
                progressed = True
        assert progressed, "the schedule's order has a cycle"  # our own invariant: it never does
    last = max(finish, key=lambda key: finish[key])
    return _walk_back(last, finish[last], times, came_from)


def _dependency(key: OpKey, num_stages: int) -> OpKey | None:
    """The op on another stage whose output this op consumes (None on the first/last stage)."""
    stage, is_forward, index = key
    if is_forward:
        return (stage - 1, True, index) if stage > 0 else None
    return (stage + 1, False, index) if stage < num_stages - 1 else None


def _walk_back(last: OpKey, total_s: float, times: dict[OpKey, OpTime], came_from: dict) -> CriticalPath:
    path: list[OpKey] = []
    parts = [0.0, 0.0, 0.0, 0.0]
    key: OpKey | None = last
    while key is not None:
        path.append(key)
        op = times[key]
        parts[0] += op.model_s
        parts[1] += op.bookkeeping_s
        parts[2] += op.collectives_s
        key, via_edge = came_from[key]
        if via_edge:
            parts[3] += op.transfer_s
    return CriticalPath(total_s, *parts, ops=tuple(reversed(path)))


CLOCKS = ("cpu", "cpu-busiest", "wall")


def _per_call(calls_by_rank: Sequence[Sequence[Sequence]], clock: str) -> float:
    """Sum over the k-th collective of the ranks that ran it: the mean or the largest CPU time,
    or the least wall time (records `[kind, bytes, wall_s, cpu_s]`)."""
    column, pick = {"cpu": (3, statistics.fmean), "cpu-busiest": (3, max), "wall": (2, min)}[clock]
    counts = {len(calls) for calls in calls_by_rank}
    if len(counts) != 1:  # ranks that disagree on the calls: each rank's own total
        return pick(sum(call[column] for call in calls) for calls in calls_by_rank)
    return sum(pick(calls[k][column] for calls in calls_by_rank) for k in range(counts.pop()))


def _transfer(records: Sequence[dict], clock: str) -> float:
    if clock != "wall":  # a point-to-point receive: one rank's, no peer to compare with
        return max(record.get("transfer_cpu_s", 0.0) for record in records)
    return min(record.get("transfer_s", 0.0) for record in records)


def op_times(stage_ops: Sequence[Sequence[dict]], clock: str = "cpu") -> dict[tuple, OpTime]:
    """`OpTime` of every op of one stage from its ranks' op records (`pipeline_exec` ops),
    keyed `(is_forward, micro_batch)`; `(is_forward, micro_batch, chunk)` for an interleaved
    stage's ops (`interleaved_exec`, whose records name their chunk)."""
    if clock not in CLOCKS:
        raise ValueError(f"clock {clock!r}: one of {', '.join(CLOCKS)}")
    by_key: dict[tuple, list[dict]] = {}
    for ops in stage_ops:
        for op in ops:
            key = (op["op"] == "F", op["micro_batch"]) + ((op["chunk"],) if "chunk" in op else ())
            by_key.setdefault(key, []).append(op)
    times = {}
    for key, records in by_key.items():
        slowest = max(records, key=lambda record: record["cpu_s"])
        model_s = slowest.get("compute_cpu_s", slowest["cpu_s"])
        times[key] = OpTime(
            model_s=model_s,
            bookkeeping_s=max(0.0, slowest["cpu_s"] - model_s),
            collectives_s=_per_call([record.get("comm", []) for record in records], clock),
            transfer_s=_transfer(records, clock),
        )
    return times


@dataclass
class StepTiming:
    """One measured step of a plan: per pipeline its critical path, then the sync and optimizer."""

    pipelines: dict[int, CriticalPath] = field(default_factory=dict)
    sync_s: float = 0.0  # the slowest rank's gradient sync
    optimizer_s: float = 0.0  # the slowest rank's AdamW step, thread CPU
    slowest_pipeline: int = -1

    @property
    def pipeline_s(self) -> float:
        return self.pipelines[self.slowest_pipeline].total_s if self.pipelines else 0.0

    @property
    def step_s(self) -> float:
        """Slowest pipeline plus gradient sync: what the planner's `step_time_s` predicts."""
        return self.pipeline_s + self.sync_s


def _sync_s(reports: Sequence[dict], step: int, clock: str) -> float:
    """Per bucket the holders' mean or largest CPU time (or least wall time), summed per rank;
    the slowest rank."""
    column, pick = {"cpu": (2, statistics.fmean), "cpu-busiest": (2, max), "wall": (1, min)}[clock]
    figures: dict[tuple[int, ...], list[float]] = {}
    for report in reports:
        for holders, *times in report["steps"][step]["sync"].get("bucket_walls_s", []):
            figures.setdefault(tuple(holders), []).append(times[column - 1])
    per_bucket = {key: pick(values) for key, values in figures.items()}
    per_rank = [
        sum(per_bucket[tuple(bucket[0])] for bucket in report["steps"][step]["sync"].get("bucket_walls_s", []))
        for report in reports
    ]
    return max(per_rank, default=0.0)


def step_place(report: dict, step: int) -> tuple[int, int, ParallelScheme]:
    """Where a rank ran step `step` (`run_worker`'s report): its pipeline, PP stage and scheme, the
    step's own (a strategy switch moves a rank), else the report's (its last layout)."""
    record = report["steps"][step]
    scheme = ParallelScheme.parse(record.get("scheme", report["scheme"]))
    return record.get("pipeline", report["pipeline"]), record.get("stage", report["stage"]), scheme


def step_timing(reports: Sequence[dict], step: int, clock: str = "cpu") -> StepTiming:
    """The measured step `step` from every rank's report (`clock` of the communication: `CLOCKS`)."""
    stages: dict[int, dict[int, list[list[dict]]]] = {}
    shapes: dict[int, tuple[int, int]] = {}  # (pp, v)
    for report in reports:
        pipeline, stage, scheme = step_place(report, step)
        stages.setdefault(pipeline, {}).setdefault(stage, []).append(report["steps"][step]["ops"])
        shapes[pipeline] = (scheme.pp, scheme.v)
    timing = StepTiming()
    for pipeline, by_stage in sorted(stages.items()):
        num_stages, num_chunks = shapes[pipeline]
        times: dict[OpKey, OpTime] = {}
        for stage, stage_ops in by_stage.items():
            for key, value in op_times(stage_ops, clock).items():
                if num_chunks == 1:
                    times[(stage, *key)] = value
                else:  # (F/B, micro-batch, chunk) of rank `stage`: virtual stage chunk * pp + stage
                    times[(key[2] * num_stages + stage, key[0], key[1])] = value
        num_micro_batches = len(stage_ops[0]) // (2 * num_chunks)
        if num_chunks == 1:
            timing.pipelines[pipeline] = critical_path(times, num_stages, num_micro_batches)
        else:
            timing.pipelines[pipeline] = interleaved_critical_path(times, num_stages, num_chunks, num_micro_batches)
    timing.slowest_pipeline = max(timing.pipelines, key=lambda index: timing.pipelines[index].total_s)
    timing.sync_s = _sync_s(reports, step, clock)
    timing.optimizer_s = max((r["steps"][step].get("optimizer_s", {}).get("cpu_s", 0.0) for r in reports), default=0.0)
    return timing
