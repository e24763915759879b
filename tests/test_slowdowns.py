"""Slow ranks (issue 31, item 3): per-rank factors estimated from measurements, requests that carry
them, plans that give a slow rank's pipeline less work, and a checker that recomputes with them."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from hydraplan.api.cli.run_planning import LocalPlanner
from hydraplan.api.service.loop_schemas import MeasurementsBody
from hydraplan.cost_models.online_fit import MeasuredMicroBatch, MeasuredPipeline, OnlineFitState, apply_step
from hydraplan.cost_models.profile_io import bundled_profile
from hydraplan.cost_models.rank_speed import (
    MAX_FACTOR,
    MIN_OBSERVATIONS,
    WINDOW_STEPS,
    PipelineRatio,
    rank_factors,
    step_observations,
)
from hydraplan.planner.build import identified
from hydraplan.planner.check import check_plan
from hydraplan.planner.schemas import PlanRequest, SolverOptions
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.solve import evaluate_strategy, solve
from hydraplan.runtime.step_measurements import measurements_body

LENGTHS = [700, 30, 420, 90, 610, 15, 260, 330, 45, 510, 120, 75]
DATA_PARALLEL = [(ParallelScheme.parse("<1,1,1>"), 2)]


def request(**overrides) -> PlanRequest:
    values = {
        "lengths": LENGTHS,
        "num_gpus": 2,
        "gpus_per_node": 2,
        "options": SolverOptions(solver="greedy", time_limit_s=5.0, seed=0),
    }
    return PlanRequest(**{**values, **overrides})


def tokens_on(plan, rank: int) -> int:
    return sum(pipeline.num_tokens for pipeline in plan.pipelines if rank in pipeline.ranks)


# ---------------------------------------------------------------------------------------------
# Estimating the factors
# ---------------------------------------------------------------------------------------------


def two_pipelines(slow: float, fast: float = 1.0) -> list[PipelineRatio]:
    return [PipelineRatio((0,), fast, 1.0), PipelineRatio((1,), slow, 1.0)]


def test_a_rank_is_called_slow_only_after_enough_evidence() -> None:
    observations = []
    for step in range(1, MIN_OBSERVATIONS + 1):
        assert rank_factors(observations, step - 1) == {}  # fewer observations than needed: nothing
        observations += step_observations(step, two_pipelines(slow=3.0, fast=1.1))
    assert rank_factors(observations, MIN_OBSERVATIONS) == {1: pytest.approx(3.0 / 1.1)}


def test_the_median_ignores_one_straggler_step_and_noise_below_the_threshold() -> None:
    observations = []
    for step in range(1, 7):
        # rank 0 within noise (+10%), but once a 10x straggler step
        slow = 10.0 if step == 3 else 1.1
        observations += step_observations(step, [PipelineRatio((0,), slow, 1.0), PipelineRatio((1,), 1.0, 1.0)])
        assert rank_factors(observations, step) == {}
    # two slow steps in a row are a new regime: the last three's median sees it
    for step in (7, 8):
        observations += step_observations(step, [PipelineRatio((0,), 2.0, 1.0), PipelineRatio((1,), 1.0, 1.0)])
    assert rank_factors(observations, 8) == {0: pytest.approx(2.0)}


def test_factors_are_relative_to_the_fastest_pipeline_clipped_and_forgotten_after_the_window() -> None:
    # the whole machine 2x slower is the refit's business: no rank is slow
    same = [step_observations(step, two_pipelines(slow=2.0, fast=2.0)) for step in range(1, 5)]
    assert rank_factors([o for obs in same for o in obs], 4) == {}
    # a 50x slower rank is clipped; one pipeline in a step shows no contrast and adds nothing
    huge = [o for step in range(1, 5) for o in step_observations(step, two_pipelines(slow=50.0))]
    assert rank_factors(huge, 4) == {1: MAX_FACTOR}
    assert step_observations(5, [PipelineRatio((0, 1), 5.0, 1.0)]) == []
    assert rank_factors(huge, 4 + WINDOW_STEPS) == {}


def test_one_pipeline_tells_its_slow_rank_apart_by_its_ranks_compute() -> None:
    """1x<2,1,1> alone on a step: no other pipeline to contrast with, but its two ranks do equal
    work, so rank 1's compute at 3x rank 0's calls it slow after MIN_OBSERVATIONS steps."""
    pipeline = PipelineRatio((0, 1), 3.0, 1.0, rank_compute_s=(1.0, 3.0), stage_size=2)
    observations = [o for step in range(1, MIN_OBSERVATIONS + 1) for o in step_observations(step, [pipeline])]
    assert sorted({(rank, ratio) for _, rank, ratio in observations}) == [(0, 1.0), (1, pytest.approx(3.0))]
    assert rank_factors(observations, MIN_OBSERVATIONS) == {1: pytest.approx(3.0)}
    # stages of one rank each (<1,2,1>) are not compared: their work differs (embedding, head)
    staged = PipelineRatio((0, 1), 3.0, 1.0, rank_compute_s=(1.0, 3.0), stage_size=1)
    assert step_observations(1, [staged]) == []
    # without the compute, one pipeline still shows nothing
    assert step_observations(1, [PipelineRatio((0, 1), 3.0, 1.0, stage_size=2)]) == []


def test_across_pipelines_the_slow_pipelines_slowest_rank_carries_its_ratio() -> None:
    """Two <2,1,1> pipelines; rank 3 (of the second) computes 3x: the second pipeline's ratio over
    the first goes to rank 3, its stage partner rank 2 gets it scaled by their compute (1.0)."""
    pipelines = [
        PipelineRatio((0, 1), 1.0, 1.0, rank_compute_s=(1.0, 1.0), stage_size=2),
        PipelineRatio((2, 3), 3.0, 1.0, rank_compute_s=(1.0, 3.0), stage_size=2),
    ]
    observations = {rank: ratio for _, rank, ratio in step_observations(1, pipelines)}
    assert observations == {0: 1.0, 1: 1.0, 2: pytest.approx(1.0), 3: pytest.approx(3.0)}
    # with the compute not given, every rank of the slow pipeline gets its ratio (as before)
    blind = [PipelineRatio(p.ranks, p.measured_s, p.predicted_s, stage_size=2) for p in pipelines]
    assert {rank: ratio for _, rank, ratio in step_observations(1, blind)} == {0: 1.0, 1: 1.0, 2: 3.0, 3: 3.0}


def test_the_refit_finds_a_slow_rank_inside_a_tensor_parallel_pipeline() -> None:
    """apply_step with one 1x<2,1,1> pipeline a step, its rank 1 computing 3x rank 0: after
    MIN_OBSERVATIONS steps the session's state names rank 1 slow."""
    profile = bundled_profile()
    entry = next(entry for entry in profile.schemes if entry.key == (2, 1, 1))
    time_s = (entry.a * 500**2 + entry.b * 500 + entry.c) * profile.seconds_per_unit
    batches = (MeasuredMicroBatch(500.0**2, 500.0, 3 * time_s),)
    measured = [MeasuredPipeline((2, 1, 1), batches, None, (0, 1), time_s, 1.0, (1.0, 3.0))]
    state = OnlineFitState()
    for _ in range(MIN_OBSERVATIONS):
        state = apply_step(state, profile, measured, state.version)
    assert state.rank_slowdowns == {1: pytest.approx(3.0)}


