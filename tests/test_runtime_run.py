"""Heterogeneous plans executed on 4 gloo ranks equal one process (one launch, several scenarios).

Starting torch ranks is slow here, so one `run_ranks` call runs every scenario on the same ranks
(each builds its own groups, as a new strategy would) and returns what every rank holds; the tests
compare it with the single-process run (`runtime.equivalence`) and drive `hydraplan run` with those
reports (its launch replaced by them) for the CLI's check, summary and report. The scenarios
include the online mode: each step planned on rank 0 by the real planning service (a session of
the FastAPI app served in this process, whose first answer is a 503 + Retry-After) or by the local
planner. Apart from it: one 8-rank launch (TP, PP and CP in one plan), and the faults that end a
launch (a rank that exits, a rank that hangs), on 2 ranks each.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import replace

import pytest

from tests.runtime_plans import MINI_MODEL, FailingPlanner, fixed_plan, tiny_profile, write_models_file
from tests.runtime_support import assert_nccl_safe, require_torch

torch = require_torch()

from hydraplan.api.cli import main  # noqa: E402
from hydraplan.api.cli.run_planning import LocalPlanner, SessionPlanner, SyntheticLengths, open_session  # noqa: E402
from hydraplan.planner.schemas import Plan, SolverOptions  # noqa: E402
from hydraplan.runtime import launch  # noqa: E402
from hydraplan.runtime.assignment import PlanRefusedError  # noqa: E402
from hydraplan.runtime.cpu_allocator import MMAP_THRESHOLD_BYTES  # noqa: E402
from hydraplan.runtime.equivalence import check_run, compare_with_reference, single_process_run  # noqa: E402
from hydraplan.runtime.plan_feed import PlanSourceError  # noqa: E402
from hydraplan.runtime.worker import NonFiniteLossError, RunSpec, run_worker  # noqa: E402
from tests.runtime_service import TOKEN, running_service  # noqa: E402

pytestmark = pytest.mark.runtime

LENGTHS = [5, 9, 2, 7, 12, 30, 8, 4, 11]  # sequence 5 (30 tokens) is split at the capacity of 24
STRATEGIES = {"tp_pp": "1x<2,1,1> + 1x<1,2,1>", "cp_dp": "1x<1,1,2> + 2x<1,1,1>"}


# a 3-step run switching strategy every step, each step its own batch
SWITCHES = (("tp_pp", (6, 3, 14, 9, 27, 5)), ("cp_dp", (8, 2, 11, 20, 7, 4, 9)), ("tp_pp", tuple(LENGTHS)))


@functools.cache
def plan_of(name: str, lengths: tuple[int, ...] = tuple(LENGTHS), previous: str | None = None):
    """One plan per strategy and batch for the whole module (a plan records its solve time: made once)."""
    previous_strategy = STRATEGIES[previous] if previous else None
    return fixed_plan(STRATEGIES[name], list(lengths), 4, model=MINI_MODEL["name"], previous=previous_strategy)


def switch_plans() -> list:
    """The plans of the switching run, each planned with the previous step's strategy."""
    names = [None] + [name for name, _ in SWITCHES]
    return [plan_of(name, lengths, previous) for (name, lengths), previous in zip(SWITCHES, names)]


def switch_spec(models_file: str, dtype: str = "float64") -> RunSpec:
    plan_jsons = tuple(plan.model_dump_json() for plan in switch_plans())
    return RunSpec(
        plan_jsons=plan_jsons, steps=len(plan_jsons), dtype=dtype, collect_state=True, models_file=models_file
    )


# online: 3 steps of 5 synthetic sequences up to 100 tokens (capacity 24: the long ones are split);
# the planner picks 1x<2,1,2> for step 0's batch, 2x<2,1,1> for step 1's and 1x<2,1,2> again for
# step 2's: both layouts give rank r TP half r % 2 of every layer, so each switch is free
ONLINE_LENGTHS = SyntheticLengths(num_sequences=5, max_length=100, seed=0)
ONLINE_OPTIONS = {"time_limit_s": 1.0, "seed": 0, "oversize": "split"}
LOOP_SLOWDOWN = 2.0


