"""The one solve facade: request + cost profile -> checked `Plan`."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor

import numpy as np

from hydraplan.planner.bounds import BoundTables
from hydraplan.planner.bubble_floor import tabulated_floors
from hydraplan.planner.budget import resolved_budget_s
from hydraplan.planner.build import build_plan, identified
from hydraplan.planner.candidate import Candidate
from hydraplan.planner.certificate import fixed_certificate
from hydraplan.planner.check import check_plan
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.errors import PlanningError
from hydraplan.planner.items import Items, prepare_items
from hydraplan.planner.kernels import warm_up
from hydraplan.planner.portfolio import peer_candidates, peer_task
from hydraplan.planner.schemas import BaselineResult, CostProfile, Plan, PlanRequest, SolverBackend, SolverStats
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.search import (
    Clock,
    SearchSettings,
    WorkLimits,
    placeable_profile,
    search,
    solve_fixed,
    solve_strategy,
)
from hydraplan.planner.slowdowns import slowed_best
from hydraplan.planner.speculation import SpeculativeSolver
from hydraplan.planner.strategies import Strategy, parse_strategy, unplaceable_reason
from hydraplan.planner.switching import require_switch_pricing

# workers from which the search's next tasks are computed ahead (`planner.speculation`); one
# worker only makes the baselines' plans. Side by side on 2 cores (`benchmarks/workers.py`), one
# worker that also computed ahead made 70B / 256 H100 plans 0.82x as fast as the search alone
# (most of what it computed went unused, and it took the second core the search's numpy and
# HiGHS threads used); making the baselines' plans only, 1.05-1.6x
SPECULATION_MIN_WORKERS = 2
FINISH_SHARE = 0.1  # of the time limit, kept for building and checking the plan ...
# ... or more for large batches: building and checking take 3-4 us per item on a quiet 2-core
# EPYC (0.19 s for 63K items at 4,096 GPUs, 65 ms for 16K), linear in the items, and up to twice
# that on a loaded one
FINISH_S_PER_ITEM = 6e-6
MILP_SHARE = 0.08  # of the time limit, the most one MILP solve may take
# Below this budget, or above this many sequences, the search polishes only its best two
# strategies and refines only the best: four refined polishes cost ~40 ms, which took a 0.1 s
# budget's throughput from 21 to 15 plans/s, and ~0.15 s of the 2 s budget at 1K sequences, where
# the best strategy did not change. They pay off on few, long sequences (heterogeneous plans).
THOROUGH_MIN_BUDGET_S = 0.5
THOROUGH_MAX_SEQUENCES = 512


def solve(
    request: PlanRequest,
    profile: CostProfile,
    baselines: Sequence[str] = (),
    cancel: Callable[[], bool] | None = None,
    previous_plan: Plan | None = None,
    executor: Executor | None = None,
    executor_workers: int = 1,
) -> Plan:
    """Plan one global batch; raises `PlanningError` when the request cannot be planned.

    With an `executor` of `executor_workers` processes (e.g. the fork pool of `hydraplan plan
    --workers N`), the shipped baselines' own plans of the batch are made there while the search
    runs here and, with at least SPECULATION_MIN_WORKERS workers, what the search will likely ask
    for next is computed there ahead of it (`planner.speculation`); the plan is the same as
    without one.

    The search stops at `options.time_limit_s` (`auto`: a share of the step, `planner.budget`),
    or when `cancel()` returns True, with its best incumbent. The shipped baselines' own plans of
    the batch join the search's candidates (`planner.portfolio`). `previous_plan` (or
    `request.previous_strategy`) makes strategy switches cost their re-sharding time. Every
    returned plan has passed `check_plan`.
    """
    load_backend(request.options.solver)
    started = time.perf_counter()
    if previous_plan is not None and request.previous_strategy is None:
        request = request.model_copy(update={"previous_strategy": previous_plan.strategy})
    require_switch_pricing(request.previous_strategy, profile)
    options = request.options
    pool = _parse_pool(options.strategy_pool)
    if pool is not None:
        _validate_pool(pool, request, ProfileCostModel(profile))
    # the schemes whose groups the placement keeps inside nodes: what the search and its peers use
    placeable = placeable_profile(profile, request.num_gpus, request.gpus_per_node)
    cost = ProfileCostModel(placeable)
    items = _pool_items(request, cost, pool)
    budget_s = _budget_s(request, items, cost)
    settings, clock = _settings(request, budget_s, pool, cancel, started, len(items))
    peers = _peers(request, placeable, cost, items, settings, pool is not None, executor)
    speculative = None
    if executor is not None and executor_workers >= SPECULATION_MIN_WORKERS:
        speculative = SpeculativeSolver(
            executor, executor_workers, placeable, items.lengths, cost, settings.previous, solve_strategy
        )
    result = search(items.lengths, cost, request.num_gpus, settings, clock, budget_s, peers, speculative)
    if result is None:
        space = (
            f"no strategy of the pool ({len(pool)} strategies)"
            if pool
            else f"no strategy of at most {options.max_schemes} scheme(s)"
        )
        raise PlanningError(
            f"{space} on {request.num_gpus} GPUs can hold the {len(items)} sequences "
            "(fewer sequences than pipelines, or capacities too small)"
        )
    best = slowed_best(
        result.best,
        result.runners_up,
        items.lengths,
        cost,
        request.rank_slowdowns or {},
        settings.previous,
        settings.work.refine_rounds,
        clock.stop,
    )
    stats = SolverStats(
        backend=options.solver.value,
        num_schemes=result.num_schemes,
        num_strategies=result.num_strategies,
        num_strategies_solved=result.num_strategies_solved,
        seed=options.seed,
        winner=best.origin,
        time_limit_s=budget_s,
    )
    plan = build_plan(
        request, profile, items, best, result.lower_bound_s, stats, result.timed_out or clock.cut, result.certificate
    )
    return _finish(plan, request, profile, baselines)


def _require_placeable(strategy: Strategy, num_gpus: int, gpus_per_node: int, label: str) -> None:
    for scheme in strategy.schemes:
        reason = unplaceable_reason(scheme, num_gpus, gpus_per_node)
        if reason is not None:
            raise PlanningError(
                f"{label} {strategy}: scheme {scheme} cannot be placed on {gpus_per_node}-GPU nodes: {reason}"
            )


def _peers(
    request: PlanRequest,
    profile: CostProfile,
    cost: ProfileCostModel,
    items: Items,
    settings: SearchSettings,
    pooled: bool,
    executor: Executor | None,
) -> Callable[[], Sequence[Candidate]]:
    """The baselines' own plans of these items (none when the search is restricted to a pool),
    made in `executor` from now on, or here now: on the budget's clock, so the search proper has
    what is left of it (made when the search asked, they came on top of it: at 8B / 1,024 H100 a
    2 s budget took ~4.5 s)."""
    options = request.options
    if pooled:
        return tuple
    if executor is None:
        made = peer_candidates(
            items.lengths, cost, request.num_gpus, options.max_schemes, options.seed, settings.previous
        )
        return lambda: made
    args = (items.lengths, request.num_gpus, options.max_schemes, options.seed, request.previous_strategy)
    return executor.submit(peer_task, profile, *args).result


def load_backend(backend: SolverBackend) -> None:
    """Import the backend's solver library, read the bubble-floor table and load the compiled
    kernels now, so a first import (0.5-1 s for OR-Tools, 0.3-0.5 s for Numba and its cache) is
    not charged to the planning-time budget. Later calls are free."""
    if backend in (SolverBackend.AUTO, SolverBackend.CPSAT):
        import ortools.sat.python.cp_model  # noqa: F401
    if backend == SolverBackend.PULP:
        import pulp  # noqa: F401
    if backend in (SolverBackend.AUTO, SolverBackend.LP):
        import highspy  # noqa: F401
    tabulated_floors(2, 1 / 3)  # reads the bubble-floor table once per process
    warm_up()  # compiles the search's kernels, or loads them from Numba's cache, once per process


def planning_budget_s(request: PlanRequest, profile: CostProfile) -> float:
    """The budget `solve` runs `request` under, in seconds: its time limit, or `auto` resolved for
    the batch (what the plan will record in `solver.time_limit_s`); a few ms, for a caller that
    says it before planning. Raises `PlanningError` where `solve` would refuse the batch's items."""
    cost = ProfileCostModel(placeable_profile(profile, request.num_gpus, request.gpus_per_node))
    items = _pool_items(request, cost, _parse_pool(request.options.strategy_pool))
    return _budget_s(request, items, cost)


