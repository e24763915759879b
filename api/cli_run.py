"""`hydraplan run`: execute a plan (`--plan`, for `--steps` steps) or one plan per step (`--plans
DIR`, strategy switches between them) on local torch ranks, optionally checking against one process.

The plan is read and refused here before any rank starts (the checker, the rank count against
`--nproc`, the model the runtime must build): one line, exit 2. The ranks run
`hydraplan.runtime.worker.run_worker` (spawned by `runtime.launch.run_ranks`; the same worker runs
under torchrun). A rank that fails or a run past `--timeout-s` prints one line naming the rank and
exits 1; so does a `--check` whose differences exceed the tolerances. torch and the runtime are
imported only inside the command function: the rest of the CLI never needs them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hydraplan.api.cli_args import non_negative_int, positive_float, positive_int
from hydraplan.api.cli_inputs import read_plan
from hydraplan.api.cli_progress import PROG

EXIT_OK, EXIT_RUN_FAILED = 0, 1
RUNTIME_MISSING = "the runtime extra is not installed: pip install 'hydraplan[runtime]' (torch==2.13.0)"


def run_run(args: argparse.Namespace) -> int:
    """`hydraplan run`: see the module docstring."""
    plans = _read_plans(args)
    plan = plans[0]
    try:
        from hydraplan.runtime.assignment import model_config_for, validate_plan
    except ImportError as exc:
        raise ValueError(f"{RUNTIME_MISSING} ({exc})") from None
    nproc = plan.num_gpus if args.nproc is None else args.nproc
    cfg = model_config_for(plan, args.models_file)
    for step_plan in plans:
        validate_plan(step_plan, nproc, cfg)
    from hydraplan.runtime.launch import RankFailedError, RankTimeoutError, run_ranks
    from hydraplan.runtime.worker import RunSpec, run_worker

    spec = RunSpec(
        plan_json=plan.model_dump_json(),
        plan_jsons=tuple(step_plan.model_dump_json() for step_plan in plans) if args.plans else (),
        steps=len(plans) if args.plans else args.steps,
        dtype=args.dtype,
        lr=args.lr,
        init_seed=args.seed,
        data_seed=args.data_seed,
        collect_state=args.check,
        models_file=args.models_file,
    )
    try:
        reports = run_ranks(run_worker, nproc, backend=args.backend, args=(spec,), timeout_s=args.timeout_s)
    except (RankFailedError, RankTimeoutError) as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_RUN_FAILED
    check = _check(plan, spec, reports) if args.check else None
    _print_summary(plans, reports, check)
    if args.report:
        _write_report(args.report, spec, reports, check)
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
    from hydraplan.runtime.equivalence import compare_with_reference, single_process_run

    reference = single_process_run(plan, spec)
    return compare_with_reference(reports, reference, spec.dtype).as_dict()


def _public(report: dict) -> dict:
    """A rank's report without its tensors (those exist only for --check)."""
    return {key: value for key, value in report.items() if key not in ("params", "grads", "boxes")}


def _print_summary(plans: list, reports: list[dict], check: dict | None) -> None:
    plan = plans[0]
    print(f"ran {plan.strategy} on {len(reports)} ranks ({len(plan.input_lengths)} sequences)")
    for step in reports[0]["steps"]:
        slowest = max(report["steps"][step["step"]]["pipeline_s"] for report in reports)
        print(f"  step {step['step']}: loss {step['loss']:.12g}, slowest rank {slowest:.3f} s (wall)")
        switches = [report["steps"][step["step"]]["switch"] for report in reports]
        if switches[0] is not None:
            sent = sum(switch["weight_bytes"] for switch in switches)
            print(
                f"    strategy switch before it: {sent:,} weight bytes sent in all (x3 with the AdamW moments), "
                f"slowest rank {max(switch['seconds'] for switch in switches):.3f} s; the plan's "
                f"switch_cost_s {switches[0]['planned_switch_cost_s']:.3g} s"
            )
    from hydraplan.runtime.timeline import pipeline_critical_paths_s

    last = len(reports[0]["steps"]) - 1
    measured = pipeline_critical_paths_s(reports, last)
    print("  pipelines, last step: the plan's simulated 1F1B time vs the critical path of the measured op CPU times")
    for pipeline in plans[-1].pipelines:
        scheme = f"<{pipeline.scheme.tp},{pipeline.scheme.pp},{pipeline.scheme.cp}>"
        print(
            f"    pipeline {pipeline.index} {scheme}: planned {pipeline.time_s * 1e3:.3f} ms, "
            f"measured {measured[pipeline.index] * 1e3:.3f} ms"
        )
    print("  gradient sync per rank (last step): bytes sent by a ring all-reduce, vs the planner's model (bf16)")
    for report in reports:
        sync = report["steps"][-1]["sync"]
        planned = report["planned_sync"]
        print(
            f"    rank {report['rank']} {report['scheme']} stage {report['stage']}: {sync['num_buckets']} buckets, "
            f"{sync['elements']:,} elements, {sync['ring_sent_bytes']:,.0f} B sent (bf16 "
            f"{sync['ring_sent_bytes'] * 2 / _element_bytes(sync):,.0f} B; planner {planned['ring_sent_bytes']:,.0f} B)"
        )
    if check is not None:
        verdict = "PASSED" if check["passed"] else "FAILED"
        print(
            f"  check ({check['dtype']}) {verdict}: loss {check['max_loss_rel']:.3g} rel, parameters "
            f"{check['max_param_rel']:.3g} rel ({check['worst_param']}), first-step gradients "
            f"{check['max_grad_rel_to_norm']:.3g} of their norm ({check['worst_grad']})"
        )


def _element_bytes(sync: dict) -> float:
    return sync["buffer_bytes"] / sync["elements"] if sync["elements"] else 2.0


def _write_report(path: str, spec, reports: list[dict], check: dict | None) -> None:
    from hydraplan.runtime.timeline import pipeline_critical_paths_s

    document = {
        "steps": spec.steps,
        "dtype": spec.dtype,
        "critical_path_s": [pipeline_critical_paths_s(reports, step) for step in range(len(reports[0]["steps"]))],
        "measured_steps": _measured_steps(reports),
        "ranks": [_public(report) for report in reports],
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
        "gradient sync across pipelines, AdamW. Needs the runtime extra."
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--plan", metavar="FILE", help="plan JSON (`hydraplan plan --out`), run for --steps steps")
    source.add_argument(
        "--plans", metavar="DIR", help="one plan per step: DIR's *.json in name order (strategies may differ)"
    )
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
    parser.add_argument("--models-file", metavar="FILE", help="extra model catalog (the plan names its model)")
    parser.add_argument("--report", metavar="FILE", help="write every rank's measurements (JSON)")
    parser.set_defaults(handler=run_run)


ADD_ARGUMENTS = {"run": add_run_arguments}