def mini_profile():
    return tiny_profile(model=MINI_MODEL["name"], num_layers=MINI_MODEL["num_layers"])


def service_planner(url: str) -> SessionPlanner:
    """A new session of the test service for the 4-GPU cluster of the mini model."""
    body = {"num_gpus": 4, "gpus_per_node": 4, "profile": mini_profile().model_dump(mode="json")}
    return open_session(SessionPlanner(url, "", token=TOKEN, max_retries=3), {**body, "options": ONLINE_OPTIONS})


def specs(models_file: str, service_url: str, loop_url: str) -> dict[str, RunSpec]:
    def spec(name: str, **options) -> RunSpec:
        return RunSpec(plan_json=plan_of(name).model_dump_json(), models_file=models_file, **options)

    def online(planner) -> RunSpec:
        return RunSpec(
            steps=3,
            dtype="float64",
            collect_state=True,
            models_file=models_file,
            planner=planner,
            next_lengths=ONLINE_LENGTHS,
        )

    local = LocalPlanner(mini_profile().model_dump_json(), 4, 4, SolverOptions(**ONLINE_OPTIONS).model_dump_json())
    two_gpus = fixed_plan("2x<1,1,1>", LENGTHS, 2, model=MINI_MODEL["name"])

    return {
        "tp_pp": spec("tp_pp", steps=3, dtype="float64", collect_state=True),
        "cp_dp": spec("cp_dp", steps=3, dtype="float64", collect_state=True),
        "tp_pp_float32": spec("tp_pp", steps=1, dtype="float32", collect_state=True),
        "cp_dp_float32": spec("cp_dp", steps=1, dtype="float32", collect_state=True),
        "nan": spec("tp_pp", steps=3, dtype="float64", inject_nan_step=1),
        "switch": switch_spec(models_file),
        "online_server": online(service_planner(service_url)),
        "online_local": online(local),
        "online_fails": RunSpec(
            steps=3, models_file=models_file, planner=FailingPlanner(local), next_lengths=ONLINE_LENGTHS
        ),
        "world_size": RunSpec(plan_json=two_gpus.model_dump_json(), models_file=models_file),
        # the closed loop: each step's measurements posted to the session, rank 1 twice as slow from step 1
        "online_loop": replace(
            online(service_planner(loop_url)), post_measurements=True, slowdowns=((1, 1, LOOP_SLOWDOWN),)
        ),
    }


def scenarios(rank: int, world_size: int, all_specs: dict[str, RunSpec]) -> dict:
    results = {}
    for name, spec in all_specs.items():
        try:
            results[name] = run_worker(rank, world_size, spec)
        except NonFiniteLossError as exc:
            results[name] = {"stopped": str(exc)}
        except PlanRefusedError as exc:
            results[name] = {"refused": str(exc)}
        except PlanSourceError as exc:
            results[name] = {"no_plan": str(exc)}
    return results


@pytest.fixture(scope="module")
def models_file(tmp_path_factory) -> str:
    return write_models_file(tmp_path_factory.mktemp("models") / "models.json")


@pytest.fixture(scope="module")
def service():
    with running_service(shed=1) as running:
        yield running


@pytest.fixture(scope="module")
def loop_service():
    """A service of its own for the closed loop (the 503 shim's counts stay the other runs')."""
    with running_service(shed=0) as running:
        yield running


@pytest.fixture(scope="module")
def ranks(models_file, service, loop_service) -> tuple[dict[str, RunSpec], list[dict]]:
    all_specs = specs(models_file, service.url, loop_service.url)
    return all_specs, launch.run_ranks(scenarios, 4, args=(all_specs,), timeout_s=600.0)


def reports_of(ranks, name: str) -> list[dict]:
    return [rank_results[name] for rank_results in ranks[1]]