def _budget_s(request: PlanRequest, items: Items, cost: ProfileCostModel) -> float:
    """The request's time limit in seconds: as given, or `auto`'s share of the step (`planner.budget`)."""
    return resolved_budget_s(request.options.time_limit_s, items.lengths, cost, request.num_gpus)


def _pool_items(request: PlanRequest, cost: ProfileCostModel, pool: tuple[Strategy, ...] | None) -> Items:
    """The request's items, oversize sequences handled against the pool's schemes (all without one)."""
    return _prepare_items(request, cost, sorted({s for p in pool for s in p.schemes}) if pool else None)


def _settings(
    request: PlanRequest,
    budget_s: float,
    pool: tuple[Strategy, ...] | None,
    cancel: Callable[[], bool] | None,
    started: float,
    num_items: int,
) -> tuple[SearchSettings, Clock]:
    options = request.options
    finish_s = max(budget_s * FINISH_SHARE, num_items * FINISH_S_PER_ITEM)
    deadline = started + budget_s - finish_s
    clock = Clock(remaining_s=lambda: deadline - time.perf_counter(), cancelled=cancel or (lambda: False))
    settings = SearchSettings(
        backend=options.solver,
        max_schemes=options.max_schemes,
        max_strategies_solved=options.max_strategies_solved,
        seed=options.seed,
        pool=pool,
        previous=_parse(request.previous_strategy, "previous_strategy") if request.previous_strategy else None,
        milp_budget_s=budget_s * MILP_SHARE,
        thorough=budget_s >= THOROUGH_MIN_BUDGET_S and len(request.lengths) <= THOROUGH_MAX_SEQUENCES,
        work=WorkLimits.for_budget(budget_s),
    )
    return settings, clock


