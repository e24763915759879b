"""The closed loop's runtime side without ranks: a step's measurements body built from op records
(runtime.step_measurements), bounded as the service bounds it, and a record that fails without
stopping the run (runtime.plan_feed.post_measurements)."""

from __future__ import annotations

import pytest

from hydraplan.api.cli.run_planning import LocalPlanner, measured_pipelines
from hydraplan.api.service.loop_schemas import (
    MAX_COLLECTIVES,
    MAX_MEASURED_PIPELINES,
    MAX_PIPELINE_MICRO_BATCHES,
    MAX_STEP_MICRO_BATCHES,
    MeasurementsBody,
)
from hydraplan.planner.measurements import SessionFeedback
from hydraplan.planner.schemas import SolverOptions
from hydraplan.runtime import step_measurements
from hydraplan.runtime.step_measurements import measurements_body, pipeline_ratios, rank_record
from tests.runtime_plans import fixed_plan, tiny_profile


def op(kind: str, index: int, cpu_s: float, comm: list | None = None) -> dict:
    return {"op": kind, "micro_batch": index, "cpu_s": cpu_s, "compute_cpu_s": cpu_s, "comm": comm or [], "wall_s": 9.0}


def step_record(ops: list[dict], buckets: list | None = None) -> dict:
    buckets = buckets or []
    return {
        "ops": ops,
        "sync": {
            "bucket_walls_s": [[holders, 5.0, cpu_s] for holders, cpu_s, _ in buckets],
            "bucket_bytes": [num_bytes for _, _, num_bytes in buckets],
        },
    }


def test_the_service_bounds_are_the_runtimes():
    assert (
        step_measurements.MAX_MEASURED_PIPELINES,
        step_measurements.MAX_PIPELINE_MICRO_BATCHES,
        step_measurements.MAX_STEP_MICRO_BATCHES,
        step_measurements.MAX_COLLECTIVES,
    ) == (MAX_MEASURED_PIPELINES, MAX_PIPELINE_MICRO_BATCHES, MAX_STEP_MICRO_BATCHES, MAX_COLLECTIVES)


def test_a_pipeline_stage_pair_gives_each_micro_batch_its_slowest_stage_and_features():
    """1x<1,2,1> on 2 ranks: micro-batch i's time is forward + backward on its slower stage, its
    features the plan's lengths; the sync's bucket is one all-reduce at the holders' mean."""
    plan = fixed_plan("1x<1,2,1>", [5, 9, 2, 7, 12], 2)
    pipeline = plan.pipelines[0]
    count = len(pipeline.micro_batches)
    assert count >= 2
    # stage 0: forward 0.1, backward 0.2; stage 1: forward 0.1 * (i + 1), backward 0.3
    stage0 = [op(kind, i, 0.1 if kind == "F" else 0.2) for i in range(count) for kind in "FB"]
    stage1 = [op(kind, i, 0.1 * (i + 1) if kind == "F" else 0.3) for i in range(count) for kind in "FB"]
    bucket = [[[0, 1], 0.02, 4096]]
    records = [rank_record(rank, 0, rank, step_record(ops, bucket), None) for rank, ops in enumerate((stage0, stage1))]
    body = measurements_body(plan, records)
    measured = body["pipelines"][0]["micro_batches"]
    assert [entry["num_tokens"] for entry in measured] == [sum(mb.lengths) for mb in pipeline.micro_batches]
    assert [entry["sum_sq_tokens"] for entry in measured] == [
        sum(length * length for length in mb.lengths) for mb in pipeline.micro_batches
    ]
    assert [entry["time_s"] for entry in measured] == pytest.approx([0.1 * (i + 1) + 0.3 for i in range(count)])
    assert [entry["fwd_s"] for entry in measured] == pytest.approx([0.1 * (i + 1) for i in range(count)])
    assert body["collectives"] == [{"op": "all_reduce", "ranks": 2, "bytes": 4096, "seconds": pytest.approx(0.02)}]
    assert "profile_version" not in body and "peak_memory_bytes" not in body["pipelines"][0]  # CPU: no peak
    MeasurementsBody.model_validate(body)  # the service takes it as it is


