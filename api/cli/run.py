"""`hydraplan run`: execute a plan (`--plan`, for `--steps` steps) or one plan per step (`--plans
DIR`, strategy switches between them) on local torch ranks, optionally checking against one process.
Without either, rank 0 plans every step, through a `--server` session or locally
(`api.cli.run_online`).

The plan is read and refused here before any rank starts (the checker, the rank count against
`--nproc`, the model the runtime must build): one line, exit 2. The ranks run
`hydraplan.runtime.worker.run_worker` (spawned by `runtime.launch.run_ranks`; the same worker runs
under torchrun). A rank that fails or a run past `--timeout-s` prints one line naming the rank and
exits 1; so does a `--check` whose differences exceed the tolerances. While the ranks run, each
step prints one progress line on standard error and the run ends with the plans' predicted step
time against the measured one (`api.cli.run_progress`; by default on a terminal only). torch and
the runtime are imported only inside the command function: the rest of the CLI never needs them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hydraplan.api.cli.args import add_progress_option, non_negative_int, positive_float, positive_int
from hydraplan.api.cli.progress import PROG, PROGRESS_MIN_S, Progress
from hydraplan.api.cli.run_online import add_online_arguments, add_server_argument
from hydraplan.api.files import read_plan

EXIT_OK, EXIT_RUN_FAILED = 0, 1
RUNTIME_MISSING = "the runtime extra is not installed: pip install 'hydraplan[runtime]' (torch==2.13.0)"


def run_run(args: argparse.Namespace) -> int:
    """`hydraplan run`: see the module docstring."""
    _require_runtime()
    if args.plan is None and args.plans is None:
        return _run_online(args)
    plans = _read_plans(args)
    plan = plans[0]
    from hydraplan.runtime.assignment import model_config_for, validate_plan
    from hydraplan.runtime.launch import check_backend

    nproc = plan.num_gpus if args.nproc is None else args.nproc
    check_backend(args.backend, nproc)
    cfg = model_config_for(plan, args.models_file)
    for step_plan in plans:
        validate_plan(step_plan, nproc, cfg)
    from hydraplan.runtime.run_io import resolve_run_io
    from hydraplan.runtime.worker import RunSpec

    _refuse_check_after_load(args)
    step_plans = plans if args.plans else plans * args.steps
    run_io = resolve_run_io(
        step_plans, cfg, args.dtype, data=args.data, data_start=args.data_start, save=args.save, load=args.load
    )

    spec = RunSpec(
        plan_json=plan.model_dump_json(),
        plan_jsons=tuple(step_plan.model_dump_json() for step_plan in plans) if args.plans else (),
        steps=len(plans) if args.plans else args.steps,
        **_training_fields(args),
        **run_io,
    )
    reports = _launch(args, spec, nproc, step_plans)
    if reports is None:
        return EXIT_RUN_FAILED
    return _finish(args, plans, spec, reports)


def _require_runtime() -> None:
    """One line (exit 2) when torch or the runtime cannot be imported, before anything else."""
    try:
        import hydraplan.runtime.worker  # noqa: F401  (imports torch)
    except ImportError as exc:
        raise ValueError(f"{RUNTIME_MISSING} ({exc})") from None


def _training_fields(args: argparse.Namespace) -> dict:
    """The `RunSpec` fields every run takes from its flags alike, planned ahead or step by step."""
    return {
        "dtype": args.dtype,
        "lr": args.lr,
        "init_seed": args.seed,
        "data_seed": args.data_seed,
        "collect_state": args.check,
        "models_file": args.models_file,
    }


def _refuse_check_after_load(args: argparse.Namespace) -> None:
    if args.check and args.load is not None:
        raise ValueError(f"--load {args.load}: --check runs from the initial weights, not from a checkpoint")


def _run_online(args: argparse.Namespace) -> int:
    """No plan file: rank 0 plans every step, through `--server` or locally (`api.cli.run_online`)."""
    from hydraplan.api.cli.run_online import online_planning
    from hydraplan.runtime.launch import check_backend
    from hydraplan.runtime.run_io import resolve_run_io
    from hydraplan.runtime.worker import RunSpec

    _refuse_check_after_load(args)
    if args.nproc is not None:
        check_backend(args.backend, args.nproc)
    online = online_planning(args)
    try:
        # the plans come step by step: each step's documents are checked against its plan on the ranks
        run_io = resolve_run_io(
            [], online.cfg, args.dtype, data=args.data, data_start=args.data_start, save=args.save, load=args.load
        )
        if run_io["data_path"] is not None:
            online.read_documents(run_io["data_path"], run_io["data_start"], args.batch_sequences)
        spec = RunSpec(
            steps=args.steps,
            **_training_fields(args),
            **online.spec_fields(),
            **run_io,
        )
        reports = _launch(args, spec, args.nproc, None)
    finally:
        online.close()
    if reports is None:
        return EXIT_RUN_FAILED
    from dataclasses import replace

    from hydraplan.planner.schemas import Plan

    texts = tuple(reports[0]["plan_jsons"])  # the plans rank 0 was given, one per step
    spec = replace(spec, planner=None, next_lengths=None, plan_json=texts[0], plan_jsons=texts)
    return _finish(args, [Plan.model_validate_json(text) for text in texts], spec, reports)


def _launch(args: argparse.Namespace, spec, nproc: int, step_plans: list | None) -> list[dict] | None:
    """Every rank's report, or None after one line naming the failed or stalled rank. `step_plans`:
    each step's plan for the progress lines (None: rank 0 plans online)."""
    from hydraplan.runtime.launch import RankFailedError, RankStalledError, RankTimeoutError, run_ranks
    from hydraplan.runtime.worker import run_worker

    progress = _step_progress(args, spec, step_plans)
    try:
        return run_ranks(
            run_worker,
            nproc,
            backend=args.backend,
            args=(spec,),
            timeout_s=args.timeout_s,
            stall_timeout_s=args.stall_timeout_s,
            on_progress=progress,
        )
    except (RankFailedError, RankStalledError, RankTimeoutError) as exc:
        if progress is not None:
            progress.fail()
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return None


