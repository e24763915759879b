"""The `hydraplan` command line: plan a batch, check a plan, list schemes, write a profile, serve.

Every flag maps onto the planner's own types (`PlanRequest`, `SolverOptions`, `CostProfile`).
User mistakes print one line `hydraplan: error: ...` on stderr and exit 2; `check` exits 1 for a
plan that violates a constraint. FastAPI is imported only by `serve`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from pydantic import ValidationError

from hydraplan.api.datasets import DATASET_DESCRIPTIONS, DATASETS, load_lengths_file, sample_batch
from hydraplan.cost_models.analytic import build_profile
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.cost_models.profile_io import format_validation_error, load_profile, save_profile
from hydraplan.planner.baselines import BASELINES, run_baseline
from hydraplan.planner.check import check_plan
from hydraplan.planner.pools import propose_pool
from hydraplan.planner.render import render_plan, render_pool, render_schemes
from hydraplan.planner.schemas import (
    CostProfile,
    OversizePolicy,
    Plan,
    PlanRequest,
    PoolMemberModel,
    SolverBackend,
    SolverOptions,
    StrategyPoolFile,
)
from hydraplan.planner.solve import solve

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
    if args.previous_strategy and args.previous_plan:
        raise ValueError("give either --previous-strategy or --previous-plan, not both")
    previous = read_plan(args.previous_plan).strategy if args.previous_plan else args.previous_strategy
    options = solver_options(args, strategy_pool=read_pool(args.strategy_pool) if args.strategy_pool else None)
    request = PlanRequest(
        lengths=lengths,
        num_gpus=args.num_gpus,
        gpus_per_node=args.gpus_per_node,
        options=options,
        previous_strategy=previous,
    )
    profile = cluster_profile(args)
    if args.baseline:
        plan = run_baseline(args.baseline, request, profile)
    else:
        plan = solve(request, profile, baselines=compared_baselines(args.compare))
    if args.out:
        Path(args.out).write_text(plan.model_dump_json(indent=2) + "\n", encoding="utf-8")
        print(f"{PROG}: wrote plan {plan.plan_id} to {args.out}", file=sys.stderr)
    if args.json:
        print(plan.model_dump_json(indent=2))
    else:
        print(render_plan(plan), end="")
    return EXIT_OK


def solver_options(args: argparse.Namespace, strategy_pool: list[str] | None = None) -> SolverOptions:
    return SolverOptions(
        solver=SolverBackend(args.solver),
        time_limit_s=args.time_limit_s,
        max_schemes=args.max_schemes,
        max_strategies_solved=args.max_strategies_solved,
        seed=args.seed,
        oversize=OversizePolicy(args.oversize),
        strategy_pool=strategy_pool,
    )


def compared_baselines(names: str | None) -> tuple[str, ...]:
    """`--compare` alone: every baseline; `--compare a,b`: those; absent: none."""
    if names is None:
        return ()
    chosen = tuple(BASELINES) if names == "all" else tuple(name.strip() for name in names.split(","))
    unknown = [name for name in chosen if name not in BASELINES]
    if unknown:
        raise ValueError(f"unknown baseline {unknown[0]!r} in --compare; valid: {', '.join(BASELINES)}")
    return chosen


def read_plan(path: str) -> Plan:
    text = Path(path).read_text(encoding="utf-8")
    try:
        return Plan.model_validate_json(text)
    except ValidationError as exc:
        raise ValueError(f"{path}: not a valid plan: {format_validation_error(exc)}") from None


def read_pool(path: str) -> list[str]:
    """Strategies of a pool file: the JSON `hydraplan strategies --out` writes, or one per line."""
    text = Path(path).read_text(encoding="utf-8")
    if text.lstrip().startswith("{"):
        try:
            return StrategyPoolFile.model_validate_json(text).strategies
        except ValidationError as exc:
            raise ValueError(f"{path}: not a valid strategy pool: {format_validation_error(exc)}") from None
    strategies = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not strategies:
        raise ValueError(f"{path}: no strategies")
    return strategies


def run_strategies(args: argparse.Namespace) -> int:
    """`hydraplan strategies`: propose a pool of strategies for batches drawn from a dataset."""
    batches = [
        sample_batch(args.dataset, args.num_tokens, args.seed + index, args.context_cap)
        for index in range(args.num_batches)
    ]
    template = PlanRequest(
        lengths=[1], num_gpus=args.num_gpus, gpus_per_node=args.gpus_per_node, options=solver_options(args)
    )
    deadline = time.perf_counter() + args.budget_s
    pool = propose_pool(
        batches, cluster_profile(args), template, args.pool_size, lambda: deadline - time.perf_counter()
    )
    document = StrategyPoolFile(
        strategies=[str(member.strategy) for member in pool.members],
        members=[
            PoolMemberModel(strategy=str(m.strategy), share=m.share, mean_step_time_s=m.mean_step_time_s)
            for m in pool.members
        ],
        expected_step_time_s=pool.expected_step_time_s,
        unrestricted_step_time_s=pool.unrestricted_step_time_s,
        best_single_step_time_s=pool.best_single_step_time_s,
        num_batches=pool.num_batches,
        dataset=args.dataset,
    )
    if args.out:
        Path(args.out).write_text(document.model_dump_json(indent=2) + "\n", encoding="utf-8")
        print(f"{PROG}: wrote a pool of {len(pool.members)} strategies to {args.out}", file=sys.stderr)
    print(render_pool(document, pool.num_candidates), end="")
    return EXIT_OK


def run_check(args: argparse.Namespace) -> int:
    """`hydraplan check`: 0 when the plan is valid, 1 listing violations, 2 if unreadable."""
    plan = read_plan(args.plan)
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
        from hydraplan.api.server import run
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
    group.add_argument("--models-file", metavar="FILE", help="JSON file of extra models added to the catalog")
    group.add_argument("--gpus-file", metavar="FILE", help="JSON file of extra GPUs added to the catalog")
    return parent


def _profile_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="cost profile JSON (hydraplan.profile/1) to use instead of --model/--gpu",
    )


def _add_plan_parser(commands: argparse._SubParsersAction, cluster: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "plan",
        parents=[cluster],
        help="plan one global batch (default: ~1M Wikipedia tokens, llama3-8b on 64 H100)",
        description="Plan one global batch: strategy, dispatch and packing, checked before printing.",
    )
    _profile_option(parser)
    batch = parser.add_argument_group("batch")
    source = batch.add_mutually_exclusive_group()
    source.add_argument("--lengths", metavar="FILE|-", help="sequence lengths: one integer per line, or a JSON list")
    _sampling_options(batch, source)
    solver = _solver_options(parser)
    context = solver.add_mutually_exclusive_group()
    context.add_argument(
        "--previous-strategy",
        metavar="STRATEGY",
        help="the previous step's strategy, e.g. '1x<8,1,2> + 6x<4,2,1>': switching away from it costs re-sharding",
    )
    context.add_argument(
        "--previous-plan", metavar="FILE", help="the previous step's plan JSON (its strategy, as --previous-strategy)"
    )
    solver.add_argument(
        "--strategy-pool",
        metavar="FILE",
        help="plan only with these strategies: a pool written by `hydraplan strategies --out`, or one per line",
    )
    output = parser.add_argument_group("output")
    output.add_argument("--out", metavar="FILE", help="also write the plan JSON to FILE")
    output.add_argument("--json", action="store_true", help="print the plan JSON instead of the summary")
    output.add_argument(
        "--compare",
        nargs="?",
        const="all",
        metavar="NAMES",
        help="also plan baselines (all, or a comma list of " + ", ".join(BASELINES) + ") and show the speedups",
    )
    output.add_argument(
        "--baseline",
        choices=list(BASELINES),
        help="print the plan this baseline would make instead of hydraplan's",
    )
    parser.set_defaults(handler=run_plan)


def _add_strategies_parser(commands: argparse._SubParsersAction, cluster: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "strategies",
        parents=[cluster],
        help="propose a small pool of strategies for batches drawn from a dataset",
        description="Plan sample batches of a dataset, then choose the pool of strategies with the least "
        "expected step time (each batch on its fastest pool member).",
    )
    _profile_option(parser)
    batch = parser.add_argument_group("sample batches")
    _sampling_options(batch, batch)
    batch.add_argument(
        "--num-batches", type=_positive_int, metavar="N", default=8, help="sample batches (default: %(default)s)"
    )
    pool = parser.add_argument_group("pool")
    pool.add_argument(
        "--pool-size", type=_positive_int, metavar="K", default=3, help="strategies in the pool (default: %(default)s)"
    )
    pool.add_argument(
        "--budget-s",
        type=_positive_float,
        metavar="SECONDS",
        default=30.0,
        help="planning time for all sample batches together (default: %(default)s)",
    )
    pool.add_argument("--out", metavar="FILE", help="write the pool JSON (for plan --strategy-pool) to FILE")
    _solver_options(parser)
    parser.set_defaults(handler=run_strategies)


def _sampling_options(group, source) -> None:
    source.add_argument(
        "--dataset",
        choices=list(DATASETS),
        default="wikipedia",
        help="sample the batch from a bundled dataset (default: %(default)s): "
        + "; ".join(f"{name}: {text}" for name, text in DATASET_DESCRIPTIONS.items()).replace("%", "%%"),
    )
    group.add_argument(
        "--num-tokens",
        type=_positive_int,
        metavar="N",
        default=1_000_000,
        help="tokens to sample from --dataset (default: %(default)s)",
    )
    group.add_argument(
        "--context-cap",
        type=_positive_int,
        metavar="TOKENS",
        default=32768,
        help="split sampled documents longer than this into chunks (default: %(default)s)",
    )


def _solver_options(parser: argparse.ArgumentParser):
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
        "--max-strategies-solved",
        type=_positive_int,
        metavar="N",
        default=SolverOptions().max_strategies_solved,
        help="deterministic work limit: most strategies fully solved (default: %(default)s)",
    )
    solver.add_argument(
        "--solver",
        choices=[backend.value for backend in SolverBackend],
        default=SolverBackend.AUTO.value,
        help="solver backend; auto runs them as an anytime pipeline (default: %(default)s)",
    )
    solver.add_argument(
        "--oversize",
        choices=[policy.value for policy in OversizePolicy],
        default="error",
        help="sequences longer than every capacity: fail, split into chunks, or drop (default: %(default)s)",
    )
    return solver


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Plan Transformer training steps on variable-length data with heterogeneous <TP,PP,CP> pipelines.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    cluster = _cluster_options()
    _add_plan_parser(commands, cluster)
    _add_strategies_parser(commands, cluster)

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
    serve.add_argument("--port", type=_positive_int, default=8000, help="port (default: %(default)s)")
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