@pytest.mark.parametrize("name", ["tp_pp", "cp_dp"])
def test_float64_three_steps_equal_one_process(ranks, name):
    spec = ranks[0][name]
    reports = reports_of(ranks, name)
    reference = single_process_run(plan_of(name), spec)
    result = compare_with_reference(reports, reference, "float64")
    assert result.passed, result
    assert result.max_loss_rel <= 1e-9 and result.max_param_rel <= 1e-9
    # the run trained: parameters moved by far more than the tolerance, losses changed
    initial = initial_parameters(name, spec)
    moved = max(
        float((shard - piece(initial[n], report["boxes"][n])).abs().max())
        for report in reports
        for n, shard in report["params"].items()
    )
    assert moved > 1e-4
    losses = [step["loss"] for step in reports[0]["steps"]]
    assert len(set(losses)) == 3
    assert all(report["steps"][-1]["loss"] == losses[-1] for report in reports)


def piece(full, box):
    for dim, (start, stop) in enumerate(box):
        full = full.narrow(dim, start, stop - start)
    return full


def initial_parameters(name: str, spec: RunSpec) -> dict:
    """The whole model's initial parameters (the ranks' shards start as their slices)."""
    from hydraplan.runtime.assignment import model_config_for
    from hydraplan.runtime.model import build_stage

    cfg = model_config_for(plan_of(name), spec.models_file)
    stage = build_stage(cfg, seed=spec.init_seed, dtype=torch.float64)
    return {n: p.detach() for n, p in stage.named_parameters()}


@pytest.mark.parametrize("name", ["tp_pp_float32", "cp_dp_float32"])
def test_float32_first_step_gradients_within_1e_5_of_their_norm(ranks, name):
    spec = ranks[0][name]
    plan = plan_of(name.removesuffix("_float32"))
    result = compare_with_reference(reports_of(ranks, name), single_process_run(plan, spec), "float32")
    assert result.passed and result.max_grad_rel_to_norm <= 1e-5, result


def test_three_steps_switching_strategy_every_step_equal_one_process(ranks):
    spec = ranks[0]["switch"]
    reports = reports_of(ranks, "switch")
    result = compare_with_reference(reports, single_process_run(plan_of("tp_pp"), spec), "float64")
    assert result.passed and result.max_param_rel <= 1e-9 and result.max_loss_rel <= 1e-9, result
    assert [report["scheme"] for report in reports] == ["<2,1,1>", "<2,1,1>", "<1,2,1>", "<1,2,1>"]
    for report in reports:
        assert report["steps"][0]["switch"] is None
        assert all(step["switch"]["seconds"] > 0 for step in report["steps"][1:])
    # <2,1,1> + <1,2,1> -> <1,1,2> + 2x<1,1,1>: every rank now holds the whole model and receives
    # exactly what it lacked (parameter and two AdamW moments, 8 bytes each), nothing more
    whole = sum(p.numel() for p in reports_of(ranks, "cp_dp")[0]["params"].values())
    held_before = [sum(p.numel() for p in report["params"].values()) for report in reports_of(ranks, "tp_pp")]
    sent = sum(report["steps"][1]["switch"]["sent_bytes"] for report in reports)
    assert sent == sum(3 * 8 * (whole - held) for held in held_before) > 0
    # and back: every rank held everything, so each keeps its new slice and nothing travels
    assert [report["steps"][2]["switch"]["sent_bytes"] for report in reports] == [0, 0, 0, 0]
    # what one rank sends another receives
    assert sent == sum(report["steps"][1]["switch"]["received_bytes"] for report in reports)
    # the planner prices the first switch and, like the runtime, sees nothing to load in the second
    assert [plan.switch_cost_s > 0 for plan in switch_plans()[1:]] == [True, False]
    assert reports[0]["steps"][1]["switch"]["planned_switch_cost_s"] == switch_plans()[1].switch_cost_s
    assert all(
        step["switch"]["weight_bytes"] * 3 == step["switch"]["sent_bytes"] for r in reports for step in r["steps"][1:]
    )