def _parse(text: str, field: str) -> Strategy:
    try:
        return parse_strategy(text)
    except ValueError as error:
        raise PlanningError(f"{field}: {error}") from None


def _validate_pool(pool: tuple[Strategy, ...], request: PlanRequest, cost: ProfileCostModel) -> None:
    for index, strategy in enumerate(pool):
        if strategy.num_gpus != request.num_gpus:
            raise PlanningError(
                f"strategy_pool[{index}] {strategy} uses {strategy.num_gpus} GPUs, the cluster has {request.num_gpus}"
            )
        _require_priced(strategy, cost, f"strategy_pool[{index}] {strategy}")
        _require_placeable(strategy, request.num_gpus, request.gpus_per_node, f"strategy_pool[{index}]")


def _require_priced(strategy: Strategy, cost: ProfileCostModel, label: str) -> None:
    """Every scheme of the strategy has an entry in the profile (an interleaved one its own, and
    layers that split into its pp x v chunks)."""
    for scheme in strategy.schemes:
        try:
            scheme.check_layers(cost.profile.num_layers)
            cost.coefficients(scheme)
        except ValueError as error:
            raise PlanningError(f"{label}: {error}") from None


def _parse_pool(texts: list[str] | None) -> tuple[Strategy, ...] | None:
    if texts is None:
        return None
    if not texts:
        raise PlanningError("strategy_pool is empty")
    return tuple(_parse(text, f"strategy_pool[{index}]") for index, text in enumerate(texts))


