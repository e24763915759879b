"""The scheme's chunk count v (issue 32, items 1 and 3): types, strings and files; per-chunk
pricing with the extra point-to-point traffic; plans of fixed interleaved strategies, checked by the
independent checker; the memory of every rank under the schedule it runs."""

from __future__ import annotations

import json

import pytest

from hydraplan.cost_models.analytic import build_profile, scheme_memory
from hydraplan.cost_models.analytic_time import pp_comm_s_per_token
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.cost_models.hardware import HardwareParams
from hydraplan.cost_models.pipeline_layout import in_flight_micro_batches
from hydraplan.planner import reference
from hydraplan.planner.check import check_plan
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.errors import PlanningError
from hydraplan.planner.schemas import CostProfile, Plan, PlanRequest, SchemeCost, SchemeModel, SolverOptions
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.simulate import schedule_interleaved_1f1b, simulate_1f1b, simulate_interleaved_1f1b
from hydraplan.planner.solve import evaluate_strategy, solve
from hydraplan.planner.strategies import parse_strategy
from hydraplan.planner.switching import switch_cost_s

INTERLEAVED = ParallelScheme(1, 2, 1, 2)


def _profile(with_interleaved: bool = True) -> CostProfile:
    """Two plain schemes and the interleaved <1,2,1,2> priced per chunk (8 layers: 2 per chunk)."""
    schemes = [
        SchemeCost(tp=1, pp=1, cp=1, a=1e-9, b=4e-5, c=2e-3, capacity_tokens=16384, grad_bytes_per_gpu=1e9),
        SchemeCost(tp=1, pp=2, cp=1, a=5e-10, b=2e-5, c=1e-3, capacity_tokens=16384, grad_bytes_per_gpu=5e8),
    ]
    if with_interleaved:
        schemes.append(
            SchemeCost(
                tp=1, pp=2, cp=1, v=2, a=2.5e-10, b=1.1e-5, c=5e-4, capacity_tokens=12000, grad_bytes_per_gpu=5e8
            )
        )
    return CostProfile(num_layers=8, schemes=schemes, grad_sync_bandwidth_bytes_per_s=50e9)


LENGTHS = [4000, 3500, 3000, 2600, 2200, 2000, 1800, 1500, 1200, 1000, 900, 700, 600, 500, 300, 200]


def _request(pool: list[str] | None = None, lengths: list[int] = LENGTHS) -> PlanRequest:
    return PlanRequest(lengths=lengths, num_gpus=4, gpus_per_node=4, options=SolverOptions(strategy_pool=pool))


# -- the scheme and its strings ------------------------------------------------------------------


def test_scheme_strings_carry_v_only_above_one() -> None:
    assert str(ParallelScheme(2, 4, 1)) == "<2,4,1>"
    assert str(ParallelScheme(2, 4, 1, 3)) == "<2,4,1,3>"
    assert ParallelScheme.parse("<2,4,1,3>") == ParallelScheme(2, 4, 1, 3)
    assert ParallelScheme.parse("<2,4,1,1>") == ParallelScheme.parse("<2,4,1>")
    strategy = parse_strategy("1x<1,2,1,2> + 2x<1,1,1>")
    assert str(strategy) == "1x<1,2,1,2> + 2x<1,1,1>"
    assert strategy.num_gpus == 4  # chunks add no GPUs
    assert reference.canonical_strategy([(1, 2, 1, 2), (1, 1, 1), (1, 1, 1)]) == str(strategy)


def test_bad_chunk_counts_are_refused_naming_the_values() -> None:
    with pytest.raises(ValueError, match="v 2 .*needs pp > 1"):
        ParallelScheme(4, 1, 1, 2)
    with pytest.raises(ValueError, match="v must be a positive integer, got 0"):
        ParallelScheme(1, 2, 1, 0)
    with pytest.raises(ValueError, match="not of the form"):
        ParallelScheme.parse("<1,2,1,2,5>")
    with pytest.raises(ValueError, match=r"12 layers do not split into pp 2 x v 4"):
        CostProfile(num_layers=12, schemes=[SchemeCost(tp=1, pp=2, v=4, a=0, b=1e-5, capacity_tokens=100)])