def test_the_body_names_the_plans_profile_version_and_the_ranks_peaks():
    plan = fixed_plan("2x<1,1,1>", [5, 9, 2, 7], 2)
    plan = plan.model_copy(update={"session_feedback": SessionFeedback(profile_version=3)})
    records = []
    for pipeline in plan.pipelines:
        ops = [op(kind, i, 0.05) for i in range(len(pipeline.micro_batches)) for kind in "FB"]
        records.append(rank_record(pipeline.ranks[0], pipeline.index, 0, step_record(ops), 1e9 + pipeline.index))
    body = measurements_body(plan, records)
    assert body["profile_version"] == 3
    assert [entry["peak_memory_bytes"] for entry in body["pipelines"]] == [[1e9], [1e9 + 1]]
    assert MeasurementsBody.model_validate(body).profile_version == 3


def test_the_pipeline_ratios_name_the_ranks_of_a_slow_pipeline():
    """2x<1,1,1>: the pipeline on rank 1 measured 3x its plan's prediction, the one on rank 0 as
    predicted; the ratios name each pipeline's ranks (what the per-scheme body cannot say)."""
    plan = fixed_plan("2x<1,1,1>", [5, 9, 2, 7, 12, 3], 2)
    records = []
    for pipeline in plan.pipelines:
        factor = 3.0 if pipeline.ranks == [1] else 1.0
        ops = []
        for index, work in enumerate(pipeline.micro_batches):  # forward a third, backward two thirds
            ops += [op("F", index, factor * work.stage_time_s / 3), op("B", index, factor * work.stage_time_s * 2 / 3)]
        records.append(rank_record(pipeline.ranks[0], pipeline.index, 0, step_record(ops), None))
    ratios = {tuple(entry["ranks"]): entry["measured_over_predicted"] for entry in pipeline_ratios(plan, records)}
    assert ratios == {(0,): pytest.approx(1.0), (1,): pytest.approx(3.0)}


def test_many_micro_batches_are_thinned_evenly_under_the_services_bounds(monkeypatch):
    """A pipeline of more micro-batches than a body may hold keeps every k-th, and says how many
    it left out; the body still validates (the bounds lowered here to keep the test small)."""
    monkeypatch.setattr(step_measurements, "MAX_PIPELINE_MICRO_BATCHES", 4)
    monkeypatch.setattr(step_measurements, "MAX_STEP_MICRO_BATCHES", 6)
    plan = fixed_plan("2x<1,1,1>", [3, 4, 5, 6], 2)
    plan = plan.model_copy(
        update={
            "pipelines": [
                p.model_copy(update={"micro_batches": [p.micro_batches[0]] * size})
                for p, size in zip(plan.pipelines, (5, 7))
            ]
        }
    )
    sizes = [len(p.micro_batches) for p in plan.pipelines]
    records = [
        rank_record(
            p.ranks[0],
            p.index,
            0,
            step_record([op(kind, i, 0.01 * (i + 1)) for i in range(size) for kind in "FB"]),
            None,
        )
        for p, size in zip(plan.pipelines, sizes)
    ]
    body = measurements_body(plan, records)
    kept = [len(entry["micro_batches"]) for entry in body["pipelines"]]
    assert all(count <= 4 for count in kept) and sum(kept) <= 6 and min(kept) >= 1
    assert body["left_out"] == sum(sizes) - sum(kept)
    # the thinned pipelines' predictions are of what they kept: their measured/predicted is the whole's
    whole = {tuple(entry["ranks"]): entry["measured_over_predicted"] for entry in pipeline_ratios(plan, records)}
    for entry in body["pipelines"]:
        ratio = sum(mb["time_s"] for mb in entry["micro_batches"]) / entry["predicted_s"]
        assert ratio == pytest.approx(whole[tuple(entry["ranks"])])
    # evenly: the kept ones spread over the pipeline, not its first ones
    times = [entry["time_s"] for entry in body["pipelines"][0]["micro_batches"]]
    assert times == sorted(times) and times[-1] > 0.02 * sizes[0] * 0.5
    body.pop("left_out")
    MeasurementsBody.model_validate(body)


