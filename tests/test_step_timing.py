"""The measured step rebuilt from op records (runtime.step_timing, runtime.comm_meter): no torch needed."""

from __future__ import annotations

import random

import pytest

from hydraplan.planner.simulate import simulate_1f1b
from hydraplan.runtime import comm_meter
from hydraplan.runtime.step_timing import OpTime, critical_path, op_times, step_timing


def test_the_critical_path_of_a_hand_built_two_stage_graph() -> None:
    """pp=2, m=2. Stage 0 runs F0 F1 B0 B1, stage 1 F0 B0 F1 B1; forwards take 1 (stage 0) and 2
    (stage 1), backwards 3, every cross-stage input arrives 0.5 after its producer ends. By hand:
    stage 1 runs F0 1.5-3.5, B0 -6.5, F1 -8.5, B1 -11.5; stage 0's B0 starts at 7 (B0 of stage 1 +
    0.5) and ends at 10, B1 waits for 11.5 + 0.5 and ends at 15."""
    times = {}
    for stage in range(2):
        for index in range(2):
            times[(stage, True, index)] = OpTime(model_s=1.0 + stage, transfer_s=0.5 if stage == 1 else 0.0)
            times[(stage, False, index)] = OpTime(model_s=3.0, transfer_s=0.5 if stage == 0 else 0.0)
    path = critical_path(times, num_stages=2, num_micro_batches=2)
    assert path.total_s == pytest.approx(15.0)
    assert path.ops == ((0, True, 0), (1, True, 0), (1, False, 0), (1, True, 1), (1, False, 1), (0, False, 1))
    assert path.model_s == pytest.approx(14.0)
    assert path.transfer_s == pytest.approx(1.0)  # the two edges on the path, not the off-path ones
    assert path.overhead == pytest.approx(1 / 14)


def test_the_parts_of_an_op_all_hold_its_stage() -> None:
    times = {
        (0, True, 0): OpTime(model_s=1.0, bookkeeping_s=0.25, collectives_s=0.5),
        (0, False, 0): OpTime(model_s=2.0, collectives_s=0.25),
    }
    path = critical_path(times, num_stages=1, num_micro_batches=1)
    assert path.total_s == pytest.approx(4.0)
    assert (path.model_s, path.bookkeeping_s, path.collectives_s, path.transfer_s) == pytest.approx(
        (3.0, 0.25, 0.75, 0.0)
    )
    assert path.overhead == pytest.approx(4.0 / 3.0 - 1) and path.runtime_overhead == pytest.approx(4.0 / 3.75 - 1)


@pytest.mark.parametrize("num_stages, num_micro", [(1, 3), (2, 1), (3, 5), (4, 7)])
def test_without_transfers_the_path_is_the_planners_simulation(num_stages: int, num_micro: int) -> None:
    rng = random.Random(num_stages * 100 + num_micro)
    stage_times = [rng.uniform(0.1, 2.0) for _ in range(num_micro)]
    fwd = 0.37
    times = {}
    for stage in range(num_stages):
        for index, time_s in enumerate(stage_times):
            times[(stage, True, index)] = OpTime(model_s=fwd * time_s)
            times[(stage, False, index)] = OpTime(model_s=time_s - fwd * time_s)
    path = critical_path(times, num_stages, num_micro)
    assert path.total_s == pytest.approx(simulate_1f1b(stage_times, num_stages, fwd), rel=1e-12)
    assert path.model_s == pytest.approx(path.total_s, rel=1e-12)  # no idle time lies on a longest path


def test_no_micro_batches_is_an_empty_path() -> None:
    assert critical_path({}, num_stages=2, num_micro_batches=0).total_s == 0.0


def _op(op, index, cpu, model, comm=(), transfer=(0.0, 0.0)) -> dict:
    return {
        "op": op,
        "micro_batch": index,
        "cpu_s": cpu,
        "compute_cpu_s": model,
        "comm": [list(call) for call in comm],
        "transfer_s": transfer[0],
        "transfer_cpu_s": transfer[1],
    }


def test_op_times_take_the_slowest_rank_and_each_collective_once() -> None:
    # two CP ranks, two collectives each: [kind, bytes, wall_s, cpu_s]
    rank_0 = [_op("F", 0, 1.0, 0.9, [("all_gather", 8, 0.30, 0.02), ("all_gather", 8, 0.01, 0.03)], (0.2, 0.01))]
    rank_1 = [_op("F", 0, 1.2, 1.0, [("all_gather", 8, 0.05, 0.04), ("all_gather", 8, 0.40, 0.01)], (0.1, 0.02))]
    by_cpu = op_times([rank_0, rank_1])[(True, 0)]
    assert by_cpu.model_s == pytest.approx(1.0) and by_cpu.bookkeeping_s == pytest.approx(0.2)  # rank 1's
    assert by_cpu.collectives_s == pytest.approx(0.03 + 0.02)  # per call, the ranks' mean CPU
    assert by_cpu.transfer_s == pytest.approx(0.02)
    by_busiest = op_times([rank_0, rank_1], clock="cpu-busiest")[(True, 0)]
    assert by_busiest.collectives_s == pytest.approx(0.04 + 0.03)  # per call, the busier rank's CPU
    assert by_busiest.model_s == by_cpu.model_s and by_busiest.transfer_s == by_cpu.transfer_s
    by_wall = op_times([rank_0, rank_1], clock="wall")[(True, 0)]
    assert by_wall.collectives_s == pytest.approx(0.05 + 0.01)  # per call, the last to arrive's wall
    assert by_wall.transfer_s == pytest.approx(0.1)
    with pytest.raises(ValueError, match="clock 'gpu'"):
        op_times([rank_0], clock="gpu")