def test_a_cut_sequence_never_passes_as_the_uncut_one(ranks):
    """Sequence 5 (30 tokens) is trained as chunks of 24 and 6: against the uncut batch (the
    oracle's default) the run differs; the cut passes only because the plan allows it (the user's
    `--oversize split`), and the check says so."""
    spec = ranks[0]["tp_pp"]
    reports, plan = reports_of(ranks, "tp_pp"), plan_of("tp_pp")
    uncut = compare_with_reference(reports, single_process_run(plan, spec, uncut=True), "float64")
    assert not uncut.passed and uncut.max_loss_rel > 1e-9, uncut
    allowed = check_run(plan, spec, reports)
    assert allowed["passed"] and allowed["cuts"] == {  # 3 steps of the same plan
        "sequences": 3,
        "chunks": 6,
        "tokens_without_context": 18,
        "allowed": True,
        "uncut_max_loss_rel": uncut.max_loss_rel,
        "uncut_passed": False,
    }
    not_allowed = plan.model_copy(update={"split_sequence_ids": []})  # a cut the user did not ask for
    spec = replace(spec, plan_json=not_allowed.model_dump_json())
    refused = check_run(not_allowed, spec, reports)
    assert not refused["passed"] and refused["cuts"]["allowed"] is False


def test_online_mode_refuses_oversize_sequences_by_default():
    from hydraplan.api.cli import build_parser

    assert build_parser().parse_args(["run", "--nproc", "2"]).oversize == "error"


def test_a_wrong_shard_fails_the_check(ranks):
    spec = ranks[0]["tp_pp"]
    reports = [dict(report) for report in reports_of(ranks, "tp_pp")]
    reports[2] = dict(reports[2], params=dict(reports[2]["params"]))
    name = "layers.0.attn.wq.weight"
    reports[2]["params"][name] = reports[2]["params"][name] + 1e-7
    result = compare_with_reference(reports, single_process_run(plan_of("tp_pp"), spec), "float64")
    assert not result.passed and result.worst_param == f"rank 2 {name}"


def test_layouts_and_sync_groups(ranks):
    tp_pp = reports_of(ranks, "tp_pp")
    assert [(r["scheme"], r["stage"], r["tp_rank"]) for r in tp_pp] == [
        ("<2,1,1>", 0, 0),
        ("<2,1,1>", 0, 1),
        ("<1,2,1>", 0, 0),
        ("<1,2,1>", 1, 0),
    ]
    # TP rank 1 holds rows [16, 32) of wq; the <1,2,1> pipeline's stage 1 holds layer 1 whole
    assert tp_pp[1]["boxes"]["layers.0.attn.wq.weight"] == ((16, 32), (0, 32))
    assert "layers.0.attn.wq.weight" not in tp_pp[3]["boxes"]
    assert tp_pp[3]["boxes"]["layers.1.attn.wq.weight"] == ((0, 32), (0, 32))
    # every element a rank holds is synchronised once: the buckets cover its shard exactly
    for report in tp_pp:
        held = sum(p.numel() for p in report["params"].values())
        assert report["steps"][0]["sync"]["elements"] == held
    cp_dp = reports_of(ranks, "cp_dp")
    assert all(r["num_sync_groups"] == 1 for r in cp_dp)  # every rank holds the whole model: one group
    assert cp_dp[0]["planned_sync"]["replicas"] == 4


def test_cpu_ranks_train_on_the_heap_the_profile_was_measured_on(ranks):
    """The profiler measures memory with glibc's mmap threshold pinned; so must the ranks train
    (`runtime.cpu_allocator`), or the promised peak is not theirs."""
    for name in ("tp_pp", "cp_dp", "switch"):
        assert {r["cpu_mmap_threshold"] for r in reports_of(ranks, name)} == {MMAP_THRESHOLD_BYTES}, name


def test_cpu_ranks_report_the_steps_peak_memory(ranks):
    """On the pinned heap a CPU rank's step peak is the planner's kind of figure: the stage's static
    bytes (weights, gradients, Adam's moments) plus what the step added; below the process's size."""
    for report in reports_of(ranks, "tp_pp"):
        static = sum(p.numel() for p in report["params"].values()) * 8 * 4  # float64, 4 copies
        for step in report["steps"]:
            assert static < step["peak_memory_bytes"] < static + 2e9, (report["rank"], step["peak_memory_bytes"])


