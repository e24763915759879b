"""The executed 1F1B graph's critical path, from each op's measured thread CPU time.

On this 2-core machine the ranks oversubscribe the cores, so wall time is not the parallel time.
Each op (forward or backward of one micro-batch on one stage) records its thread CPU time; the
step's pipeline time is rebuilt as the longest path through the schedule's dependencies: an op
starts when the previous op of its stage and the op it waits for (the forward on the stage before,
the backward on the stage after) have finished. A stage's op takes the longest of its TP/CP
ranks' times (they run in lockstep through their collectives). Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from hydraplan.runtime.step_timing import OpTime, critical_path, interleaved_critical_path, step_place

__all__ = ["critical_path_s", "pipeline_critical_paths_s"]


def critical_path_s(durations_s: dict[tuple[int, bool, int], float], num_stages: int, num_micro_batches: int) -> float:
    """Makespan of the 1F1B schedule with `durations_s[(stage, is_forward, micro_batch)]` (no
    transfer times: `step_timing.critical_path` with only the ops' durations)."""
    times = {key: OpTime(model_s=duration) for key, duration in durations_s.items()}
    return critical_path(times, num_stages, num_micro_batches).total_s


def pipeline_critical_paths_s(reports: Sequence[dict], step: int) -> dict[int, float]:
    """Pipeline index -> critical path of step `step` from every rank's report (`run_worker`); an
    interleaved pipeline's (`<tp,pp,cp,v>`) over its virtual stages, its ops naming their chunk."""
    durations: dict[int, dict[tuple[int, bool, int], float]] = {}
    shapes: dict[int, tuple[int, int, int]] = {}  # (pp, v, micro-batches)
    for report in reports:
        ops = report["steps"][step]["ops"]
        pipeline, stage, scheme = step_place(report, step)
        num_stages, num_chunks = scheme.pp, scheme.v
        table = durations.setdefault(pipeline, {})
        for op in ops:
            virtual = op.get("chunk", 0) * num_stages + stage
            key = (virtual, op["op"] == "F", op["micro_batch"])
            table[key] = max(table.get(key, 0.0), op["cpu_s"])
        shapes[pipeline] = (num_stages, num_chunks, len(ops) // (2 * num_chunks))
    paths = {}
    for index in sorted(durations):
        num_stages, num_chunks, num_micro = shapes[index]
        if num_chunks == 1:
            paths[index] = critical_path_s(durations[index], num_stages, num_micro)
        else:
            times = {key: OpTime(model_s=duration) for key, duration in durations[index].items()}
            paths[index] = interleaved_critical_path(times, num_stages, num_chunks, num_micro).total_s
    return paths