def test_ranks_that_disagree_on_their_collectives_fall_back_to_their_own_totals() -> None:
    rank_0 = [_op("B", 0, 1.0, 1.0, [("all_reduce", 4, 0.1, 0.01)])]
    rank_1 = [_op("B", 0, 1.0, 1.0, [("all_reduce", 4, 0.1, 0.02), ("all_reduce", 4, 0.1, 0.03)])]
    assert op_times([rank_0, rank_1])[(False, 0)].collectives_s == pytest.approx(0.03)  # their totals' mean
    assert op_times([rank_0, rank_1], clock="wall")[(False, 0)].collectives_s == pytest.approx(0.1)
    assert op_times([rank_0, rank_1], clock="cpu-busiest")[(False, 0)].collectives_s == pytest.approx(0.05)


def _report(rank, pipeline, scheme, stage, ops, buckets, optimizer=0.01) -> dict:
    step = {"ops": ops, "sync": {"bucket_walls_s": buckets}, "optimizer_s": {"wall_s": 1.0, "cpu_s": optimizer}}
    return {"rank": rank, "pipeline": pipeline, "scheme": scheme, "stage": stage, "steps": [step]}


def test_a_step_is_the_slowest_pipeline_plus_the_slowest_ranks_sync() -> None:
    """Pipeline 0 is `<1,1,2>` on ranks 0-1 (one micro-batch), pipeline 1 `<1,1,1>` on rank 2 (two)."""
    cp = [("all_gather", 8, 0.5, 0.1)]
    reports = [
        _report(0, 0, "<1,1,2>", 0, [_op("F", 0, 1.0, 1.0, cp), _op("B", 0, 2.0, 2.0)], [[[0, 1, 2], 0.9, 0.2]]),
        _report(1, 0, "<1,1,2>", 0, [_op("F", 0, 1.5, 1.5, cp), _op("B", 0, 1.0, 1.0)], [[[0, 1, 2], 0.1, 0.3]]),
        _report(
            2,
            1,
            "<1,1,1>",
            0,
            [_op("F", 0, 1.0, 1.0), _op("B", 0, 1.0, 1.0), _op("F", 1, 0.5, 0.5), _op("B", 1, 0.5, 0.5)],
            [[[0, 1, 2], 2.0, 0.1], [[1, 2], 0.5, 0.05]],
            optimizer=0.07,
        ),
    ]
    reports[1]["steps"][0]["sync"]["bucket_walls_s"].append([[1, 2], 0.2, 0.02])
    timing = step_timing(reports, 0, clock="cpu-busiest")
    assert timing.pipelines[0].total_s == pytest.approx(1.5 + 0.1 + 2.0)  # per op the slowest rank
    assert timing.pipelines[1].total_s == pytest.approx(3.0)
    assert timing.slowest_pipeline == 0 and timing.pipeline_s == pytest.approx(3.6)
    assert timing.sync_s == pytest.approx(0.3 + 0.05)  # bucket [0,1,2]: 0.3, bucket [1,2]: 0.05
    assert timing.step_s == pytest.approx(3.95)
    assert timing.optimizer_s == pytest.approx(0.07)
    mean = step_timing(reports, 0)  # the default: per bucket the holders' mean
    assert mean.sync_s == pytest.approx(0.2 + 0.035) and mean.pipelines[0].total_s == pytest.approx(3.6)
    by_wall = step_timing(reports, 0, clock="wall")
    assert by_wall.sync_s == pytest.approx(0.1 + 0.2)
    assert by_wall.pipelines[0].collectives_s == pytest.approx(0.5)


def test_the_comm_meter_records_only_inside_an_op_and_in_call_order() -> None:
    with comm_meter.timed("all_reduce", 4):  # no op recording: nothing kept, nothing fails
        pass
    with comm_meter.recording() as records:
        with comm_meter.timed("all_gather", 16):
            sum(range(10_000))
        with comm_meter.timed("all_reduce", 8):
            pass
    assert [(r.kind, r.num_bytes) for r in records] == [("all_gather", 16), ("all_reduce", 8)]
    assert all(r.wall_s >= 0 and r.cpu_s >= 0 for r in records)
    with comm_meter.recording() as later:
        pass
    assert later == []


def test_the_run_report_carries_the_measured_step_of_every_step() -> None:
    from hydraplan.api.cli.run import _measured_steps

    reports = [
        _report(0, 0, "<1,2,1>", 0, [_op("F", 0, 1.0, 1.0), _op("B", 0, 2.0, 2.0)], [[[0, 1], 0.5, 0.25]]),
        _report(
            1,
            0,
            "<1,2,1>",
            1,
            [_op("F", 0, 1.0, 1.0, transfer=(0.3, 0.1)), _op("B", 0, 2.0, 2.0)],
            [[[0, 1], 0.5, 0.25]],
        ),
    ]
    reports[0]["steps"][0]["ops"][1]["transfer_cpu_s"] = 0.2  # stage 0's backward waits for its gradient
    (step,) = _measured_steps(reports)
    assert step["sync_s"] == pytest.approx(0.25) and step["slowest_pipeline"] == 0
    path = step["pipelines"]["0"]
    assert path["total_s"] == pytest.approx(1.0 + 0.1 + 1.0 + 2.0 + 0.2 + 2.0)
    assert path["transfer_s"] == pytest.approx(0.3) and len(path["ops"]) == 4
    assert step["step_s"] == pytest.approx(path["total_s"] + 0.25)
