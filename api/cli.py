"""The `hydraplan` command line: plan a batch, check a plan, list schemes, write a profile, serve.

Every flag maps onto the planner's own types (`PlanRequest`, `SolverOptions`, `CostProfile`).
User mistakes print one line `hydraplan: error: ...` on stderr and exit 2; `check` exits 1 for a
plan that violates a constraint. FastAPI is imported only by `serve`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from pydantic import ValidationError

from api.datasets import DATASET_DESCRIPTIONS, DATASETS, load_lengths_file, sample_batch
from cost_models.analytic import build_profile
from cost_models.catalog import get_gpu, get_model
from cost_models.profile_io import format_validation_error, load_profile, save_profile
from planner.check import check_plan
from planner.render import render_plan, render_schemes
from planner.schemas import (
    CostProfile,
    OversizePolicy,
    Plan,
    PlanRequest,
    SolverBackend,
    SolverOptions,
)
from planner.solve import solve

PROG = "hydraplan"
EXIT_OK, EXIT_INVALID_PLAN, EXIT_USAGE = 0, 1, 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a killed writer
SERVICE_MISSING = "the service extra is not installed: pip install 'hydraplan[service]'"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with `argv` (default `sys.argv[1:]`); returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error argparse already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return args.handler(args)
    except BrokenPipeError:  # e.g. `hydraplan plan --json | head`: the reader has gone
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except ValidationError as exc:
        return _fail(describe_validation_error(exc))
    except OSError as exc:
        return _fail(describe_os_error(exc))
    except ValueError as exc:  # PlanningError, CatalogError, ProfileError, LengthsError, ...
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _fail(message: str) -> int:
    one_line = " ".join(message.split())
    print(f"{PROG}: error: {one_line}", file=sys.stderr)
    return EXIT_USAGE


def describe_validation_error(exc: ValidationError) -> str:
    """One line naming the offending fields, e.g. `invalid PlanRequest: num_gpus: ...`."""
    return f"invalid {exc.title}: {format_validation_error(exc)}"


def describe_os_error(exc: OSError) -> str:
    if exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------


def run_plan(args: argparse.Namespace) -> int:
    """`hydraplan plan`: build the request and the profile, solve, print and/or write the plan."""
    lengths = (
        load_lengths_file(args.lengths)
        if args.lengths
        else sample_batch(args.dataset, args.num_tokens, args.seed, args.context_cap)
    )
    options = SolverOptions(
        solver=SolverBackend(args.solver),
        time_limit_s=args.time_limit_s,
        max_schemes=args.max_schemes,
        seed=args.seed,
        oversize=OversizePolicy(args.oversize),
    )
    request = PlanRequest(
        lengths=lengths,
        num_gpus=args.num_gpus,
        gpus_per_node=args.gpus_per_node,
        options=options,
        previous_strategy=args.previous_strategy,
    )
    plan = solve(request, cluster_profile(args), baselines=("megatron",) if args.compare else ())
    if args.out:
        Path(args.out).write_text(plan.model_dump_json(indent=2) + "\n", encoding="utf-8")
        print(f"{PROG}: wrote plan {plan.plan_id} to {args.out}", file=sys.stderr)
    if args.json:
        print(plan.model_dump_json(indent=2))
    else:
        print(render_plan(plan), end="")
    return EXIT_OK


def run_check(args: argparse.Namespace) -> int:
    """`hydraplan check`: 0 when the plan is valid, 1 listing violations, 2 if unreadable."""
    text = Path(args.plan).read_text(encoding="utf-8")
    try:
        plan = Plan.model_validate_json(text)
    except ValidationError as exc:
        raise ValueError(f"{args.plan}: not a valid plan: {format_validation_error(exc)}") from None
    profile = load_profile(args.profile) if args.profile else None
    violations = check_plan(plan, profile)
    if violations:
        print(f"plan INVALID: {args.plan}: {len(violations)} violation(s)")
        for violation in violations:
            print(f"  - {violation}")
        return EXIT_INVALID_PLAN
    print(
        f"plan OK: {args.plan}: {plan.strategy}, {len(plan.input_lengths)} sequences on "
        f"{plan.num_gpus} GPUs, step time {plan.step_time_s * 1e3:,.1f} ms"
    )
    return EXIT_OK


def run_schemes(args: argparse.Namespace) -> int:
    """`hydraplan schemes`: the table of runnable schemes and their costs."""
    print(render_schemes(cluster_profile(args)), end="")
    return EXIT_OK


def run_profile(args: argparse.Namespace) -> int:
    """`hydraplan profile --analytic`: write (or print) the analytic cost profile as JSON."""
    profile = analytic_profile(args)
    if args.out:
        save_profile(profile, args.out)
        print(
            f"{PROG}: wrote {profile.source} profile of {len(profile.schemes)} schemes "
            f"({profile.model} on {profile.gpu}) to {args.out}",
            file=sys.stderr,
        )
    else:
        print(profile.model_dump_json(indent=2))
    return EXIT_OK


def run_serve(args: argparse.Namespace) -> int:
    """`hydraplan serve`: the REST service (imported here so the CLI never needs FastAPI)."""
    try:
        from api.server import run
    except ImportError as exc:
        raise ValueError(f"{SERVICE_MISSING} ({exc})") from None
    run(args.host, args.port, args.workers)
    return EXIT_OK


def cluster_profile(args: argparse.Namespace) -> CostProfile:
    """The user's `--profile` file, else the analytic profile of `--model` on `--gpu`."""
    if args.profile:
        return load_profile(args.profile)
    return analytic_profile(args)