def test_with_each_ranks_expected_work_pp_stages_are_compared_too() -> None:
    """1x<1,2,1>: the last stage does 1.6x the first's work (an LM head). Compute in proportion to
    the work shows no slow rank; rank 1 at 3x its work's share is slow. Without the work, stages
    of one rank each are not compared."""
    balanced = PipelineRatio((0, 1), 1.6, 1.0, rank_compute_s=(1.0, 1.6), rank_work=(10.0, 16.0))
    assert {rank: ratio for _, rank, ratio in step_observations(1, [balanced])} == pytest.approx({0: 1.0, 1: 1.0})
    slow = PipelineRatio((0, 1), 4.8, 1.0, rank_compute_s=(1.0, 4.8), rank_work=(10.0, 16.0))
    observations = [o for step in range(1, MIN_OBSERVATIONS + 1) for o in step_observations(step, [slow])]
    assert rank_factors(observations, MIN_OBSERVATIONS) == {1: pytest.approx(3.0)}
    assert step_observations(1, [PipelineRatio((0, 1), 4.8, 1.0, rank_compute_s=(1.0, 4.8))]) == []


def test_the_refit_finds_a_slow_rank_inside_a_pipeline_parallel_pipeline() -> None:
    """apply_step with one 1x<1,2,1> pipeline a step, its last stage doing 1.18x the first's work
    (the tiny model's head) and rank 1 computing 3x its share: rank 1 is named slow after
    MIN_OBSERVATIONS steps."""
    profile = bundled_profile()
    entry = next(entry for entry in profile.schemes if entry.key == (1, 2, 1))
    flops = (1.0e9, 1.18e9)
    time_s = (entry.a * 500**2 + entry.b * 500 + entry.c) * profile.seconds_per_unit
    batches = (MeasuredMicroBatch(500.0**2, 500.0, 3 * time_s),)
    computes = (flops[0] * 1e-9, 3 * flops[1] * 1e-9)
    measured = [MeasuredPipeline((1, 2, 1), batches, None, (0, 1), time_s, 1.0, computes, flops)]
    state = OnlineFitState()
    for _ in range(MIN_OBSERVATIONS):
        state = apply_step(state, profile, measured, state.version)
    assert state.rank_slowdowns == {1: pytest.approx(3.0)}
    # the same compute without the work: no contrast between the two stages, nobody named
    blind = [MeasuredPipeline((1, 2, 1), batches, None, (0, 1), time_s, 1.0, computes)]
    state = OnlineFitState()
    for _ in range(MIN_OBSERVATIONS):
        state = apply_step(state, profile, blind, state.version)
    assert state.rank_slowdowns == {}