def _progress_enabled(args: argparse.Namespace) -> bool:
    # starting torch on every rank alone takes longer than PROGRESS_MIN_S
    return Progress.for_command(args.progress, PROGRESS_MIN_S).enabled


def _step_progress(args: argparse.Namespace, spec, step_plans: list | None):
    """The launcher's `on_progress` hook writing one line per step, or None without progress."""
    if not _progress_enabled(args):
        return None
    from hydraplan.api.cli.run_progress import StepProgress, stderr_writer

    return StepProgress(step_plans, spec.steps, spec.first_step, stderr_writer())


def _print_predicted_vs_measured(plans: list, reports: list[dict]) -> None:
    """On stderr with the progress lines: the plans' mean step time against the measured one."""
    from hydraplan.api.cli.run_progress import stderr_writer, summary_line
    from hydraplan.runtime.step_timing import step_timing

    num_steps = len(reports[0]["steps"])
    predicted = [plans[min(index, len(plans) - 1)].step_time_s for index in range(num_steps)]
    measured = [step_timing(reports, index).step_s for index in range(num_steps)]
    stderr_writer()(summary_line(predicted, measured) + "\n")
    stderr_writer()(f"{PROG}: run: predictions from the {profile_line(plans[-1])}\n")


def _finish(args: argparse.Namespace, plans: list, spec, reports: list[dict]) -> int:
    """The check, the summary and the report of a run that ended."""
    plan = plans[0]
    check = _check(plan, spec, reports) if args.check else None
    _print_summary(plans, reports, check)
    _print_checkpoint(reports)
    _print_loop(reports[0].get("loop"))
    if _progress_enabled(args):
        _print_predicted_vs_measured(plans, reports)
    if args.report:
        _write_report(args.report, spec, reports, check, plans)
    if check is not None and not check["passed"]:
        print(
            f"{PROG}: error: --check failed: the ranks differ from one process beyond the tolerances", file=sys.stderr
        )
        return EXIT_RUN_FAILED
    return EXIT_OK


def _read_plans(args: argparse.Namespace) -> list:
    """`--plan FILE`, or `--plans DIR`: one plan per step, the directory's `*.json` in name order."""
    if args.plan is not None:
        return [read_plan(args.plan)]
    directory = Path(args.plans)
    if not directory.is_dir():
        raise ValueError(f"--plans {args.plans}: not a directory")
    files = sorted(directory.glob("*.json"))
    if not files:
        raise ValueError(f"--plans {args.plans}: holds no *.json plan")
    if args.steps != 1:
        raise ValueError(f"--steps {args.steps}: with --plans, every plan is one step")
    plans = [read_plan(str(path)) for path in files]
    names = {p.cost_profile.model for p in plans}
    if len(names) > 1:
        raise ValueError(f"--plans {args.plans}: the plans name different models {sorted(map(str, names))}")
    return plans