def evaluate_strategy(
    request: PlanRequest, profile: CostProfile, strategy: Sequence[tuple[ParallelScheme, int]] | Strategy
) -> Plan:
    """Plan the batch on a fixed strategy (no search): dispatch, packing, simulation, check."""
    load_backend(request.options.solver)
    started = time.perf_counter()
    require_switch_pricing(request.previous_strategy, profile)
    fixed = strategy if isinstance(strategy, Strategy) else Strategy.of(list(strategy))
    if fixed.num_gpus != request.num_gpus:
        raise PlanningError(f"strategy {fixed} uses {fixed.num_gpus} GPUs, the cluster has {request.num_gpus}")
    cost = ProfileCostModel(profile)
    _require_priced(fixed, cost, "strategy")
    _require_placeable(fixed, request.num_gpus, request.gpus_per_node, "strategy")
    items = _prepare_items(request, cost, fixed.schemes)
    budget_s = _budget_s(request, items, cost)
    settings, clock = _settings(request, budget_s, None, cancel=None, started=started, num_items=len(items))
    candidate = solve_fixed(fixed, items.lengths, cost, settings, clock)
    if candidate is None:
        raise PlanningError(f"strategy {fixed} cannot hold the {len(items)} sequences (too few sequences or capacity)")
    distinct = list(dict.fromkeys(candidate.coefs))
    tables = BoundTables.build(items.lengths, distinct)
    counts = np.array([[sum(1 for coef in candidate.coefs if coef == kind) for kind in distinct]])
    pipeline_bound = float(tables.count_bounds(list(range(len(distinct))), counts)[1][0])
    bound = pipeline_bound + candidate.grad_sync_s + candidate.switch_cost_s
    stats = SolverStats(
        backend=f"fixed-strategy:{request.options.solver.value}",
        num_schemes=len(fixed.schemes),
        num_strategies=1,
        num_strategies_solved=1,
        seed=request.options.seed,
        time_limit_s=budget_s,
    )
    certificate = fixed_certificate(tables, counts, bound, request.options.max_schemes)
    # the bound above is of the profile's (unscaled) times: slow ranks' factors >= 1 keep it valid
    slow, rounds = request.rank_slowdowns or {}, settings.work.refine_rounds
    candidate = slowed_best(candidate, (), items.lengths, cost, slow, settings.previous, rounds, clock.stop)
    plan = build_plan(request, profile, items, candidate, bound, stats, clock.cut, certificate)
    return _finish(plan, request, profile, ())


def _prepare_items(
    request: PlanRequest, cost: ProfileCostModel, schemes: Sequence[ParallelScheme] | None = None
) -> Items:
    usable = [scheme for scheme in (schemes or cost.schemes()) if scheme.num_gpus <= request.num_gpus]
    if not usable:
        smallest = min(cost.schemes(), key=lambda scheme: scheme.num_gpus)
        raise PlanningError(
            f"no scheme of the cost profile fits {request.num_gpus} GPUs "
            f"(the smallest, {smallest}, needs {smallest.num_gpus})"
        )
    largest_capacity = max(cost.capacity_tokens(scheme) for scheme in usable)
    return prepare_items(request.lengths, largest_capacity, request.options.oversize)


def _finish(plan: Plan, request: PlanRequest, profile: CostProfile, baselines: Sequence[str]) -> Plan:
    violations = check_plan(plan)
    if violations:
        raise AssertionError("planner produced an invalid plan: " + "; ".join(violations[:5]))
    if baselines:
        from hydraplan.planner.baselines import BASELINES, run_baseline

        results = []
        for name in baselines:
            try:
                baseline = run_baseline(name, request, profile)
            except ValueError as error:  # PlanningError & co: this baseline cannot plan the batch
                if name not in BASELINES:
                    raise
                results.append(BaselineResult(name=name, error=" ".join(str(error).split())))
                continue
            results.append(
                BaselineResult(
                    name=name,
                    strategy=baseline.strategy,
                    step_time_s=baseline.step_time_s,
                    speedup=baseline.step_time_s / plan.step_time_s,
                )
            )
        plan = identified(plan.model_copy(update={"baselines": results}))
    return plan