def test_every_schedule_the_ranks_ran_is_nccl_safe(ranks):
    """The point-to-point batches every rank posted, step by step, in every scenario that ran steps
    (plans planned ahead, switches, online plans), complete under NCCL's semantics."""
    checked = 0
    for name in ranks[0]:
        reports = reports_of(ranks, name)
        if all("steps" in report for report in reports):
            checked += assert_nccl_safe(reports)
    assert checked > 0  # the PP pipelines exchanged activations and gradients


def test_the_gradient_sync_starts_every_bucket_during_the_last_backward(ranks):
    """Overlap: each bucket's all-reduce starts (async) once backward has finished its gradients;
    the float64 equivalence above holds with it."""
    for name in ("tp_pp", "cp_dp", "switch"):
        for report in reports_of(ranks, name):
            for step in report["steps"]:
                sync = step["sync"]
                assert sync["num_buckets"] >= 2 and sync["num_started_in_backward"] == sync["num_buckets"], sync


def test_micro_batches_ran_in_the_1f1b_order(ranks):
    from hydraplan.runtime.assignment import assign_ranks, one_f_one_b

    for assignment, report in zip(assign_ranks(plan_of("tp_pp")), reports_of(ranks, "tp_pp")):
        ops = [(op["op"] == "F", op["micro_batch"]) for op in report["steps"][0]["ops"]]
        assert ops == one_f_one_b(assignment.stage, assignment.scheme.pp, len(assignment.micro_batches))
        if assignment.scheme.pp == 2:
            assert report["steps"][0]["p2p_sent_bytes"] > 0
    # the measured critical path: at least the busiest rank's own work, at most all ranks' work in a row
    from hydraplan.runtime.timeline import pipeline_critical_paths_s

    reports = reports_of(ranks, "tp_pp")
    paths = pipeline_critical_paths_s(reports, 0)
    for index, path in paths.items():
        mine = [sum(op["cpu_s"] for op in r["steps"][0]["ops"]) for r in reports if r["pipeline"] == index]
        assert max(mine) <= path + 1e-12 and path <= sum(mine) + 1e-12


def test_a_nan_loss_stops_every_rank_with_the_step_number(ranks):
    assert [report["stopped"] for report in reports_of(ranks, "nan")] == [
        "step 1: the loss is nan (stopped before the optimizer step)"
    ] * 4


# ---------------------------------------------------------------------------------------------
# hydraplan run: the CLI around the same worker (its launch replaced by the reports above)
# ---------------------------------------------------------------------------------------------


def write_plan(tmp_path, plan) -> str:
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json(), encoding="utf-8")
    return str(path)