def test_a_plan_that_already_slowed_a_pipeline_is_measured_against_its_unscaled_prediction() -> None:
    # the plan predicted rank 1's pipeline 3x the profile's time and it took that: still 3x slow
    ratios = [PipelineRatio((0,), 1.0, 1.0), PipelineRatio((1,), 3.0, 3.0, slowdown=3.0)]
    observations = [o for step in range(1, 4) for o in step_observations(step, ratios)]
    assert rank_factors(observations, 3) == {1: pytest.approx(3.0)}


def test_the_refit_estimates_the_slow_rank_and_its_scheme_fit_is_not_dragged_up() -> None:
    profile = bundled_profile()
    entry = next(entry for entry in profile.schemes if entry.key == (1, 1, 1))
    unit = profile.seconds_per_unit

    def measured(lengths: list[int], factor: float) -> MeasuredMicroBatch:
        s2, s1 = sum(length * length for length in lengths), sum(lengths)
        return MeasuredMicroBatch(float(s2), float(s1), (entry.a * s2 + entry.b * s1 + entry.c) * unit * factor)

    def step(with_ranks: bool) -> list[MeasuredPipeline]:
        pipelines = []
        for rank, factor in ((0, 1.0), (1, 3.0)):
            batches = (measured([300, 100], factor), measured([500], factor))
            predicted = sum(mb.time_s for mb in batches) / factor
            pipelines.append(
                MeasuredPipeline(
                    (1, 1, 1), batches, None, (rank,) if with_ranks else (), predicted if with_ranks else None
                )
            )
        return pipelines

    with_ranks, without = OnlineFitState(), OnlineFitState()
    for _ in range(6):
        with_ranks = apply_step(with_ranks, profile, step(True), with_ranks.version)
        without = apply_step(without, profile, step(False), without.version)
    assert with_ranks.rank_slowdowns == {1: pytest.approx(3.0)}
    assert without.rank_slowdowns == {}
    # the last steps' micro-batches of rank 1 are divided by its factor: the fit stays at the profile
    fitted = with_ranks.window((1, 1, 1)).current
    dragged = without.window((1, 1, 1)).current
    reference = measured([300, 100], 1.0)
    predicted = fitted.stage_time_s(reference.sum_sq_tokens, reference.num_tokens)
    assert predicted < dragged.stage_time_s(reference.sum_sq_tokens, reference.num_tokens)
    assert with_ranks.errors[-1].median_error < 0.05 < without.errors[-1].median_error


