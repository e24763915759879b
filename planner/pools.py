"""Strategy pools: a few strategies that serve a whole dataset well.

A runtime must prepare (build process groups for, shard weights into) every strategy it may switch
to, so it wants a small pool. Hydraulis picks its pool with a dynamic program over length
intervals; we instead evaluate candidate strategies on sampled batches of the dataset, which
measures the true planner objective rather than a proxy:

1. plan every sample batch with the full search and keep its best strategies as candidates;
2. solve every candidate on every batch (greedy dispatch + packing): a matrix of step times, the
   batches' best strategies first, row by row while the budget lasts (EVALUATION_SHARE of it is
   kept for this);
3. choose `pool_size` candidates minimising the mean over batches of the best pool member's step
   time (facility location): greedy additions, then single swaps while they help.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.planner.budget import resolved_budget_s
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.errors import PlanningError
from hydraplan.planner.items import prepare_items
from hydraplan.planner.schemas import CostProfile, PlanRequest
from hydraplan.planner.search import Clock, SearchSettings, search, solve_strategy
from hydraplan.planner.strategies import Strategy

# the least search time a sample batch gets, and the most sample batches a proposal takes: each
# batch is searched, then solved once per candidate (about nine per batch), so the work grows with
# the square of the batches; 256 at the least time is 13 s of search
MIN_BATCH_BUDGET_S = 0.05
MAX_POOL_BATCHES = 256
EVALUATION_SHARE = 0.25  # of the budget kept for solving the candidates on every batch


def least_budget_s(num_batches: int) -> float:
    """The smallest budget `propose_pool` can honour for this many sample batches."""
    return num_batches * MIN_BATCH_BUDGET_S / (1 - EVALUATION_SHARE)


@dataclass(frozen=True)
class PoolMember:
    strategy: Strategy
    share: float  # of the sample batches on which it is the pool's fastest member
    mean_step_time_s: float  # over the batches it serves


@dataclass(frozen=True)
class StrategyPool:
    members: tuple[PoolMember, ...]
    expected_step_time_s: float  # mean over sample batches, each on its fastest pool member
    unrestricted_step_time_s: float  # mean of each batch's best candidate (no pool limit)
    best_single_step_time_s: float  # mean with the best single strategy for every batch
    num_batches: int
    num_candidates: int
    num_evaluated: int  # candidates solved on every batch before the budget ran out (the pool's choice)


def propose_pool(
    batches: Sequence[list[int]],
    profile: CostProfile,
    template: PlanRequest,
    pool_size: int,
    clock: Callable[[], float] = lambda: float("inf"),
) -> StrategyPool:
    """The pool of `pool_size` strategies with the least expected step time over `batches`.

    `template` gives the cluster and solver options (its lengths are ignored); `clock()` returns
    the seconds left for the whole proposal (the caller's budget): the searches share all of it
    but EVALUATION_SHARE, the candidates are solved on the batches (the first always, the batches'
    best strategies first) while time is left.
    """
    if pool_size < 1:
        raise PlanningError(f"pool_size must be >= 1, got {pool_size}")
    if not batches:
        raise PlanningError("no sample batches to build a pool from")
    if len(batches) > MAX_POOL_BATCHES:
        raise PlanningError(f"{len(batches)} sample batches: at most {MAX_POOL_BATCHES}")
    cost = ProfileCostModel(profile)
    largest = max(cost.capacity_tokens(s) for s in cost.schemes() if s.num_gpus <= template.num_gpus)
    item_lengths = [prepare_items(batch, largest, template.options.oversize).lengths for batch in batches]
    start_s = clock()
    kept_s = EVALUATION_SHARE * start_s if math.isfinite(start_s) else 0.0
    candidates = _candidates(item_lengths, cost, template, lambda: clock() - kept_s)
    rows = []
    for strategy in candidates:
        if rows and clock() <= 0:
            break
        rows.append([_step_time(strategy, lengths, cost) for lengths in item_lengths])
    times = np.array(rows)
    chosen = _facility_location(times, min(pool_size, len(rows)))
    served = times[chosen].argmin(axis=0)
    members = tuple(
        PoolMember(
            strategy=candidates[index],
            share=float(np.mean(served == position)),
            mean_step_time_s=float(times[index, served == position].mean()) if np.any(served == position) else 0.0,
        )
        for position, index in enumerate(chosen)
    )
    return StrategyPool(
        members=members,
        expected_step_time_s=float(times[chosen].min(axis=0).mean()),
        unrestricted_step_time_s=float(times.min(axis=0).mean()),
        best_single_step_time_s=float(times.mean(axis=1).min()),
        num_batches=len(batches),
        num_candidates=len(candidates),
        num_evaluated=len(rows),
    )


def _candidates(item_lengths, cost: ProfileCostModel, template: PlanRequest, clock) -> list[Strategy]:
    options = template.options
    settings = SearchSettings(
        backend=options.solver,
        max_schemes=options.max_schemes,
        max_strategies_solved=options.max_strategies_solved,
        seed=options.seed,
    )
    best: dict[Strategy, None] = {}
    runners_up: dict[Strategy, None] = {}
    for index, lengths in enumerate(item_lengths):
        limit_s = resolved_budget_s(options.time_limit_s, lengths, cost, template.num_gpus)
        budget_s = max(MIN_BATCH_BUDGET_S, min(limit_s, clock() / (len(item_lengths) - index)))
        batch_clock = _budget_clock(budget_s)
        result = search(lengths, cost, template.num_gpus, settings, batch_clock, budget_s)
        if result is None:
            raise PlanningError(f"sample batch {index} ({len(lengths)} sequences) cannot be planned")
        best.setdefault(result.best.strategy)
        for strategy in result.runners_up:
            runners_up.setdefault(strategy)
    return [*best, *(strategy for strategy in runners_up if strategy not in best)]


def _budget_clock(budget_s: float) -> Clock:
    deadline = time.perf_counter() + budget_s
    return Clock(remaining_s=lambda: deadline - time.perf_counter(), cancelled=lambda: False)


def _step_time(strategy: Strategy, lengths: np.ndarray, cost: ProfileCostModel) -> float:
    candidate = solve_strategy(strategy, lengths, cost)
    return candidate.step_time_s if candidate is not None else float("inf")


def _facility_location(times: np.ndarray, pool_size: int) -> list[int]:
    """Rows minimising the mean over columns of the column minimum: greedy, then best swaps."""

    def expected(rows: list[int]) -> float:
        return float(times[rows].min(axis=0).mean())

    chosen: list[int] = []
    for _ in range(pool_size):
        rest = [row for row in range(len(times)) if row not in chosen]
        chosen.append(min(rest, key=lambda row: (expected(chosen + [row]), row)))
    improved = True
    while improved:
        improved = False
        for position in range(len(chosen)):
            for row in range(len(times)):
                if row in chosen:
                    continue
                trial = chosen[:position] + [row] + chosen[position + 1 :]
                if expected(trial) < expected(chosen) - 1e-12:
                    chosen, improved = trial, True
    return chosen
