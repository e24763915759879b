"""Slow ranks (issue 31, item 3): pipelines that hold one get less work.

A request's `rank_slowdowns` maps ranks to factors >= 1 (a factor f: the rank takes f times the
profile's time for the same work). The model, stated:

- **a pipeline runs at its slowest rank's pace.** Its stage times (a, b and c of its scheme) are
  all scaled by the largest factor among its ranks. In 1F1B the slowest stage paces the steady
  state, and a slow TP or CP rank holds its whole stage back at every collective; scaling every
  stage (the bubbles too) is the upper side of that for a pipeline whose slow rank sits in one
  stage of several;
- **placement is not changed.** Pipelines keep the contiguous rank blocks of
  `strategies.place_pipelines` (the runtime's layout and the node rules stay as they are), so the
  slow ranks are known per pipeline before dispatch; a slow rank is not moved into a pipeline of
  other slow ranks (not done: with contiguous blocks that needs a permutation of ranks the
  runtime would have to follow);
- **the search's strategy choice is kept**, priced without the factors; then the chosen strategy
  and its runners-up are dispatched again with the scaled coefficients (greedy dispatch, the LP
  dispatch, refinement: `slowed_candidate`) and the fastest of them is the plan. The search's
  lower bound stays valid: factors >= 1 only make every stage time, hence every step, longer.

The plan says the factors it used (`Plan.rank_slowdowns`, `PipelinePlan.slowdown`) and the
checker (`planner.check`) recomputes every stage time with them, by its own code.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from hydraplan.planner.candidate import Candidate
from hydraplan.planner.cost import ProfileCostModel, SchemeCoefficients
from hydraplan.planner.packing import pack_pipeline
from hydraplan.planner.refine import refine
from hydraplan.planner.search import lp_candidate, solve_strategy
from hydraplan.planner.strategies import Strategy, place_pipelines

__all__ = ["effective_slowdowns", "pipeline_slowdowns", "scaled", "slowed_best", "slowed_candidate"]


def effective_slowdowns(rank_slowdowns: Mapping[int, float] | None) -> dict[int, float]:
    """The factors that change anything: those above 1, by rank."""
    return {int(rank): float(factor) for rank, factor in sorted((rank_slowdowns or {}).items()) if factor > 1.0}


def pipeline_slowdowns(strategy: Strategy, rank_slowdowns: Mapping[int, float]) -> list[float]:
    """Per pipeline of the strategy (placement order): the largest factor among its ranks (1.0 when
    it holds no slow rank)."""
    return [
        max((rank_slowdowns.get(rank, 1.0) for rank in placement.ranks), default=1.0)
        for placement in place_pipelines(strategy.pipeline_schemes())
    ]


def scaled(coef: SchemeCoefficients, factor: float) -> SchemeCoefficients:
    """The scheme's stage-time coefficients of a pipeline `factor` times slower (capacity, sync
    and forward share unchanged)."""
    if factor == 1.0:
        return coef
    return dataclasses.replace(coef, a=coef.a * factor, b=coef.b * factor, c=coef.c * factor)


def slowed_candidate(
    strategy: Strategy,
    lengths: np.ndarray,
    cost: ProfileCostModel,
    rank_slowdowns: Mapping[int, float],
    previous: Strategy | None,
    refine_rounds: int,
    should_stop: Callable[[], bool],
) -> Candidate | None:
    """The strategy dispatched and packed with each pipeline's coefficients scaled by its factor:
    greedy dispatch, the LP dispatch (with the greedy packing's inflation) when it does better,
    then `refine_rounds` of refinement. None when some pipeline can get no item."""
    factors = pipeline_slowdowns(strategy, rank_slowdowns)
    coefs = tuple(
        scaled(cost.coefficients(scheme), factor) for scheme, factor in zip(strategy.pipeline_schemes(), factors)
    )
    candidate = solve_strategy(strategy, lengths, cost, previous, coefs)
    if candidate is None:
        return None
    by_lp = lp_candidate(candidate, lengths, cost, previous)
    if by_lp is not None and by_lp.objective_s < candidate.objective_s:
        candidate = by_lp
    return refine(candidate, lengths, refine_rounds, should_stop)


def slowed_best(
    best: Candidate,
    runners_up: Sequence[Strategy],
    lengths: np.ndarray,
    cost: ProfileCostModel,
    rank_slowdowns: Mapping[int, float],
    previous: Strategy | None,
    refine_rounds: int,
    should_stop: Callable[[], bool],
) -> Candidate:
    """The fastest of the search's strategy and its runners-up, each dispatched with the slow
    ranks' factors (`slowed_candidate`), and of `best`'s own assignment re-packed with them;
    `best` itself when no factor is above 1."""
    factors = effective_slowdowns(rank_slowdowns)
    if not factors:
        return best
    # the search's own assignment, re-priced, is always a candidate
    chosen = _rescaled(best, lengths, factors)
    if not math.isfinite(chosen.objective_s):
        chosen = None
    for strategy in dict.fromkeys([best.strategy, *runners_up]):
        candidate = slowed_candidate(strategy, lengths, cost, factors, previous, refine_rounds, should_stop)
        if candidate is None or not math.isfinite(candidate.objective_s):  # e.g. an interleaved count refused
            continue
        if chosen is None or candidate.objective_s < chosen.objective_s:
            chosen = dataclasses.replace(candidate, origin=best.origin if strategy == best.strategy else "search")
    return chosen if chosen is not None else _rescaled(best, lengths, factors)


def _rescaled(candidate: Candidate, lengths: np.ndarray, rank_slowdowns: Mapping[int, float]) -> Candidate:
    """The candidate's own assignment, re-packed with its pipelines' scaled coefficients."""
    factors = pipeline_slowdowns(candidate.strategy, rank_slowdowns)
    coefs = tuple(scaled(coef, factor) for coef, factor in zip(candidate.coefs, factors))
    packed = tuple(pack_pipeline(items, lengths, coef) for items, coef in zip(candidate.assignment, coefs))
    return dataclasses.replace(candidate, coefs=coefs, packed=packed)