# ---------------------------------------------------------------------------------------------
# Requests and plans
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slowdowns", "named"),
    [
        ({2: 2.0}, "rank 2"),
        ({1: 0.5}, "factor 0.5"),
        ({1: float("nan")}, "factor nan"),
        ({1: 1e9}, "factor 1000000000.0"),
    ],
)
def test_bad_slowdowns_are_refused_naming_the_value(slowdowns, named) -> None:
    with pytest.raises(ValidationError, match=named):
        request(rank_slowdowns=slowdowns)


def test_the_cli_refuses_bad_slowdowns_with_exit_2(tmp_path) -> None:
    lengths = tmp_path / "lengths.json"
    lengths.write_text("[100, 200, 300]")
    for text, named in (("1=0.5", "factor 0.5"), ("7=2", "rank 7"), ("1:2", "not RANK=FACTOR")):
        done = subprocess.run(
            [sys.executable, "-m", "hydraplan.api.cli", "plan", "--num-gpus", "2", "--gpus-per-node", "2"]
            + ["--profile", "cost_models/data/tiny-cpu.json", "--lengths", str(lengths), "--rank-slowdowns", text],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 2 and named in done.stderr and "--rank-slowdowns" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_a_slow_ranks_pipeline_gets_fewer_tokens_and_the_plan_says_why() -> None:
    profile = bundled_profile()
    plain = evaluate_strategy(request(), profile, DATA_PARALLEL)
    slowed_request = request(rank_slowdowns={1: 3.0, 0: 1.0})
    slowed = evaluate_strategy(slowed_request, profile, DATA_PARALLEL)
    assert tokens_on(slowed, 1) < tokens_on(plain, 1)
    assert tokens_on(slowed, 1) < tokens_on(slowed, 0)
    assert slowed.rank_slowdowns == {1: 3.0}  # only factors above 1
    assert [pipeline.slowdown for pipeline in slowed.pipelines] == [None, 3.0]
    assert check_plan(slowed, profile, slowed_request) == []
    # factors >= 1 only lengthen steps: the bound without them stays a bound (the same one)
    assert slowed.lower_bound_s == pytest.approx(plain.lower_bound_s)
    assert slowed.lower_bound_s <= slowed.objective_s
    assert plain.objective_s <= slowed.objective_s


def test_the_search_keeps_its_bound_and_plans_without_factors_keep_their_bytes() -> None:
    profile = bundled_profile()
    plain = solve(request(), profile)
    same = solve(request(rank_slowdowns={0: 1.0}), profile)  # no factor above 1: the same plan
    hashed = {"plan_id", "request_hash"}  # the request differs, the plan does not
    assert same.model_dump(mode="json", exclude=hashed) == plain.model_dump(mode="json", exclude=hashed)
    assert "rank_slowdowns" not in plain.model_dump(mode="json")
    assert all("slowdown" not in pipeline for pipeline in plain.model_dump(mode="json")["pipelines"])
    slowed_request = request(rank_slowdowns={1: 4.0})
    slowed = solve(slowed_request, profile)
    assert check_plan(slowed, profile, slowed_request) == []
    assert slowed.lower_bound_s <= slowed.objective_s
    # work moves off the slow rank: two pipelines, the slow one with less (the plain plan may be one
    # pipeline over both ranks, as with the bundled profile of 2026-12-03)
    assert slowed.strategy == "2x<1,1,1>"
    assert tokens_on(slowed, 1) < tokens_on(plain, 1) and tokens_on(slowed, 1) < tokens_on(slowed, 0)


def test_the_checker_catches_a_plan_whose_times_ignore_the_factors() -> None:
    profile = bundled_profile()
    plain = evaluate_strategy(request(), profile, DATA_PARALLEL)
    # the factors claimed, the times not scaled
    claimed = plain.model_copy(
        update={
            "rank_slowdowns": {1: 3.0},
            "pipelines": [plain.pipelines[0], plain.pipelines[1].model_copy(update={"slowdown": 3.0})],
        }
    )
    violations = check_plan(identified(claimed), profile)
    assert any("pipeline 1" in violation and "stage time" in violation for violation in violations), violations
    # scaled times whose plan does not say the factors
    slowed = evaluate_strategy(request(rank_slowdowns={1: 3.0}), profile, DATA_PARALLEL)
    silent = slowed.model_copy(update={"rank_slowdowns": None})
    violations = check_plan(identified(silent), profile)
    assert any("slowdown 3.0 != None" in violation for violation in violations), violations
    # a plan answering a request must carry the request's factors
    violations = check_plan(slowed, profile, request())
    assert any("rank_slowdowns" in violation for violation in violations), violations


# ---------------------------------------------------------------------------------------------
# The loop: body -> local planner -> next plan
# ---------------------------------------------------------------------------------------------


def test_the_local_planner_moves_work_from_a_rank_its_measurements_show_slow() -> None:
    profile = bundled_profile()
    options = SolverOptions(solver="greedy", time_limit_s=5.0, seed=0, strategy_pool=["2x<1,1,1>"])
    planner = LocalPlanner(profile.model_dump_json(), 2, 2, options.model_dump_json())
    plan = planner.plan(LENGTHS, None)
    first_share = tokens_on(plan, 1)
    for _ in range(MIN_OBSERVATIONS):
        body = {
            "pipelines": [
                {
                    "scheme": {"tp": 1, "pp": 1, "cp": 1},
                    "micro_batches": [
                        {
                            "num_tokens": mb.num_tokens,
                            "sum_sq_tokens": sum(length * length for length in mb.lengths),
                            "time_s": mb.stage_time_s * (3.0 if 1 in pipeline.ranks else 1.0),
                        }
                        for mb in pipeline.micro_batches
                    ],
                    "ranks": list(pipeline.ranks),
                    "predicted_s": sum(mb.stage_time_s for mb in pipeline.micro_batches),
                    **({"slowdown": pipeline.slowdown} if pipeline.slowdown else {}),
                }
                for pipeline in plan.pipelines
            ],
            "collectives": [],
        }
        planner.record(body)
        plan = planner.plan(LENGTHS, plan)
    assert planner.fit.rank_slowdowns == {1: pytest.approx(3.0)}
    assert plan.rank_slowdowns == {1: pytest.approx(3.0)}
    assert tokens_on(plan, 1) < first_share


def test_the_runtime_body_names_ranks_predictions_and_the_plans_factor() -> None:
    profile = bundled_profile()
    plan = evaluate_strategy(request(rank_slowdowns={1: 2.0}), profile, DATA_PARALLEL)
    records = []
    for pipeline in plan.pipelines:
        ops = []
        for index, work in enumerate(pipeline.micro_batches):
            for kind, share in (("F", 1 / 3), ("B", 2 / 3)):
                cpu_s = work.stage_time_s * share
                ops.append({"op": kind, "micro_batch": index, "cpu_s": cpu_s, "compute_cpu_s": cpu_s, "comm": []})
        records.append({"rank": pipeline.ranks[0], "pipeline": pipeline.index, "stage": 0, "ops": ops, "buckets": []})
    body = measurements_body(plan, records)
    MeasurementsBody.model_validate(body)  # the service takes it as it is
    by_ranks = {tuple(entry["ranks"]): entry for entry in body["pipelines"]}
    assert set(by_ranks) == {(0,), (1,)}
    assert by_ranks[(1,)]["slowdown"] == 2.0 and "slowdown" not in by_ranks[(0,)]
    for pipeline in plan.pipelines:
        expected = sum(mb.stage_time_s for mb in pipeline.micro_batches)
        assert by_ranks[tuple(pipeline.ranks)]["predicted_s"] == pytest.approx(expected)