def _check(plan, spec, reports: list[dict]) -> dict:
    from hydraplan.runtime.equivalence import check_run

    return check_run(plan, spec, reports)


def _public(report: dict) -> dict:
    """A rank's report without its tensors (those exist only for --check)."""
    hidden = ("params", "grads", "boxes", "grad_boxes", "plan_jsons")
    return {key: value for key, value in report.items() if key not in hidden}


def _strategy_runs(plans: list, num_steps: int, first_step: int) -> str:
    """Every step's strategy, consecutive equal ones together: `4x<1,1,1> (steps 0-1), 2x<2,1,1> (step 2)`."""
    runs: list[list] = []
    for index in range(num_steps):
        strategy = str(plans[min(index, len(plans) - 1)].strategy)
        if runs and runs[-1][0] == strategy:
            runs[-1][2] = first_step + index
        else:
            runs.append([strategy, first_step + index, first_step + index])
    return ", ".join(
        f"{strategy} (step {start})" if start == stop else f"{strategy} (steps {start}-{stop})"
        for strategy, start, stop in runs
    )


def profile_line(plan) -> str:
    """Where the plan's predictions come from: the profile's source, model, machine and date."""
    profile = plan.cost_profile
    provenance = profile.provenance
    where = f"{profile.source} profile of {profile.model or 'an unnamed model'}"
    if provenance is not None and (provenance.hardware or provenance.date):
        dtype = f", {provenance.dtype}" if provenance.dtype else ""
        machine = provenance.hardware or "an unrecorded machine"
        when = f" at {provenance.date}" if provenance.date else ""
        where += f", measured on {machine}{when}{dtype}"
    elif profile.source in ("profiled", "calibrated"):
        where += " (its machine and date are not recorded)"
    return where


def plan_element_bytes(plan) -> tuple[str, int]:
    """The gradient dtype the plan's `grad_bytes_per_gpu` counts: the profile's measured dtype, else
    bf16 (the analytic model's and the planner's default)."""
    provenance = plan.cost_profile.provenance
    dtype = provenance.dtype if provenance is not None and provenance.dtype else "bfloat16"
    sizes = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "bf16": 2, "fp32": 4, "fp16": 2}
    return dtype, sizes.get(dtype.removeprefix("torch."), 2)


def cut_line(plans: list) -> str:
    """`3 sequence(s) in 2 step(s) trained as 7 chunks (allowed by --oversize split): 412 tokens
    lost the attention context before their chunk`, or "" without a cut (counted over the steps)."""
    from hydraplan.runtime.equivalence import cut_summary

    cuts = cut_summary(plans)
    if not cuts["sequences"]:
        return ""
    allowed = "allowed by --oversize split" if cuts["allowed"] else "NOT allowed by the plan"
    return (
        f"{cuts['sequences']} sequence(s) in {len(plans)} step(s) trained as {cuts['chunks']} chunks ({allowed}): "
        f"{cuts['tokens_without_context']:,} tokens lost the attention context before their chunk"
    )