def test_files_of_plain_schemes_are_unchanged_and_v_round_trips() -> None:
    assert "v" not in json.loads(SchemeModel(tp=1, pp=2, cp=1).model_dump_json())
    assert "v" not in json.loads(_profile(with_interleaved=False).model_dump_json())["schemes"][1]
    dumped = SchemeModel(tp=1, pp=2, cp=1, v=2).model_dump_json()
    assert json.loads(dumped)["v"] == 2
    assert SchemeModel.model_validate_json(dumped).scheme == INTERLEAVED
    old_file = {"num_layers": 8, "schemes": [{"tp": 1, "pp": 2, "a": 0, "b": 1e-5, "capacity_tokens": 9}]}
    assert CostProfile.model_validate(old_file).schemes[0].scheme == ParallelScheme(1, 2, 1)


# -- pricing -------------------------------------------------------------------------------------


def test_a_chunk_entry_prices_the_rank_as_v_chunks() -> None:
    cost = ProfileCostModel(_profile())
    rank = cost.coefficients(INTERLEAVED)
    assert (rank.a, rank.b, rank.c) == pytest.approx((5e-10, 2.2e-5, 1e-3))
    assert cost.capacity_tokens(INTERLEAVED) == 12000
    assert INTERLEAVED not in cost.schemes()  # the search enumerates plain schemes only
    assert cost.knows(INTERLEAVED)
    with pytest.raises(ValueError, match=r"<1,2,1,3> is not in the cost profile \(an interleaved scheme needs"):
        cost.coefficients(ParallelScheme(1, 2, 1, 3))


def test_the_analytic_chunk_adds_one_boundary_transfer_per_extra_chunk() -> None:
    """Rank time per micro-batch = the plain stage's time + (v - 1) boundary transfers; the capacity
    is the least over every rank under the interleaved schedule."""
    model, gpu = get_model("llama3-8b"), get_gpu("h100-sxm-80gb")
    profile = build_profile(model, gpu, 8, 8, virtual_stages=[2])
    plain_only = build_profile(model, gpu, 8, 8)
    assert [e for e in profile.schemes if e.v == 1] == plain_only.schemes
    cost = ProfileCostModel(profile)
    plain, chunked = ParallelScheme(2, 4, 1), ParallelScheme(2, 4, 1, 2)
    hardware = HardwareParams.from_specs(gpu, _analytic_options())
    p2p = pp_comm_s_per_token(model, gpu, plain, 8, hardware)
    latency = 2 * hardware.link_latency(True)  # the activation and its gradient
    assert p2p > 0
    lengths = [4096, 1024]
    extra = cost.stage_time_s(chunked, lengths) - cost.stage_time_s(plain, lengths)
    assert extra == pytest.approx(p2p * sum(lengths) + latency, rel=1e-9)
    entry = next(e for e in profile.schemes if e.scheme == chunked)
    assert entry.in_flight_micro_batches == 2 * 3 + 4 + 1  # rank 0: 2 (pp - 1) + (v - 1) pp + 1
    options_memory = scheme_memory(model, gpu, plain, 8, _analytic_options(), virtual_stages=2)
    assert entry.capacity_tokens == options_memory.capacity_tokens
    assert entry.capacity_tokens < cost.capacity_tokens(plain)  # more activations in flight on rank 0
    assert all(e.pp > 1 and model.num_layers % (e.pp * 2) == 0 for e in profile.schemes if e.v == 2)


def test_several_chunk_counts_each_come_from_the_plain_entries() -> None:
    """`virtual_stages=[2, 4]` adds each v to the plain entries once (v 4 was also added to the v 2
    entries, and the profile refused the duplicates)."""
    model, gpu = get_model("llama3-8b"), get_gpu("h100-sxm-80gb")
    profile = build_profile(model, gpu, 8, 8, virtual_stages=[2, 4])
    keys = [entry.key for entry in profile.schemes]
    assert len(keys) == len(set(keys))
    assert {entry.v for entry in profile.schemes} == {1, 2, 4}
    two = build_profile(model, gpu, 8, 8, virtual_stages=[2])
    assert [e for e in profile.schemes if e.v < 4] == two.schemes