def analytic_profile(args: argparse.Namespace) -> CostProfile:
    model = get_model(args.model, extra_path=args.models_file)
    gpu = get_gpu(args.gpu, extra_path=args.gpus_file)
    return build_profile(model, gpu, args.num_gpus, args.gpus_per_node)


# ---------------------------------------------------------------------------------------------
# Parser
# ---------------------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def _non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def _int(text: str) -> int:
    try:
        return int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


def _cluster_options() -> argparse.ArgumentParser:
    """Options naming the model, the GPU and the cluster (shared by plan, schemes, profile)."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("model and cluster")
    group.add_argument("--model", default="llama3-8b", help="catalog model (default: %(default)s)")
    group.add_argument("--gpu", default="h100-sxm-80gb", help="catalog GPU (default: %(default)s)")
    group.add_argument(
        "--num-gpus",
        type=_positive_int,
        metavar="N",
        default=64,
        help="GPUs in the cluster (default: %(default)s)",
    )
    group.add_argument(
        "--gpus-per-node",
        type=_positive_int,
        metavar="N",
        default=8,
        help="GPUs per node (default: %(default)s)",
    )
    group.add_argument(
        "--models-file", metavar="FILE", help="JSON file of extra models added to the catalog"
    )
    group.add_argument(
        "--gpus-file", metavar="FILE", help="JSON file of extra GPUs added to the catalog"
    )
    return parent


def _profile_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="cost profile JSON (hydraplan.profile/1) to use instead of --model/--gpu",
    )


def _add_plan_parser(
    commands: argparse._SubParsersAction, cluster: argparse.ArgumentParser
) -> None:
    parser = commands.add_parser(
        "plan",
        parents=[cluster],
        help="plan one global batch (default: ~1M Wikipedia tokens, llama3-8b on 64 H100)",
        description="Plan one global batch: strategy, dispatch and packing, checked before "
        "printing.",
    )
    _profile_option(parser)
    batch = parser.add_argument_group("batch")
    source = batch.add_mutually_exclusive_group()
    source.add_argument(
        "--lengths", metavar="FILE|-", help="sequence lengths: one integer per line, or a JSON list"
    )
    source.add_argument(
        "--dataset",
        choices=list(DATASETS),
        default="wikipedia",
        help="sample the batch from a bundled dataset (default: %(default)s): "
        + "; ".join(f"{name}: {text}" for name, text in DATASET_DESCRIPTIONS.items()).replace(
            "%", "%%"
        ),
    )
    batch.add_argument(
        "--num-tokens",
        type=_positive_int,
        metavar="N",
        default=1_000_000,
        help="tokens to sample from --dataset (default: %(default)s)",
    )
    batch.add_argument(
        "--context-cap",
        type=_positive_int,
        metavar="TOKENS",
        default=32768,
        help="split sampled documents longer than this into chunks (default: %(default)s)",
    )
    solver = parser.add_argument_group("solver")
    solver.add_argument(
        "--seed",
        type=_non_negative_int,
        metavar="N",
        default=0,
        help="seed for sampling and solving (default: %(default)s)",
    )
    solver.add_argument(
        "--max-schemes",
        type=_positive_int,
        metavar="K",
        default=3,
        help="most distinct schemes in a strategy (default: %(default)s)",
    )
    solver.add_argument(
        "--time-limit-s",
        type=_positive_float,
        metavar="SECONDS",
        default=2.0,
        help="planning-time budget in seconds (default: %(default)s)",
    )
    solver.add_argument(
        "--solver",
        choices=[backend.value for backend in SolverBackend],
        default=SolverBackend.AUTO.value,
        help="solver backend; auto runs them as an anytime pipeline (default: %(default)s)",
    )
    solver.add_argument(
        "--previous-strategy",
        metavar="STRATEGY",
        help="the previous step's strategy, e.g. '1x<8,1,2> + 6x<4,2,1>': switching away from it "
        "costs re-sharding",
    )
    solver.add_argument(
        "--oversize",
        choices=[policy.value for policy in OversizePolicy],
        default="error",
        help="sequences longer than every capacity: fail, split into chunks, or drop "
        "(default: %(default)s)",
    )
    output = parser.add_argument_group("output")
    output.add_argument("--out", metavar="FILE", help="also write the plan JSON to FILE")
    output.add_argument(
        "--json", action="store_true", help="print the plan JSON instead of the summary"
    )
    output.add_argument(
        "--compare",
        action="store_true",
        help="also plan the megatron baseline and show the speedup",
    )
    parser.set_defaults(handler=run_plan)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Plan Transformer training steps on variable-length data with heterogeneous "
        "<TP,PP,CP> pipelines.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    cluster = _cluster_options()
    _add_plan_parser(commands, cluster)

    check = commands.add_parser(
        "check",
        help="check a plan JSON file (exit 0 valid, 1 violations, 2 unreadable)",
        description="Check a plan independently: every sequence placed once, capacities, ranks, "
        "recomputed step time. Exit 0 when valid, 1 listing violations, 2 when unreadable.",
    )
    check.add_argument("plan", metavar="PLAN.json", help="plan written by `hydraplan plan --out`")
    check.add_argument(
        "--profile",
        metavar="FILE",
        help="re-check costs against this profile (default: the plan's)",
    )
    check.set_defaults(handler=run_check)

    schemes = commands.add_parser(
        "schemes",
        parents=[cluster],
        help="list runnable schemes with their cost coefficients and capacities",
        description="List the runnable <TP,PP,CP> schemes: stage-time coefficients a, b, c "
        "(seconds) and capacity in tokens.",
    )
    _profile_option(schemes)
    schemes.set_defaults(handler=run_schemes)

    profile = commands.add_parser(
        "profile",
        parents=[cluster],
        help="write a cost profile JSON (hydraplan.profile/1)",
        description="Write the cost profile of --model on --gpu for the cluster.",
    )
    profile.add_argument(
        "--analytic",
        action="store_true",
        required=True,
        help="build the profile from hardware specs and formulas",
    )
    profile.add_argument("--out", metavar="FILE", help="write to FILE (default: standard output)")
    profile.set_defaults(handler=run_profile)

    serve = commands.add_parser(
        "serve",
        help="run the REST service (needs the service extra)",
        description="Run the REST service (pip install 'hydraplan[service]').",
    )
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    serve.add_argument(
        "--port", type=_positive_int, default=8000, help="port (default: %(default)s)"
    )
    serve.add_argument(
        "--workers",
        type=_positive_int,
        metavar="N",
        default=1,
        help="worker processes (default: %(default)s)",
    )
    serve.set_defaults(handler=run_serve)
    return parser


def _version() -> str:
    try:
        return metadata.version("hydraplan")
    except metadata.PackageNotFoundError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