def test_the_real_bounds_hold_a_step_of_many_micro_batches():
    """5,000 micro-batches in one pipeline: the body keeps 4,096, the service's bound."""
    plan = fixed_plan("1x<1,1,1>", [2, 3], 1)
    pipeline = plan.pipelines[0]
    micro_batch = pipeline.micro_batches[0]
    many = pipeline.model_copy(update={"micro_batches": [micro_batch] * 5000})
    plan = plan.model_copy(update={"pipelines": [many]})
    ops = [op(kind, i, 0.01) for i in range(5000) for kind in "FB"]
    body = measurements_body(plan, [rank_record(0, 0, 0, step_record(ops), None)])
    assert len(body.pop("left_out") and body["pipelines"][0]["micro_batches"]) == MAX_PIPELINE_MICRO_BATCHES
    MeasurementsBody.model_validate(body)


# ---------------------------------------------------------------------------------------------
# A record that fails never stops the run; the local planner refits in-process
# ---------------------------------------------------------------------------------------------


def small_body(profile_version: int | None = None, peak_bytes: float | None = None) -> dict:
    plan = fixed_plan("1x<1,1,1>", [5, 9, 2], 1)
    if profile_version is not None:
        plan = plan.model_copy(update={"session_feedback": SessionFeedback(profile_version=profile_version)})
    ops = [op(kind, i, 0.05) for i in range(len(plan.pipelines[0].micro_batches)) for kind in "FB"]
    return measurements_body(plan, [rank_record(0, 0, 0, step_record(ops), peak_bytes)])


class RefusingPlanner:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def record(self, body):
        raise self.error


def test_a_failed_or_refused_record_is_reported_and_never_raises(capsys):
    from tests.runtime_support import require_torch

    require_torch()
    from hydraplan.runtime.plan_feed import MeasurementsRefused, post_measurements

    unreachable = post_measurements(RefusingPlanner(RuntimeError("http://x: no answer: refused")), small_body(), 4)
    assert unreachable["posted"] is False and unreachable["step"] == 4
    assert unreachable["error"] == "RuntimeError: http://x: no answer: refused"
    assert capsys.readouterr().err == ""  # a load or an outage: in the report, not a warning
    refused = post_measurements(RefusingPlanner(MeasurementsRefused("http://x: 422 Unprocessable")), small_body(), 5)
    assert refused["posted"] is False and "422" in refused["error"]
    assert "step 5: measurements refused: MeasurementsRefused: http://x: 422" in capsys.readouterr().err  # a bug: shown
    no_record = post_measurements(object(), small_body(), 6)
    assert no_record["posted"] is False and "takes no measurements" in no_record["error"]


def test_the_local_planner_refits_and_its_next_plan_names_the_new_version():
    from tests.runtime_support import require_torch

    require_torch()
    from hydraplan.runtime.plan_feed import post_measurements

    profile = tiny_profile()
    options = SolverOptions(solver="greedy", time_limit_s=1.0, seed=0, oversize="split")
    planner = LocalPlanner(profile.model_dump_json(), 1, 1, options.model_dump_json())
    first = planner.plan([5, 9, 2], None)
    assert first.session_feedback is None  # nothing measured yet: the plan the planner alone makes
    entry = post_measurements(planner, small_body(), 0)
    assert entry["posted"] is True and entry["fit_version"] == 1 and entry["median_error"] > 0
    second = planner.plan([5, 9, 2], first)
    assert second.session_feedback.profile_version == 1
    assert post_measurements(planner, small_body(profile_version=1), 1)["fit_version"] == 2
    # measured 0.1 s per micro-batch against the profile's ~0.03 s: the refit moved the coefficients up
    assert planner.plan([5, 9, 2], second).step_time_s > first.step_time_s