def test_cli_run_check_and_report(ranks, models_file, tmp_path, monkeypatch, capsys):
    calls = []

    def fake_run_ranks(fn, nproc, *, backend, args, timeout_s, stall_timeout_s, on_progress=None):
        calls.append((fn, nproc, backend, args[0], stall_timeout_s))
        return reports_of(ranks, "tp_pp")

    monkeypatch.setattr(launch, "run_ranks", fake_run_ranks)
    plan_path, report_path = write_plan(tmp_path, plan_of("tp_pp")), tmp_path / "report.json"
    argv = ["run", "--plan", plan_path, "--models-file", models_file, "--steps", "3", "--dtype", "float64"]
    code = main([*argv, "--check", "--report", str(report_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert calls[0][0] is run_worker and calls[0][1:3] == (4, "gloo") and calls[0][4] == 60.0
    assert calls[0][3] == ranks[0]["tp_pp"]  # the CLI's spec is the one the scenario ran
    assert "check (float64) PASSED" in out and "  step 2 (1x<2,1,1> + 1x<1,2,1>, 9 sequences): loss" in out
    assert "pipeline 1 <1,2,1>: planned" in out and "TP/CP collectives" in out
    assert "predictions from the user profile of rt-mini" in out
    document = json.loads(report_path.read_text())
    assert document["check"]["passed"] and len(document["ranks"]) == 4
    assert len(document["critical_path_s"]) == 3 and sorted(document["critical_path_s"][0]) == ["0", "1"]
    assert "params" not in document["ranks"][0] and document["ranks"][0]["steps"][0]["sync"]["elements"] > 0


def test_cli_run_plans_one_per_step(ranks, models_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(launch, "run_ranks", lambda fn, nproc, **kwargs: reports_of(ranks, "switch"))
    directory = tmp_path / "plans"
    directory.mkdir()
    for index, plan in enumerate(switch_plans()):
        (directory / f"step-{index:02d}.json").write_text(plan.model_dump_json(), encoding="utf-8")
    argv = ["run", "--plans", str(directory), "--models-file", models_file, "--dtype", "float64", "--check"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("strategy switch before it") == 2 and "check (float64) PASSED" in out
    assert main([*argv, "--steps", "2"]) == 2
    assert "--steps 2: with --plans, every plan is one step" in capsys.readouterr().err
    assert main(["run", "--plans", str(tmp_path / "none"), "--models-file", models_file]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_cli_run_refuses_before_any_rank_starts(ranks, models_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(launch, "run_ranks", lambda *a, **k: pytest.fail("a refused plan must start no rank"))
    plan = plan_of("tp_pp")
    plan_path = write_plan(tmp_path, plan)
    assert main(["run", "--plan", plan_path, "--models-file", models_file, "--nproc", "3"]) == 2
    assert capsys.readouterr().err == "hydraplan: error: the plan has 4 ranks but the world size is 3\n"
    assert main(["run", "--plan", plan_path]) == 2  # rt-mini is not in the bundled catalog
    assert "the plan's model 'rt-mini' cannot be built" in capsys.readouterr().err
    pipelines = list(plan.pipelines)
    pipelines[1] = pipelines[1].model_copy(update={"ranks": [3, 2]})
    broken = write_plan(tmp_path, plan.model_copy(update={"pipelines": pipelines}))
    assert main(["run", "--plan", broken, "--models-file", models_file]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hydraplan: error: the plan fails the checker: pipeline 1") and err.count("\n") == 1


def test_cli_run_names_a_failed_rank(models_file, tmp_path, monkeypatch, capsys):
    def failing(*args, **kwargs):
        raise launch.RankFailedError(2, "RuntimeError: connection reset")

    monkeypatch.setattr(launch, "run_ranks", failing)
    assert main(["run", "--plan", write_plan(tmp_path, plan_of("tp_pp")), "--models-file", models_file]) == 1
    assert capsys.readouterr().err == "hydraplan: error: rank 2 failed: RuntimeError: connection reset\n"


# ---------------------------------------------------------------------------------------------
# online: rank 0 plans each step (the service's session, or the local planner), every rank runs it
# ---------------------------------------------------------------------------------------------


def online_plans(ranks, name: str) -> list[Plan]:
    return [Plan.model_validate_json(text) for text in reports_of(ranks, name)[0]["plan_jsons"]]


def checked_online(ranks, name: str):
    """The online run against one process on the plans rank 0 was given."""
    import dataclasses

    texts = tuple(reports_of(ranks, name)[0]["plan_jsons"])
    spec = dataclasses.replace(ranks[0][name], planner=None, next_lengths=None, plan_jsons=texts)
    return compare_with_reference(reports_of(ranks, name), single_process_run(None, spec), "float64")


@pytest.mark.parametrize("name", ["online_server", "online_local"])
def test_online_every_step_planned_on_rank_0_equals_one_process(ranks, name):
    plans = online_plans(ranks, name)
    assert [plan.input_lengths for plan in plans] == [ONLINE_LENGTHS(step) for step in range(3)]
    # each step was planned with the previous step's strategy as its switch context
    assert plans[0].previous_strategy is None
    assert [plan.previous_strategy for plan in plans[1:]] == [plan.strategy for plan in plans[:-1]]
    reports = reports_of(ranks, name)
    assert all("plan_jsons" not in report for report in reports[1:])  # rank 0 alone was asked
    assert [len(report["steps"]) for report in reports] == [3] * 4
    for step, plan in enumerate(plans):  # every rank ran the broadcast plan of its step
        assert all(report["steps"][step]["global_tokens"] == sum(plan.input_lengths) for report in reports)
    # the strategy switched as the planner decided, and the ranks re-sharded exactly there; every
    # rank kept its TP half of every layer, so the planner priced nothing and nothing travelled
    assert [plan.strategy for plan in plans] == ["1x<2,1,2>", "2x<2,1,1>", "1x<2,1,2>"]
    assert [plan.switch_cost_s for plan in plans] == [0.0, 0.0, 0.0]
    assert all([step["switch"] is not None for step in report["steps"]] == [False, True, True] for report in reports)
    assert all(report["steps"][step]["switch"]["sent_bytes"] == 0 for report in reports for step in (1, 2))
    result = checked_online(ranks, name)
    assert result.passed and result.max_loss_rel <= 1e-9 and result.max_param_rel <= 1e-9, result


def test_online_loop_posts_each_steps_measurements_and_plans_with_the_next_version(ranks, loop_service):
    """Rank 0 posted every step's measurements to the session; each plan names the profile
    version it was made with, one newer per step; the slowdown hook ran where it was asked and
    changed nothing but time (the run still equals one process)."""
    from hydraplan.api.client import Client, Session

    plans = online_plans(ranks, "online_loop")
    assert [plan.session_feedback.profile_version for plan in plans] == [0, 1, 2]
    loop = reports_of(ranks, "online_loop")[0]["loop"]
    assert [entry["posted"] for entry in loop] == [True] * 3, loop
    assert [(entry["step"], entry["profile_version"], entry["fit_version"]) for entry in loop] == [
        (0, 0, 1),
        (1, 1, 2),
        (2, 2, 3),
    ]
    assert all(entry["median_error"] > 0 and entry["num_micro_batches"] >= 1 for entry in loop)
    session_id = ranks[0]["online_loop"].planner.session_id
    with Client(loop_service.url, token=TOKEN) as client:
        fit = Session(client, session_id).view()["fit"]
    assert (fit["version"], fit["num_steps"]) == (3, 3)
    assert [error["profile_version"] for error in fit["errors"]] == [0, 1, 2]
    slowdowns = [[step["slowdown"] for step in report["steps"]] for report in reports_of(ranks, "online_loop")]
    assert slowdowns == [[1.0] * 3, [1.0, LOOP_SLOWDOWN, LOOP_SLOWDOWN], [1.0] * 3, [1.0] * 3]
    result = checked_online(ranks, "online_loop")
    assert result.passed and result.max_loss_rel <= 1e-9 and result.max_param_rel <= 1e-9, result


def test_online_waits_out_the_services_503(ranks, service):
    shim = service.shim
    assert shim.answered_503 == 1
    # the first step's request was shed, the retry came after the Retry-After (1 s): 3 plans, 4 requests
    assert len(shim.plan_requests) == 4
    assert shim.plan_requests[1] - shim.plan_requests[0] >= 0.9
    assert online_plans(ranks, "online_server")[0].input_lengths == ONLINE_LENGTHS(0)


def test_a_plan_for_another_world_size_is_refused_on_every_rank_before_compute(ranks):
    assert [report["refused"] for report in reports_of(ranks, "world_size")] == [
        "the plan has 2 ranks but the world size is 4"
    ] * 4


def test_cli_run_online_through_the_server(ranks, models_file, service, tmp_path, monkeypatch, capsys):
    import httpx

    given = []

    def fake_run_ranks(fn, nproc, *, backend, args, timeout_s, stall_timeout_s, on_progress=None):
        given.append(args[0])
        session_view = httpx.get(
            f"{service.url}/v1/sessions/{args[0].planner.session_id}", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert session_view.status_code == 200  # opened before the ranks start
        return reports_of(ranks, "online_server")

    monkeypatch.setattr(launch, "run_ranks", fake_run_ranks)
    profile_path = tmp_path / "profile.json"
    profile_path.write_text(mini_profile().model_dump_json(), encoding="utf-8")
    argv = ["run", "--server", service.url, "--token", TOKEN, "--nproc", "4", "--profile", str(profile_path)]
    argv += ["--models-file", models_file, "--steps", "3", "--dtype", "float64", "--check"]
    argv += ["--batch-sequences", "5", "--max-length", "100", "--data-seed", "0", "--plan-time-limit-s", "1"]
    argv += ["--oversize", "split"]  # the user allows cuts (the default refuses them)
    assert main([*argv, "--report", str(tmp_path / "run.json")]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "check (float64) PASSED against the batch as cut (allowed)" in out
    assert "  step 2 (1x<2,1,2>, 5 sequences): loss" in out
    cut = r"\n  \d+ sequence\(s\) in 3 step\(s\) trained as \d+ chunks \(allowed by --oversize split\): [\d,]+ tokens"
    assert re.search(cut, out), out
    # every step's strategy, not only the first one's
    assert out.count("strategy switch before it") == 2 and out.startswith(
        "ran 3 step(s) on 4 ranks: 1x<2,1,2> (step 0), 2x<2,1,1> (step 1), 1x<2,1,2> (step 2)\n"
    )
    spec = given[0]
    assert spec.next_lengths == ONLINE_LENGTHS and spec.steps == 3 and spec.planner.max_retries == 5
    # the session is deleted when the run ends
    gone = httpx.get(
        f"{service.url}/v1/sessions/{spec.planner.session_id}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert gone.status_code == 404
    document = json.loads((tmp_path / "run.json").read_text())
    assert document["check"]["passed"] and "plan_jsons" not in document["ranks"][0]


def test_cli_run_online_refusals_are_one_line_before_any_rank(models_file, service, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(launch, "run_ranks", lambda *a, **k: pytest.fail("a refused run must start no rank"))
    profile_path = tmp_path / "profile.json"
    profile_path.write_text(mini_profile().model_dump_json(), encoding="utf-8")
    base = [
        "run",
        "--server",
        service.url,
        "--nproc",
        "4",
        "--profile",
        str(profile_path),
        "--models-file",
        models_file,
    ]
    assert main([*base, "--token", "wrong"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hydraplan: error: --server {service.url}: 401") and err.count("\n") == 1
    assert main([*base, "--token", TOKEN, "--gpus-per-node", "3"]) == 2  # the service refuses the cluster
    err = capsys.readouterr().err
    assert err.startswith(f"hydraplan: error: --server {service.url}: 422") and "gpus_per_node" in err
    assert err.count("\n") == 1
    nowhere = ["run", "--server", "http://127.0.0.1:9", "--nproc", "4", "--profile", str(profile_path)]
    assert main([*nowhere, "--models-file", models_file]) == 2
    assert "--server http://127.0.0.1:9: no answer" in capsys.readouterr().err
    assert main(["run", "--nproc", "4", "--profile", str(profile_path)]) == 2  # rt-mini needs --models-file
    err = capsys.readouterr().err
    assert err.startswith(f"hydraplan: error: --profile {profile_path}: its model 'rt-mini' cannot be built")
    assert err.count("\n") == 1
    assert main(["run", "--steps", "2"]) == 2  # the local planner needs the rank count
    assert (
        capsys.readouterr().err == "hydraplan: error: --nproc: required when each step is planned (no --plan/--plans)\n"
    )


def test_a_planner_failing_mid_run_stops_every_rank_with_its_line(ranks):
    """Rank 0 broadcasts why it has no plan for step 1: every rank raises that line, none hangs."""
    assert [report["no_plan"] for report in reports_of(ranks, "online_fails")] == [
        "step 1: no plan: RuntimeError: 422 from the test planner"
    ] * 4