def _print_summary(plans: list, reports: list[dict], check: dict | None) -> None:
    from hydraplan.runtime.step_timing import step_timing

    steps = reports[0]["steps"]
    first_step = steps[0]["step"] if steps else 0
    print(f"ran {len(steps)} step(s) on {len(reports)} ranks: {_strategy_runs(plans, len(steps), first_step)}")
    print(f"  predictions from the {profile_line(plans[-1])}")
    for index, step in enumerate(steps):  # after --load, step numbers start past 0
        plan = plans[min(index, len(plans) - 1)]
        slowest = max(report["steps"][index]["pipeline_s"] for report in reports)
        print(
            f"  step {step['step']} ({plan.strategy}, {len(plan.input_lengths)} sequences): loss {step['loss']:.12g}, "
            f"slowest rank {slowest:.3f} s (wall)"
        )
        switches = [report["steps"][index]["switch"] for report in reports]
        if switches[0] is not None:
            sent = sum(switch["weight_bytes"] for switch in switches)
            print(
                f"    strategy switch before it: {sent:,} weight bytes sent in all (x3 with the AdamW moments), "
                f"slowest rank {max(switch['seconds'] for switch in switches):.3f} s; the plan's "
                f"switch_cost_s {switches[0]['planned_switch_cost_s']:.3g} s"
            )
    last = len(steps) - 1
    timing = step_timing(reports, last)
    print(
        "  pipelines, last step: the plan's simulated 1F1B time vs the measured critical path (op CPU times with "
        "their TP/CP collectives and transfers, as the plan counts them)"
    )
    for pipeline in plans[-1].pipelines:
        scheme = f"<{pipeline.scheme.tp},{pipeline.scheme.pp},{pipeline.scheme.cp}>"
        path = timing.pipelines.get(pipeline.index)
        measured = (
            "no micro-batch"
            if path is None
            else (
                f"{path.total_s * 1e3:.3f} ms (TP/CP collectives {path.collectives_s * 1e3:.3f} ms, "
                f"transfers {path.transfer_s * 1e3:.3f} ms)"
            )
        )
        print(f"    pipeline {pipeline.index} {scheme}: planned {pipeline.time_s * 1e3:.3f} ms, measured {measured}")
    dtype, element_bytes = plan_element_bytes(plans[-1])
    print(
        f"  gradient sync per rank (last step): bytes a ring all-reduce sends, in the plan's unit ({dtype} "
        f"gradients) beside the planner's model; the run's own dtype in brackets"
    )
    for report in reports:
        sync = report["steps"][-1]["sync"]
        planned = report["planned_sync"]
        in_plan_unit = sync["ring_sent_bytes"] * element_bytes / _element_bytes(sync)
        print(
            f"    rank {report['rank']} {report['scheme']} stage {report['stage']}: {sync['num_buckets']} buckets "
            f"({sync.get('num_started_in_backward', 0)} started during backward), {sync['elements']:,} elements, "
            f"{in_plan_unit:,.0f} B; planner {planned['ring_sent_bytes']:,.0f} B "
            f"[{sync['ring_sent_bytes']:,.0f} B at {_element_bytes(sync):g} bytes per element]"
        )
    cuts = cut_line([plans[min(index, len(plans) - 1)] for index in range(len(steps))])
    if cuts:
        print(f"  {cuts}")
    if check is not None:
        verdict = "PASSED" if check["passed"] else "FAILED"
        cut = check.get("cuts") or {}
        against = "the batch as cut (allowed)" if cut.get("sequences") and cut.get("allowed") else "the uncut batch"
        print(
            f"  check ({check['dtype']}) {verdict} against {against}: loss {check['max_loss_rel']:.3g} rel, parameters "
            f"{check['max_param_rel']:.3g} rel ({check['worst_param']}), first-step gradients "
            f"{check['max_grad_rel_to_norm']:.3g} of their norm ({check['worst_grad']})"
        )
        if cut.get("sequences"):
            print(f"    against the uncut batch the loss differs by {cut['uncut_max_loss_rel']:.3g} rel")


def _print_checkpoint(reports: list[dict]) -> None:
    """The --load / --save lines: bytes every rank read or wrote, the slowest rank's seconds."""
    for kind, size in (("loaded", "read_bytes"), ("saved", "written_bytes")):
        done = [report.get("checkpoint", {}).get(kind) for report in reports]
        if all(done):
            print(
                f"  checkpoint {kind}: {sum(d[size] for d in done):,} bytes over {len(done)} ranks, slowest rank "
                f"{max(d['seconds'] for d in done):.3f} s"
            )


def _print_loop(loop: list[dict] | None) -> None:
    """One line on the closed loop of an online run: the measurements taken, the last profile
    version and error, and the steps whose measurements were not taken (the first reason)."""
    if not loop:
        return
    taken = [entry for entry in loop if entry["posted"]]
    line = f"  closed loop: {len(taken)} of {len(loop)} steps' measurements taken"
    if taken:
        last = taken[-1]
        line += f", profile version {last.get('fit_version')}"
        if last.get("median_error") is not None:
            line += f", last step's median stage-time error {last['median_error']:.1%}"
    missed = [entry for entry in loop if not entry["posted"]]
    if missed:
        line += f"; not taken: step {missed[0]['step']}: {missed[0].get('error')}"
    print(line)


def _element_bytes(sync: dict) -> float:
    return sync["buffer_bytes"] / sync["elements"] if sync["elements"] else 2.0