def test_the_local_planners_next_plan_says_which_capacity_a_measured_peak_lowered():
    """Item 3 of issue 31 for `hydraplan run` without a server: a peak near the device's memory
    lowers the scheme's capacity at once, the next plan obeys and names it (as a session's plans
    do), and the plan after that, with nothing new, names nothing."""
    from tests.runtime_support import require_torch

    require_torch()
    from hydraplan.runtime.plan_feed import post_measurements

    profile = tiny_profile().model_copy(update={"gpu_memory_bytes": 1e9, "memory_reserve_bytes": 0.0})
    options = SolverOptions(solver="greedy", time_limit_s=1.0, seed=0, oversize="split")
    planner = LocalPlanner(profile.model_dump_json(), 1, 1, options.model_dump_json())
    first = planner.plan([5, 9, 2], None)
    assert post_measurements(planner, small_body(peak_bytes=0.99e9), 0)["posted"] is True
    second = planner.plan([5, 9, 2], first)
    (change,) = second.session_feedback.capacity_changes
    assert change.scheme == "<1,1,1>" and change.reason == "near-device-memory" and change.measured_peak_bytes == 0.99e9
    assert change.to_tokens == int(change.from_tokens * 0.9 * 1e9 / 0.99e9)  # (1 - 2 x 5%) x usable / peak
    entry = next(e for e in second.cost_profile.schemes if (e.tp, e.pp, e.cp) == (1, 1, 1))
    assert entry.capacity_tokens == change.to_tokens  # the plan was made with the lowered capacity
    post_measurements(planner, small_body(profile_version=1), 1)  # a step without a peak
    third = planner.plan([5, 9, 2], second)
    assert third.session_feedback.profile_version == 2 and third.session_feedback.capacity_changes == []


def test_measured_pipelines_take_the_largest_peak():
    body = {
        "pipelines": [
            {
                "scheme": {"tp": 1, "pp": 2, "cp": 1},
                "micro_batches": [{"num_tokens": 4, "sum_sq_tokens": 10, "time_s": 0.5}],
                "peak_memory_bytes": [3.0, 7.0],
            }
        ]
    }
    (pipeline,) = measured_pipelines(body)
    assert pipeline.scheme == (1, 2, 1) and pipeline.peak_bytes == 7.0
    assert pipeline.micro_batches[0].sum_sq_tokens == 10.0 and pipeline.micro_batches[0].fwd_s is None