def _analytic_options():
    from hydraplan.cost_models.analytic import AnalyticOptions

    return AnalyticOptions()


def test_the_default_in_flight_count_is_the_fullest_ranks() -> None:
    """Capacity derived from memory uses the peak of the fullest rank; under interleaving it is
    rank 0, the count `pipeline_layout` gives, and every later rank holds less."""
    for pp, v in [(2, 2), (4, 2), (4, 3), (8, 4)]:
        counts = [sum(row) for row in in_flight_micro_batches(pp, v)]
        assert counts == sorted(counts, reverse=True)
        assert reference.in_flight_micro_batches(pp, v) == counts[0] == 2 * (pp - 1) + (v - 1) * pp + 1
    entry = SchemeCost(tp=1, pp=4, v=2, a=0, b=1e-5, static_bytes=1e9, activation_bytes_per_token=1e5)
    profile = CostProfile(num_layers=8, gpu_memory_bytes=2e9, schemes=[entry])
    free = 1e9
    assert ProfileCostModel(profile).capacity_tokens(ParallelScheme(1, 4, 1, 2)) == int(free // (11 * 1e5))
    assert reference.capacity_tokens(profile, entry) == int(free // (11 * 1e5))


# -- plans ---------------------------------------------------------------------------------------


def _pipeline_times(plan: Plan, profile: CostProfile) -> list[float]:
    entries = reference.scheme_entries(profile)
    times = []
    for pipeline in plan.pipelines:
        entry = entries[reference.short_scheme(*pipeline.scheme.scheme.key)]
        stage = [reference.stage_time_s(profile, entry, batch.lengths) for batch in pipeline.micro_batches]
        if entry.v > 1:
            times.append(reference.interleaved_pipeline_time_s(stage, entry.pp, entry.v, entry.fwd_fraction, entry.pp))
        else:
            times.append(reference.pipeline_time_s(stage, entry.pp, entry.fwd_fraction))
    return times


def test_a_pool_of_an_interleaved_strategy_is_planned_priced_and_checked() -> None:
    profile = _profile()
    request = _request(["1x<1,2,1,2> + 2x<1,1,1>"])
    plan = solve(request, profile)
    assert plan.strategy == "1x<1,2,1,2> + 2x<1,1,1>"
    assert check_plan(plan, profile, request) == []
    (interleaved,) = [pipeline for pipeline in plan.pipelines if pipeline.scheme.v == 2]
    assert len(interleaved.micro_batches) % 2 == 0 and interleaved.micro_batches  # groups of pp
    assert interleaved.capacity_tokens == 12000
    assert [p.time_s for p in plan.pipelines] == pytest.approx(_pipeline_times(plan, profile), rel=1e-9)
    assert plan.lower_bound_s <= plan.objective_s
    assert [p["scheme"].get("v", 1) for p in json.loads(plan.model_dump_json())["pipelines"]] == [2, 1, 1]
    assert [c for c in plan.cost_profile.schemes if c.v == 2]  # the entry it was priced with


def test_interleaving_shortens_the_same_pipelines_bubble() -> None:
    """The same batch on one PP-2 pipeline and its interleaved twin whose chunks carry no extra cost:
    the bubble shrinks (Narayanan et al. 2021: by about v)."""
    profile = CostProfile(
        num_layers=8,
        schemes=[
            SchemeCost(tp=1, pp=2, cp=1, a=0, b=2e-5, c=1e-3, capacity_tokens=4000),
            SchemeCost(tp=1, pp=2, cp=1, v=2, a=0, b=1e-5, c=5e-4, capacity_tokens=4000),
        ],
    )
    lengths = [2000] * 8
    request = PlanRequest(lengths=lengths, num_gpus=2, gpus_per_node=2)
    plain = evaluate_strategy(request, profile, parse_strategy("1x<1,2,1>"))
    chunked = evaluate_strategy(request, profile, parse_strategy("1x<1,2,1,2>"))
    assert check_plan(plain, profile) == [] and check_plan(chunked, profile) == []
    stage_s = 2000 * 2e-5 + 1e-3
    assert len(chunked.pipelines[0].micro_batches) % 2 == 0
    m = len(chunked.pipelines[0].micro_batches)
    assert chunked.pipelines[0].time_s == pytest.approx(simulate_interleaved_1f1b([stage_s * 8 / m] * m, 2, 2, 1 / 3))
    assert chunked.step_time_s < plain.step_time_s


def _deep_profile(interleaved_capacity: int = 16384) -> CostProfile:
    """PP 4 on 4 GPUs, bubble-heavy (a large per-micro-batch overhead): plain, and interleaved v 2
    whose chunks each pay a boundary transfer of their own (8 layers: one per chunk)."""
    return CostProfile(
        num_layers=8,
        schemes=[
            SchemeCost(tp=1, pp=4, cp=1, a=0, b=1e-5, c=5e-3, capacity_tokens=16384, grad_bytes_per_gpu=1e8),
            SchemeCost(
                tp=1,
                pp=4,
                cp=1,
                v=2,
                a=0,
                b=0.52e-5,
                c=2.6e-3,
                capacity_tokens=interleaved_capacity,
                grad_bytes_per_gpu=1e8,
            ),
        ],
    )


def test_the_search_chooses_v_where_it_pays_and_the_plan_is_checked_and_verified() -> None:
    """A deep, bubble-heavy pipeline: the search (no pool) runs it interleaved, the checker passes
    the plan, and the bound verifier (`hydraplan check --bound`) proves its bound with its own
    interleaved floors."""
    from hydraplan.planner.verify_bound import verify_bound

    profile = _deep_profile()
    request = PlanRequest(lengths=[4000] * 8, num_gpus=4, gpus_per_node=4)
    plan = solve(request, profile)
    assert plan.strategy == "1x<1,4,1,2>"
    plain = evaluate_strategy(request, profile, parse_strategy("1x<1,4,1>"))
    assert plan.objective_s < plain.objective_s * 0.95
    assert check_plan(plan, profile, request) == []
    verification = verify_bound(plan, profile, request)
    assert verification.ok, verification.violations
    assert plan.lower_bound_s <= plan.objective_s


def test_hydraplan_check_bound_passes_a_searched_interleaved_plan(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    """`hydraplan check plan.json --bound`: exit 0 on the searched interleaved plan, 1 once its
    claimed bound is raised above its own objective."""
    from hydraplan.api.cli import main
    from hydraplan.planner.check import content_plan_id

    profile = _deep_profile()
    request = PlanRequest(lengths=[4000] * 8, num_gpus=4, gpus_per_node=4)
    plan = solve(request, profile)
    assert any(pipeline.scheme.v == 2 for pipeline in plan.pipelines)
    raised = plan.model_copy(update={"lower_bound_s": plan.objective_s * 1.01})
    raised = raised.model_copy(update={"plan_id": content_plan_id(raised)})
    paths = {name: tmp_path / f"{name}.json" for name in ("plan", "profile", "request", "raised")}
    for name, value in (("plan", plan), ("profile", profile), ("request", request), ("raised", raised)):
        paths[name].write_text(value.model_dump_json())
    common = ["--profile", str(paths["profile"]), "--request", str(paths["request"]), "--bound"]
    assert main(["check", str(paths["plan"]), *common]) == 0
    assert "plan OK" in capsys.readouterr().out
    assert main(["check", str(paths["raised"]), *common]) == 1


def test_the_search_stays_plain_where_memory_forbids_interleaving() -> None:
    """The same pipeline, its interleaved entry holding fewer tokens than the longest sequence (more
    micro-batches in flight): the plan runs plain 1F1B, and a profile without interleaved entries
    plans as it always did (no `v` in the plan)."""
    request = PlanRequest(lengths=[5000, *[4000] * 7], num_gpus=4, gpus_per_node=4)
    plan = solve(request, _deep_profile(interleaved_capacity=4500))
    assert plan.strategy == "1x<1,4,1>"
    assert check_plan(plan) == []
    searched = solve(_request(), _profile(with_interleaved=False))
    assert all(pipeline.scheme.v == 1 for pipeline in searched.pipelines)
    assert '"v":' not in searched.model_dump_json()


def test_an_unpriced_or_uncuttable_interleaved_scheme_is_refused() -> None:
    with pytest.raises(PlanningError, match=r"strategy_pool\[0\].*<1,2,1,2> is not in the cost profile"):
        solve(_request(["2x<1,2,1,2>"]), _profile(with_interleaved=False))
    with pytest.raises(PlanningError, match=r"strategy: scheme <1,2,1,2> is not in the cost profile"):
        evaluate_strategy(_request(), _profile(with_interleaved=False), parse_strategy("2x<1,2,1,2>"))


# -- the checker ---------------------------------------------------------------------------------


def _tampered(plan: Plan, index: int, **update) -> Plan:
    pipelines = list(plan.pipelines)
    pipelines[index] = pipelines[index].model_copy(update=update)
    return plan.model_copy(update={"pipelines": pipelines})


def test_the_checker_prices_interleaved_pipelines_by_its_own_reference() -> None:
    profile = _profile()
    plan = solve(_request(["1x<1,2,1,2> + 2x<1,1,1>"]), profile)
    index = next(i for i, p in enumerate(plan.pipelines) if p.scheme.v == 2)
    pipeline = plan.pipelines[index]
    stage = [batch.stage_time_s for batch in pipeline.micro_batches]
    plain_time = simulate_1f1b(stage, 2, 1 / 3)  # what a checker blind to v would compute
    assert plain_time > pipeline.time_s
    violations = check_plan(_tampered(plan, index, time_s=plain_time), profile)
    assert any("simulated interleaved 1F1B (v 2)" in v for v in violations)
    odd = pipeline.micro_batches[:-1]
    violations = check_plan(_tampered(plan, index, micro_batches=odd), profile)
    assert any("interleaved 1F1B with groups of pp 2 needs a multiple" in v for v in violations)
    plain_scheme = SchemeModel(tp=1, pp=2, cp=1)
    violations = check_plan(_tampered(plan, index, scheme=plain_scheme), profile)
    assert violations  # priced as the plain scheme's entry: capacity and times differ


def test_switch_costs_of_chunked_layouts_agree_with_the_reference() -> None:
    """Rank r of <1,2,1,2> holds virtual stages r and r + 2 of 4: from 2x<1,2,1> each GPU lacks half
    of its new shard; from 4x<1,1,1> (whole replicas) none."""
    profile = _profile()
    cost = ProfileCostModel(profile)
    new = [(INTERLEAVED, (0, 1)), (INTERLEAVED, (2, 3))]
    for previous, expected_share in [("2x<1,2,1>", 0.5), ("4x<1,1,1>", 0.0), ("2x<1,2,1,2>", 0.0)]:
        solver = switch_cost_s(parse_strategy(previous), new, cost)
        checked = reference.switch_cost_s(profile, previous, [((1, 2, 1, 2), ranks) for _, ranks in new])
        assert solver == pytest.approx(checked)
        assert solver == pytest.approx(expected_share * 5e8 / 50e9)


# -- the timeline and the command line -----------------------------------------------------------


def test_the_drawn_interleaved_schedule_is_the_simulated_one() -> None:
    times = [3.0, 1.0, 2.0, 2.5]
    blocks = schedule_interleaved_1f1b(times, 2, 2, 0.4)
    assert len(blocks) == 2 * 2 * 2 * len(times)  # forward and backward of every chunk, rank and micro-batch
    assert max(block.end_s for block in blocks) == pytest.approx(simulate_interleaved_1f1b(times, 2, 2, 0.4))
    for rank in (0, 1):
        mine = [block for block in blocks if block.stage == rank]
        assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(mine, mine[1:]))  # one operation at a time


def test_the_command_line_prices_and_plans_interleaved_schemes(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    from hydraplan.api.cli import main

    cluster = ["--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "4", "--gpus-per-node", "4"]
    assert main(["schemes", *cluster, "--virtual-stages", "2"]) == 0
    table = capsys.readouterr().out
    assert "<1,2,1,2>" in table and "<2,2,1,2>" in table and "<4,1,1,2>" not in table
    pool = tmp_path / "pool.txt"
    pool.write_text("1x<2,2,1,2>\n")
    lengths = tmp_path / "lengths.json"
    lengths.write_text(json.dumps([3000, 2500, 2000, 1000, 800, 500, 400, 300]))
    out = tmp_path / "plan.json"
    args = ["plan", *cluster, "--lengths", str(lengths), "--strategy-pool", str(pool), "--out", str(out)]
    assert main(args) == 0
    assert "<2,2,1,2>" in capsys.readouterr().out
    plan = Plan.model_validate_json(out.read_text())
    assert plan.strategy == "1x<2,2,1,2>" and check_plan(plan) == []
    profile_file = tmp_path / "profile.json"
    profile_file.write_text(plan.cost_profile.model_dump_json())
    assert main(["schemes", "--profile", str(profile_file), "--virtual-stages", "2"]) == 2
    assert "--virtual-stages 2 applies to the analytic profile" in capsys.readouterr().err
    # `plan --virtual-stages` offers the interleaved schemes to the search itself (no pool)
    searched = tmp_path / "searched.json"
    assert main(["plan", *cluster, "--lengths", str(lengths), "--virtual-stages", "2", "--out", str(searched)]) == 0
    capsys.readouterr()
    offered = Plan.model_validate_json(searched.read_text())
    assert check_plan(offered) == []
    assert offered.bound_certificate is not None and "<2,2,1,2>" in offered.bound_certificate.schemes
    assert main(["plan", "--profile", str(profile_file), "--lengths", str(lengths), "--virtual-stages", "2"]) == 2
    assert "--virtual-stages 2 applies to the analytic profile" in capsys.readouterr().err


def test_the_measured_interleaved_path_is_the_simulated_schedule() -> None:
    """With each op lasting what the simulator gives it and free transfers, the critical path the
    runtime's timing rebuilds from an interleaved run is the simulated pipeline time."""
    from hydraplan.runtime.step_timing import OpTime, interleaved_critical_path

    times = [3.0, 1.0, 2.0, 2.5, 0.5, 1.5]
    pp, v, fwd = 2, 3, 0.25
    ops = {
        (virtual, is_forward, index): OpTime(model_s=(fwd if is_forward else 1 - fwd) * t / v)
        for virtual in range(pp * v)
        for is_forward in (True, False)
        for index, t in enumerate(times)
    }
    path = interleaved_critical_path(ops, pp, v, len(times))
    assert path.total_s == pytest.approx(simulate_interleaved_1f1b(times, pp, v, fwd))
    assert path.ops[0] == (0, True, 0) and path.model_s == pytest.approx(path.total_s)


@pytest.mark.parametrize(
    ("stages", "chunks", "micro"), [(2, 2, 4), (2, 2, 6), (4, 2, 8), (3, 3, 9), (4, 3, 12), (2, 4, 2)]
)
def test_the_runtime_runs_the_order_the_planner_simulates(stages, chunks, micro) -> None:
    """The runtime's own interleaved order (`runtime.assignment`, written apart from the planner)
    is `planner.simulate.interleaved_operations` with groups of pp, on every rank."""
    from hydraplan.planner.simulate import interleaved_operations
    from hydraplan.runtime.assignment import interleaved_order

    for rank in range(stages):
        assert interleaved_order(rank, stages, chunks, micro) == interleaved_operations(
            rank, stages, chunks, micro, stages
        )


# -- the service ---------------------------------------------------------------------------------


def test_the_service_estimates_and_plans_interleaved_strategies() -> None:
    """A fixed strategy part with v and a pool naming <.,.,.,v> get their schemes priced in the
    analytic profile; a v the model's layers cannot take is a 422 naming the values."""
    from tests.api_support import assert_problem, make_client, plan_body

    with make_client() as client:
        strategy = [{"tp": 2, "pp": 2, "cp": 1, "v": 2, "num_pipelines": 2}]
        response = client.post("/v1/estimate", json=plan_body(strategy=strategy))
        assert response.status_code == 200, response.text
        result = response.json()
        assert result["strategy"] == "2x<2,2,1,2>"
        assert all(p["scheme"]["v"] == 2 and p["num_micro_batches"] % 2 == 0 for p in result["pipelines"])
        assert all(p["peak_memory_bytes"] > 0 for p in result["pipelines"])
        pool = {"time_limit_s": 0.3, "seed": 0, "strategy_pool": ["1x<2,2,1,2> + 2x<2,1,1>"]}
        response = client.post("/v1/plans", json=plan_body(options=pool))
        assert response.status_code == 200, response.text
        assert response.json()["strategy"] == "1x<2,2,1,2> + 2x<2,1,1>"
        bad = [{"tp": 1, "pp": 2, "cp": 1, "v": 3, "num_pipelines": 4}]
        assert_problem(client.post("/v1/estimate", json=plan_body(strategy=bad)), 422, "pp 2 x v 3")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_bounds_stay_below_interleaved_plans(seed: int) -> None:
    """The bound of a pool naming an interleaved scheme holds (its 1F1B bubble floors are not
    priced for it): random batches, checker clean, bound <= objective."""
    import random

    rng = random.Random(seed)
    lengths = [rng.randint(100, 6000) for _ in range(rng.randint(8, 40))]
    profile = _profile()
    request = _request(["1x<1,2,1,2> + 2x<1,1,1>", "2x<1,2,1,2>"], lengths)
    plan = solve(request, profile)
    assert check_plan(plan, profile, request) == []
    assert plan.lower_bound_s <= plan.objective_s * (1 + 1e-9)


def test_every_interleaved_pipeline_gets_pp_sequences_when_the_batch_allows() -> None:
    """Dispatch gives an interleaved pipeline at least pp sequences (it runs a multiple of pp
    micro-batches); with fewer sequences than that in all, the plan is refused with a reason."""
    lengths = [9000, 8500, 120, 80]  # greedy alone would put both long ones apart with one short each
    for plan in (
        solve(_request(["2x<1,2,1,2>"], lengths), _profile()),
        evaluate_strategy(_request(None, lengths), _profile(), parse_strategy("2x<1,2,1,2>")),
    ):
        assert [len(p.micro_batches) for p in plan.pipelines] == [2, 2]
        assert check_plan(plan) == []
    with pytest.raises(PlanningError, match="cannot hold the 3 sequences"):
        evaluate_strategy(_request(None, lengths[:3]), _profile(), parse_strategy("2x<1,2,1,2>"))


def test_the_bound_verifier_checks_interleaved_schemes_with_its_own_floors() -> None:
    """The verifier prices an interleaved scheme by its own fill-and-drain floor: pools and searches
    over a profile holding one verify, and a claim above the plan fails naming the part."""
    from hydraplan.planner.verify_bound import verify_bound

    profile = _profile()
    for pool in (["1x<1,2,1,2> + 2x<1,1,1>"], None):
        request = _request(pool)
        plan = solve(request, profile)
        assert check_plan(plan, profile, request) == []
        result = verify_bound(plan, profile, request)
        assert result.verified_bound_s <= plan.objective_s * (1 + 1e-9)
        assert not any("interleaved" in violation for violation in result.violations)
        raised = plan.model_copy(update={"lower_bound_s": plan.objective_s * 1.01})
        assert not verify_bound(raised, profile, request).ok