def _write_report(path: str, spec, reports: list[dict], check: dict | None, plans: list) -> None:
    from hydraplan.runtime.equivalence import cut_summary
    from hydraplan.runtime.timeline import pipeline_critical_paths_s

    document = {
        "steps": spec.steps,
        "dtype": spec.dtype,
        "critical_path_s": [pipeline_critical_paths_s(reports, step) for step in range(len(reports[0]["steps"]))],
        "measured_steps": _measured_steps(reports),
        "ranks": [_public(report) for report in reports],
        # sequences trained as chunks (--oversize split), over every step run
        "cuts": cut_summary([plans[min(i, len(plans) - 1)] for i in range(len(reports[0]["steps"]))]),
        # the profile version each step's plan was made with (None: no session, no refit yet)
        "profile_versions": [
            None if plan.session_feedback is None else plan.session_feedback.profile_version for plan in plans
        ],
        # online: what became of each step's measurements (`runtime.plan_feed.post_measurements`)
        "loop": reports[0].get("loop"),
        "check": check,
    }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=1)


def _measured_steps(reports: list[dict]) -> list[dict]:
    """Per step, the measured step as the planner models it (`runtime.step_timing`): the slowest
    pipeline's critical path with its parts, the gradient sync, the AdamW step beside them."""
    from dataclasses import asdict

    from hydraplan.runtime.step_timing import step_timing

    steps = []
    for step in range(len(reports[0]["steps"])):
        timing = step_timing(reports, step)
        steps.append(
            {
                "step_s": timing.step_s,
                "slowest_pipeline": timing.slowest_pipeline,
                "sync_s": timing.sync_s,
                "optimizer_s": timing.optimizer_s,
                "pipelines": {str(index): asdict(path) for index, path in timing.pipelines.items()},
            }
        )
    return steps


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `hydraplan run`."""
    parser.description = (
        "Execute a plan on local torch ranks (gloo on CPU, NCCL on GPU): TP/PP/CP inside each pipeline, "
        "gradient sync across pipelines, AdamW. Without --plan/--plans, rank 0 plans each step (--server, "
        "or locally). Needs the runtime extra."
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--plan", metavar="FILE", help="plan JSON (`hydraplan plan --out`), run for --steps steps")
    source.add_argument(
        "--plans", metavar="DIR", help="one plan per step: DIR's *.json in name order (strategies may differ)"
    )
    add_server_argument(source)
    parser.add_argument("--nproc", type=positive_int, metavar="N", help="ranks to spawn (default: the plan's GPUs)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="default: %(default)s")
    parser.add_argument("--steps", type=positive_int, default=1, metavar="K", help="training steps (default: 1)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="default: %(default)s")
    parser.add_argument(
        "--check",
        action="store_true",
        help="also run the steps on one process and compare: float64, loss and parameters to 1e-9 "
        "relative; float32, first-step gradients to 1e-5 of their norm (exit 1 beyond)",
    )
    parser.add_argument("--lr", type=positive_float, default=1e-3, help="AdamW learning rate (default: %(default)s)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="seed of the initial weights (default: 0)")
    parser.add_argument(
        "--data-seed", type=non_negative_int, default=0, help="seed of the synthetic tokens (default: 0)"
    )
    parser.add_argument(
        "--timeout-s", type=positive_float, default=600.0, help="stop every rank after this (default: %(default)s)"
    )
    parser.add_argument(
        "--stall-timeout-s",
        type=positive_float,
        default=60.0,
        help="stop every rank when none has made progress for this long, naming the ones behind (default: %(default)s)",
    )
    parser.add_argument("--models-file", metavar="FILE", help="extra model catalog (the plan names its model)")
    parser.add_argument("--report", metavar="FILE", help="write every rank's measurements (JSON)")
    add_progress_option(parser)
    add_data_and_checkpoint_arguments(parser)
    add_online_arguments(parser)
    parser.set_defaults(handler=run_run)


def add_data_and_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """`--data`, `--data-start`, `--save`, `--load` (`runtime/run_io.py` checks them)."""
    parser.add_argument(
        "--data",
        metavar="DIR",
        help="pre-tokenised documents (`hydraplan data convert`): each step trains on the next documents, "
        "whose lengths must be the plan's (`hydraplan data lengths`); default: synthetic tokens by --data-seed",
    )
    parser.add_argument(
        "--data-start",
        type=non_negative_int,
        metavar="DOC",
        help="the first document of the first step (default: 0, or the --load checkpoint's next document)",
    )
    parser.add_argument(
        "--save",
        metavar="DIR",
        help="after the last step, write weights and AdamW state (torch.distributed.checkpoint)",
    )
    parser.add_argument(
        "--load", metavar="DIR", help="before the first step, load a --save checkpoint (any strategy may have saved it)"
    )


ADD_ARGUMENTS = {"run": add_run_arguments}