def test_the_slowdown_hook_burns_the_asked_cpu_time_from_its_step_on():
    import time

    from tests.runtime_support import require_torch

    require_torch()
    from hydraplan.runtime.faults import burn_cpu, slowdown_factor

    slowdowns = ((1, 3, 2.0), (1, 5, 4.0), (0, 0, 1.5))
    assert [slowdown_factor(slowdowns, 1, step) for step in range(7)] == [1.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert slowdown_factor(slowdowns, 0, 0) == 1.5 and slowdown_factor(slowdowns, 2, 9) == 1.0
    started = time.thread_time()
    burn_cpu(0.05)
    assert time.thread_time() - started >= 0.05  # thread CPU time, what the runtime measures


def test_each_rank_of_a_pipeline_reports_its_compute_over_the_measured_micro_batches():
    """1x<2,1,1>: both ranks run every micro-batch; rank 1 computes 3x as long. The body gives each
    rank's compute in the order of the pipeline's ranks (what tells the slow one from its stage's
    other rank), the service takes it, and the local planner passes it to the refit."""
    plan = fixed_plan("1x<2,1,1>", [5, 9, 2, 7, 12], 2)
    pipeline = plan.pipelines[0]
    count = len(pipeline.micro_batches)
    records = [
        rank_record(rank, 0, 0, step_record([op(kind, i, 0.1 * factor) for i in range(count) for kind in "FB"]), None)
        for rank, factor in zip(pipeline.ranks, (1.0, 3.0), strict=True)
    ]
    entry = measurements_body(plan, records)["pipelines"][0]
    assert entry["ranks"] == list(pipeline.ranks)
    assert entry["rank_compute_s"] == pytest.approx([0.2 * count, 0.6 * count])
    MeasurementsBody.model_validate({"pipelines": [entry]})
    assert measured_pipelines({"pipelines": [entry]})[0].rank_compute_s == pytest.approx((0.2 * count, 0.6 * count))
    # a rank that sent nothing: no compute for any (nothing to compare with)
    alone = measurements_body(plan, records[:1])["pipelines"][0]
    assert "rank_compute_s" not in alone
    # a one-rank pipeline has no one to compare with
    single = fixed_plan("2x<1,1,1>", [5, 9, 2, 7, 12], 2)
    ops = [op(kind, i, 0.1) for i in range(len(single.pipelines[0].micro_batches)) for kind in "FB"]
    body = measurements_body(single, [rank_record(single.pipelines[0].ranks[0], 0, 0, step_record(ops), None)])
    assert "rank_compute_s" not in body["pipelines"][0]


@pytest.mark.parametrize(
    ("ranks", "computes", "message"),
    [
        (None, [1.0, 2.0], "rank_compute_s has 2 values: one per rank of ranks \\(absent\\)"),
        ([0, 1], [1.0], "rank_compute_s has 1 values: one per rank of ranks \\(2\\)"),
    ],
)
def test_rank_compute_must_name_one_value_per_rank(ranks, computes, message):
    from pydantic import ValidationError

    pipeline = {
        "scheme": {"tp": 2, "pp": 1, "cp": 1},
        "micro_batches": [{"num_tokens": 10, "sum_sq_tokens": 100, "time_s": 0.1}],
        "rank_compute_s": computes,
    }
    if ranks is not None:
        pipeline["ranks"] = ranks
    with pytest.raises(ValidationError, match=message):
        MeasurementsBody.model_validate({"pipelines": [pipeline]})


def test_rank_compute_must_be_positive_seconds():
    from pydantic import ValidationError

    pipeline = {
        "scheme": {"tp": 2, "pp": 1, "cp": 1},
        "micro_batches": [{"num_tokens": 10, "sum_sq_tokens": 100, "time_s": 0.1}],
        "ranks": [0, 1],
        "rank_compute_s": [1.0, -2.0],
    }
    with pytest.raises(ValidationError, match="rank_compute_s.1"):
        MeasurementsBody.model_validate({"pipelines": [pipeline]})


def test_with_each_ranks_work_coefficients_the_body_gives_its_expected_work():
    """1x<1,2,1>: each rank sends its stage's forward FLOPs per token and per squared length
    (`runtime.model.stage_work`); the body gives each rank's expected work over the measured
    micro-batches, in the order of the pipeline's ranks; a rank without them: no rank_work."""
    plan = fixed_plan("1x<1,2,1>", [5, 9, 2, 7, 12], 2)
    pipeline = plan.pipelines[0]
    count = len(pipeline.micro_batches)
    coefficients = {pipeline.ranks[0]: (100.0, 2.0), pipeline.ranks[1]: (150.0, 2.0)}  # the last stage's head
    ops = [op(kind, i, 0.1) for i in range(count) for kind in "FB"]
    records = [
        rank_record(rank, 0, stage, step_record(ops), None, coefficients[rank])
        for stage, rank in enumerate(pipeline.ranks)
    ]
    entry = measurements_body(plan, records)["pipelines"][0]
    tokens = [sum(mb.lengths) for mb in pipeline.micro_batches]
    squares = [sum(length * length for length in mb.lengths) for mb in pipeline.micro_batches]
    assert entry["rank_work"] == pytest.approx(
        [sum(t * per_token + q * per_square for t, q in zip(tokens, squares, strict=True))
         for per_token, per_square in coefficients.values()]
    )  # fmt: skip
    MeasurementsBody.model_validate({"pipelines": [entry]})
    assert measured_pipelines({"pipelines": [entry]})[0].rank_work == pytest.approx(tuple(entry["rank_work"]))
    records[1].pop("work")
    assert "rank_work" not in measurements_body(plan, records)["pipelines"][0]


def test_rank_work_needs_the_ranks_compute_beside_it():
    from pydantic import ValidationError

    pipeline = {
        "scheme": {"tp": 1, "pp": 2, "cp": 1},
        "micro_batches": [{"num_tokens": 10, "sum_sq_tokens": 100, "time_s": 0.1}],
        "ranks": [0, 1],
        "rank_work": [1.0, 2.0],
    }
    with pytest.raises(ValidationError, match="rank_work has 2 values: one per rank of ranks, beside rank_compute_s"):
        MeasurementsBody.model_validate({"pipelines": [pipeline]})
    pipeline["rank_compute_s"] = [0.1, 0.2]
    pipeline["rank_work"] = [1.0]
    with pytest.raises(ValidationError, match="rank_work has 1 values"):
        MeasurementsBody.model_validate({"pipelines": [pipeline]})
    pipeline["rank_work"] = [1.0, 0.0]
    with pytest.raises(ValidationError, match="rank_work.1"):
        MeasurementsBody.model_validate({"pipelines": [pipeline]})
