"""`hydraplan plan` and `hydraplan strategies`: the commands that run the planner.

`plan --compare` runs every baseline on its own: one that cannot plan the batch becomes a line
with its reason, and hydraplan's plan and the other baselines are printed as usual.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hydraplan.api.cli.args import (
    PROCESSES_PER_CORE,
    add_cluster_options,
    add_json_option,
    add_profile_option,
    add_progress_option,
    add_sampling_options,
    add_solver_options,
    add_virtual_stages_option,
    positive_float,
    positive_int,
    process_count,
    usable_cores,
)
from hydraplan.api.cli.inputs import (
    batch_lengths,
    cluster_profile,
    naming_flags,
    plan_request,
    solver_options,
)
from hydraplan.api.cli.progress import PROG, PROGRESS_MIN_S, Progress
from hydraplan.api.cli.timeline import add_timeline_options, timeline_format, write_timeline
from hydraplan.api.files import InputError, catalog_model, read_plan, read_pool
from hydraplan.planner.baselines import BASELINES, recipe_counts_for, wants_interleaved
from hydraplan.planner.pools import MAX_POOL_BATCHES, MIN_BATCH_BUDGET_S, least_budget_s
from hydraplan.planner.strategies import named_chunk_counts

if TYPE_CHECKING:
    from hydraplan.planner.pools import StrategyPool
    from hydraplan.planner.schemas import BaselineResult, CostProfile, Plan, PlanRequest, StrategyPoolFile

EXIT_OK = 0


# ---------------------------------------------------------------------------------------------
# plan
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BaselineOutcome:
    """One compared baseline: its result, or the one-line reason it could not plan."""

    name: str
    result: BaselineResult | None = None
    reason: str | None = None
    plan: Plan | None = None  # the baseline's own plan, for its timeline


def run_plan(args: argparse.Namespace) -> int:
    """Build the request and the profile, solve, print and/or write the plan."""
    names = compared_baselines(args.compare)
    timeline_format(args.timeline)  # a bad --timeline fails before planning
    if args.previous_strategy and args.previous_plan:
        raise InputError("give either --previous-strategy or --previous-plan, not both")
    lengths = batch_lengths(args)
    previous = read_plan(args.previous_plan).strategy if args.previous_plan else args.previous_strategy
    pool = read_pool(args.strategy_pool) if args.strategy_pool else None
    request = plan_request(args, lengths, solver_options(args, strategy_pool=pool), previous)
    profile = cluster_profile(args, [*named_chunk_counts([*(pool or ()), previous]), *recipe_counts(args, names)])
    _note_beyond_measured(profile, lengths)
    budget_s = _budget_s(request, profile)
    progress = Progress.for_command(args.progress, (budget_s or 0.0) + (PROGRESS_MIN_S if names else 0.0))
    outcomes: list[BaselineOutcome] = []
    with naming_flags(args):
        plan = (
            _baseline_plan(args.baseline, request, profile, progress)
            if args.baseline
            else _hydraplan_plan(request, profile, progress, budget_s, _workers(args.workers))
        )
    if not args.baseline:
        outcomes = compare_baselines(names, request, profile, plan, progress)
        from hydraplan.planner.build import identified

        plan = identified(plan.model_copy(update={"baselines": [o.result for o in outcomes if o.result is not None]}))
    if args.out:
        Path(args.out).write_text(plan.model_dump_json(indent=2) + "\n", encoding="utf-8")
        print(f"{PROG}: wrote plan {plan.plan_id} to {args.out}", file=sys.stderr)
    if args.timeline:
        drawn = [(args.baseline or "hydraplan", plan)]
        drawn += [(o.name, o.plan) for o in outcomes if o.plan is not None]
        # a baseline's plan carries no bound of its own worth drawing
        with progress.step(f"drawing the timeline of {len(drawn)} plan(s)"):
            wrote = write_timeline(
                args.timeline, drawn, args.pipelines, [not args.baseline] + [False] * (len(drawn) - 1)
            )
        print(wrote, file=sys.stderr)
    print_plan(plan, [o for o in outcomes if o.reason is not None], args.json, args.pipelines)
    return EXIT_OK


def _note_beyond_measured(profile: CostProfile, lengths: list[int]) -> None:
    """A note on standard error when the batch holds a sequence longer than a measured profile
    measured: its stage time and memory are extrapolated from the fit."""
    from hydraplan.api.render.schemes import measured_range

    measured = measured_range(profile)
    if not measured or not lengths:
        return
    longest = max(length for length, _ in measured.values())
    if max(lengths) > longest:
        print(
            f"{PROG}: note: the longest sequence ({max(lengths):,} tokens) is longer than any the profile "
            f"measured ({longest:,}); its stage time and memory are extrapolated from the fit",
            file=sys.stderr,
        )


def _budget_s(request: PlanRequest, profile: CostProfile) -> float | None:
    """The seconds the planner will spend: the time limit, or `auto` resolved for the batch (None
    when the batch cannot be planned: `solve` then says why)."""
    from hydraplan.planner.errors import PlanningError
    from hydraplan.planner.solve import planning_budget_s

    limit = request.options.time_limit_s
    if not isinstance(limit, str):
        return float(limit)
    try:
        return planning_budget_s(request, profile)
    except PlanningError:
        return None


def _budget_text(time_limit_s: float | str, budget_s: float | None) -> str:
    """`budget 2.0 s`; `budget auto (0.9 s)`, auto resolved for the batch, or `budget auto` when
    it could not be (the plan's `solver.time_limit_s` says it either way)."""
    if not isinstance(time_limit_s, str):
        return f"budget {time_limit_s:.1f} s"
    return f"budget {time_limit_s}" + ("" if budget_s is None else f" ({budget_s:.1f} s)")


def _workers(requested: int | None) -> int:
    """`--workers`, or the cores this process may use; 1 where processes cannot be forked (the
    worker inherits the loaded planner instead of importing it again)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return requested or usable_cores()


def _hydraplan_plan(
    request: PlanRequest, profile: CostProfile, progress: Progress, budget_s: float | None, workers: int = 1
) -> Plan:
    from hydraplan.planner.solve import load_backend, solve

    tokens = sum(request.lengths)
    with progress.step(
        f"planning {len(request.lengths):,} sequences ({tokens:,} tokens) on {request.num_gpus} GPUs, "
        + _budget_text(request.options.time_limit_s, budget_s)
    ):
        # the solver libraries and compiled kernels loaded, what the process holds is long-lived:
        # frozen, the cyclic collector does not walk it during the search (~0.1 s of CPU less per
        # plan at 8B / 64 and 70B / 256 H100, measured side by side)
        load_backend(request.options.solver)
        gc.freeze()
        try:
            if workers == 1:
                return solve(request, profile)
            # this process runs the search; the others make the baselines' plans and, two or more,
            # compute the search's next tasks ahead of it (forked: they inherit the loaded planner)
            context = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(max_workers=workers - 1, mp_context=context) as executor:
                return solve(request, profile, executor=executor, executor_workers=workers - 1)
        finally:
            gc.unfreeze()  # collectable again afterwards (main() may run many times in one process)


def _baseline_plan(name: str, request: PlanRequest, profile: CostProfile, progress: Progress) -> Plan:
    from hydraplan.planner.baselines import run_baseline

    with progress.step(f"baseline {name} on {len(request.lengths):,} sequences"):
        return run_baseline(name, request, profile)


def recipe_counts(args: argparse.Namespace, names: tuple[str, ...]) -> list[int]:
    """The chunk counts the recipe of `--model` runs (`baselines.recipe_chunk_counts`, over every
    pipeline depth that splits its layers), when an interleaved baseline (`megatron-vpp`, `wlb-vpp`)
    is compared or asked for and the profile is the analytic one; none otherwise."""
    if getattr(args, "profile", None) or not wants_interleaved([*names, args.baseline]):
        return []
    model = catalog_model(args.model, args.models_file)
    return recipe_counts_for(model.name, model.num_layers, args.num_gpus)


def compared_baselines(names: str | None) -> tuple[str, ...]:
    """`--compare` alone: every baseline; `--compare a,b`: those; absent: none."""
    if names is None:
        return ()
    chosen = tuple(BASELINES) if names == "all" else tuple(name.strip() for name in names.split(","))
    unknown = [name for name in chosen if name not in BASELINES]
    if unknown:
        raise InputError(f"unknown baseline {unknown[0]!r} in --compare; valid: {', '.join(BASELINES)}")
    return chosen


def compare_baselines(
    names: tuple[str, ...], request: PlanRequest, profile: CostProfile, plan: Plan, progress: Progress
) -> list[BaselineOutcome]:
    """Run each baseline on its own; a failure is that baseline's outcome, not the command's."""
    return [_compare_one(name, request, profile, plan, progress) for name in names]


def _compare_one(
    name: str, request: PlanRequest, profile: CostProfile, plan: Plan, progress: Progress
) -> BaselineOutcome:
    from hydraplan.planner.baselines import run_baseline
    from hydraplan.planner.schemas import BaselineResult

    try:
        with progress.step(f"baseline {name}"):
            baseline = run_baseline(name, request, profile)
    except Exception as exc:  # noqa: BLE001 - any failure of one baseline must not lose the plan
        return BaselineOutcome(name, reason=baseline_failure_reason(name, exc))
    result = BaselineResult(
        name=name,
        strategy=baseline.strategy,
        step_time_s=baseline.step_time_s,
        speedup=baseline.step_time_s / plan.step_time_s,
    )
    return BaselineOutcome(name, result=result, plan=baseline)


def baseline_failure_reason(name: str, exc: Exception) -> str:
    """One line: the planner's message without the repeated `name: `, or the unexpected error."""
    message = " ".join(str(exc).split()).removeprefix(f"{name}: ")
    if isinstance(exc, ValueError):  # PlanningError and the planner's other refusals
        return message
    return f"internal error: {type(exc).__name__}: {message}"


def print_plan(plan: Plan, failed: list[BaselineOutcome], as_json: bool, pipelines: str = "auto") -> None:
    """The plan as JSON (failed baselines then go to standard error) or as the summary."""
    from hydraplan.api.render.plan_text import render_plan

    if as_json:
        print(plan.model_dump_json(indent=2))
        for outcome in failed:
            print(f"{PROG}: baseline {outcome.name} could not plan: {outcome.reason}", file=sys.stderr)
        return
    print(render_plan(plan, pipelines), end="")
    if failed:
        width = max(len(outcome.name) for outcome in failed)
        rows = [f"{outcome.name.ljust(width)}  could not plan: {outcome.reason}" for outcome in failed]
        print("\n" + "\n".join(["baselines that could not plan", *rows]))


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `hydraplan plan`."""
    parser.description = "Plan one global batch: strategy, dispatch and packing, checked before printing."
    add_cluster_options(parser)
    add_profile_option(parser)
    add_virtual_stages_option(parser)
    batch = parser.add_argument_group("batch")
    source = batch.add_mutually_exclusive_group()
    source.add_argument("--lengths", metavar="FILE|-", help="sequence lengths: one integer per line, or a JSON list")
    add_sampling_options(batch, source)
    solver = add_solver_options(parser)
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
        "--rank-slowdowns",
        metavar="RANK=FACTOR,...",
        help="known slow ranks, e.g. '3=2.5,7=1.5' (factor >= 1): a pipeline holding one runs at its slowest "
        "rank's pace and gets less work",
    )
    solver.add_argument(
        "--strategy-pool",
        metavar="FILE",
        help="plan only with these strategies: a pool written by `hydraplan strategies --out`, or one per line",
    )
    solver.add_argument(
        "--workers",
        type=process_count,
        metavar="N",
        help="processes that plan together (the others make the baselines' own plans and, from 3 on, compute "
        "ahead of the search); the plan is the same for any N (default: the cores this process may use; at "
        f"most {PROCESSES_PER_CORE} per core)",
    )
    output = parser.add_argument_group("output")
    output.add_argument("--out", metavar="FILE", help="also write the plan JSON to FILE")
    add_json_option(output, "print the plan JSON instead of the summary")
    output.add_argument(
        "--compare",
        nargs="?",
        const="all",
        metavar="NAMES",
        help="also plan baselines (all, or a comma list of " + ", ".join(BASELINES) + ") and show the "
        "speedups; a baseline that cannot plan the batch is listed with its reason",
    )
    output.add_argument(
        "--baseline",
        choices=list(BASELINES),
        help="print the plan this baseline would make instead of hydraplan's",
    )
    add_timeline_options(output)
    add_progress_option(output)
    parser.set_defaults(handler=run_plan)


# ---------------------------------------------------------------------------------------------
# strategies
# ---------------------------------------------------------------------------------------------


def run_strategies(args: argparse.Namespace) -> int:
    """Propose a pool of strategies for batches drawn from a dataset."""
    from hydraplan.api.datasets import sample_batch
    from hydraplan.api.render.plan_text import render_pool
    from hydraplan.planner.pools import propose_pool

    if args.num_batches > MAX_POOL_BATCHES:
        raise InputError(f"--num-batches {args.num_batches}: at most {MAX_POOL_BATCHES} sample batches")
    if args.budget_s < least_budget_s(args.num_batches):
        raise InputError(
            f"--budget-s {args.budget_s:g} for {args.num_batches} sample batches: at least "
            f"{least_budget_s(args.num_batches):.3g} s (raise it, or lower --num-batches)"
        )
    template = plan_request(args, [1], solver_options(args))
    profile = cluster_profile(args)
    batches = [
        sample_batch(args.dataset, args.num_tokens, args.seed + index, args.context_cap)
        for index in range(args.num_batches)
    ]
    progress = Progress.for_command(args.progress, args.budget_s)
    deadline_s = time.perf_counter() + args.budget_s
    with (
        progress.step(
            f"proposing a pool of {args.pool_size} strategies from {args.num_batches} sample batches on "
            f"{args.num_gpus} GPUs, budget {args.budget_s:.1f} s"
        ),
        naming_flags(args),
    ):
        pool = propose_pool(batches, profile, template, args.pool_size, lambda: deadline_s - time.perf_counter())
    document = _pool_document(pool, args.dataset)
    if args.out:
        Path(args.out).write_text(document.model_dump_json(indent=2) + "\n", encoding="utf-8")
        print(f"{PROG}: wrote a pool of {len(pool.members)} strategies to {args.out}", file=sys.stderr)
    print(render_pool(document, pool.num_candidates, pool.num_evaluated), end="")
    return EXIT_OK


def _pool_document(pool: StrategyPool, dataset: str) -> StrategyPoolFile:
    """The `StrategyPoolFile` of a proposed pool."""
    from hydraplan.planner.schemas import PoolMemberModel, StrategyPoolFile

    return StrategyPoolFile(
        strategies=[str(member.strategy) for member in pool.members],
        members=[
            PoolMemberModel(strategy=str(m.strategy), share=m.share, mean_step_time_s=m.mean_step_time_s)
            for m in pool.members
        ],
        expected_step_time_s=pool.expected_step_time_s,
        unrestricted_step_time_s=pool.unrestricted_step_time_s,
        best_single_step_time_s=pool.best_single_step_time_s,
        num_batches=pool.num_batches,
        dataset=dataset,
    )


def add_strategies_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `hydraplan strategies`."""
    parser.description = (
        "Plan sample batches of a dataset, then choose the pool of strategies with the least "
        "expected step time (each batch on its fastest pool member)."
    )
    add_cluster_options(parser)
    add_profile_option(parser)
    batch = parser.add_argument_group("sample batches")
    add_sampling_options(batch, batch)
    batch.add_argument(
        "--num-batches",
        type=positive_int,
        metavar="N",
        default=8,
        help=f"sample batches (default: %(default)s; at most {MAX_POOL_BATCHES})",
    )
    pool = parser.add_argument_group("pool")
    pool.add_argument(
        "--pool-size", type=positive_int, metavar="K", default=3, help="strategies in the pool (default: %(default)s)"
    )
    pool.add_argument(
        "--budget-s",
        type=positive_float,
        metavar="SECONDS",
        default=30.0,
        help="planning time for all sample batches together, a quarter of it kept for solving the candidates on "
        f"every batch; at least {MIN_BATCH_BUDGET_S:g} s of search per batch (default: %(default)s)",
    )
    pool.add_argument("--out", metavar="FILE", help="write the pool JSON (for plan --strategy-pool) to FILE")
    add_progress_option(pool)
    add_solver_options(parser)
    parser.set_defaults(handler=run_strategies)


ADD_ARGUMENTS = {"plan": add_plan_arguments, "strategies": add_strategies_arguments}
