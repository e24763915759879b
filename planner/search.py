"""Strategy search: branch and bound over scheme sets, greedy dispatch + packing per strategy.

Scheme sets are ordered by their lower bound (`planner.bounds`); a set is explored only while its
bound beats the incumbent, so the minimum bound over all sets stays a valid global lower bound.
Within a set, the pipeline counts nearest to the fluid optimum are tried first.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from planner.bounds import BoundTables, sync_lower_bound_s
from planner.cost import ProfileCostModel, SchemeCoefficients
from planner.dispatch import greedy_dispatch
from planner.packing import PackedPipeline, pack_pipeline
from planner.strategies import Strategy, count_vectors

MAX_COUNT_VECTORS_PER_SET = 3
MAX_SETS_EXPLORED = 40
EXHAUSTIVE_COUNT_LIMIT = 200


@dataclass(frozen=True)
class Candidate:
    """A complete solution: strategy, item assignment, packing and its true step time."""

    strategy: Strategy
    coefs: tuple[SchemeCoefficients, ...]  # one per pipeline, placement order
    assignment: tuple[np.ndarray, ...]  # item indices per pipeline
    packed: tuple[PackedPipeline, ...]
    grad_sync_s: float

    @property
    def step_time_s(self) -> float:
        return max(pipeline.time_s for pipeline in self.packed) + self.grad_sync_s


@dataclass(frozen=True)
class SearchResult:
    best: Candidate
    lower_bound_s: float
    num_schemes: int
    num_strategies: int
    num_strategies_solved: int
    timed_out: bool


def solve_strategy(strategy: Strategy, lengths: np.ndarray, cost: ProfileCostModel) -> Candidate | None:
    """Greedy dispatch then packing for one fixed strategy; None if some pipeline gets no item."""
    schemes = strategy.pipeline_schemes()
    coefs = tuple(cost.coefficients(scheme) for scheme in schemes)
    if len(lengths) < len(coefs) or lengths.max() > max(coef.capacity_tokens for coef in coefs):
        return None
    assignment = greedy_dispatch(lengths, coefs)
    if assignment is None:
        return None
    packed = tuple(pack_pipeline(items, lengths, coef) for items, coef in zip(assignment, coefs))
    return Candidate(strategy, coefs, tuple(assignment), packed, cost.grad_sync_s(schemes))


def runnable_schemes(cost: ProfileCostModel, num_gpus: int) -> list[SchemeCoefficients]:
    """Schemes that fit the cluster, without those another scheme dominates."""
    fitting = [cost.coefficients(scheme) for scheme in cost.schemes() if scheme.num_gpus <= num_gpus]
    return [coef for coef in fitting if not any(_dominates(other, coef) for other in fitting if other is not coef)]


def _dominates(better: SchemeCoefficients, worse: SchemeCoefficients) -> bool:
    """Same GPUs and no worse in every cost, capacity, bubble and sync term."""
    pairs = [
        (better.a, worse.a),
        (better.b, worse.b),
        (better.c, worse.c),
        (better.scheme.pp, worse.scheme.pp),
        (better.scheme.cp, worse.scheme.cp),
        (better.grad_bytes_per_gpu, worse.grad_bytes_per_gpu),
        (-better.capacity_tokens, -worse.capacity_tokens),
        (better.fwd_fraction, worse.fwd_fraction),
    ]
    no_worse = all(left <= right for left, right in pairs)
    strictly = any(left < right for left, right in pairs) or better.scheme < worse.scheme
    return better.scheme.num_gpus == worse.scheme.num_gpus and no_worse and strictly


def search(
    lengths: np.ndarray,
    cost: ProfileCostModel,
    num_gpus: int,
    max_schemes: int,
    should_stop: Callable[[], bool],
) -> SearchResult | None:
    """Best strategy found and a valid lower bound; None when no strategy can hold the items."""
    coefs = runnable_schemes(cost, num_gpus)
    tables = BoundTables.build(lengths, coefs)
    bounded = _bounded_sets(tables, coefs, cost, num_gpus, max_schemes)
    if not bounded:
        return None
    incumbent: Candidate | None = None
    num_solved = 0
    timed_out = False
    for explored, (bound_s, columns) in enumerate(bounded):
        if incumbent is not None and (bound_s >= incumbent.step_time_s or explored >= MAX_SETS_EXPLORED):
            break
        if should_stop() and incumbent is not None:
            timed_out = True
            break
        combo = [coefs[column] for column in columns]
        for counts in _count_candidates(tables, columns, combo, num_gpus):
            strategy = Strategy.of([(coef.scheme, count) for coef, count in zip(combo, counts)])
            candidate = solve_strategy(strategy, lengths, cost)
            num_solved += 1
            if candidate is not None and (incumbent is None or candidate.step_time_s < incumbent.step_time_s):
                incumbent = candidate
    if incumbent is None:
        return None
    lower_bound = min(bounded[0][0], incumbent.step_time_s)
    return SearchResult(incumbent, lower_bound, len(coefs), len(bounded), num_solved, timed_out)


def _bounded_sets(
    tables: BoundTables, coefs: Sequence[SchemeCoefficients], cost: ProfileCostModel, num_gpus: int, max_schemes: int
) -> list[tuple[float, tuple[int, ...]]]:
    """Every fillable scheme set with its lower bound, best first (ties: fewer schemes first)."""
    sizes = [coef.scheme.num_gpus for coef in coefs]
    bounded = []
    for columns, pipeline_bound in tables.all_set_bounds(max_schemes, num_gpus):
        if not _fillable(tuple(sorted(sizes[column] for column in columns)), num_gpus):
            continue
        sync = sync_lower_bound_s(cost, [coefs[column] for column in columns], num_gpus)
        bounded.append((pipeline_bound + sync, columns))
    bounded.sort(key=lambda entry: (entry[0], len(entry[1]), entry[1]))
    return bounded


@lru_cache(maxsize=4096)
def _fillable(sizes: tuple[int, ...], num_gpus: int) -> bool:
    """Whether at least one pipeline of each size can use exactly `num_gpus` GPUs."""
    remainder = num_gpus - sum(sizes)
    if remainder < 0 or remainder % math.gcd(*sizes):
        return False
    reachable = [True] + [False] * remainder
    for value in range(1, remainder + 1):
        reachable[value] = any(size <= value and reachable[value - size] for size in sizes)
    return reachable[remainder]


def _count_candidates(
    tables: BoundTables, columns: Sequence[int], combo: Sequence[SchemeCoefficients], num_gpus: int
) -> list[tuple[int, ...]]:
    """Pipeline counts for a scheme set, nearest (in GPUs) to the fluid optimum first."""
    ideal = tables.ideal_counts(columns, num_gpus)
    sizes = [coef.scheme.num_gpus for coef in combo]
    options = list(itertools.islice(count_vectors([coef.scheme for coef in combo], num_gpus), EXHAUSTIVE_COUNT_LIMIT + 1))
    if len(options) > EXHAUSTIVE_COUNT_LIMIT:
        options = _near_ideal(ideal, sizes, num_gpus)

    def distance(counts: tuple[int, ...]) -> tuple[float, tuple[int, ...]]:
        return (sum(abs(count - want) * size for count, want, size in zip(counts, ideal, sizes)), counts)

    return sorted(options, key=distance)[:MAX_COUNT_VECTORS_PER_SET]


def _near_ideal(ideal: Sequence[float], sizes: Sequence[int], num_gpus: int) -> list[tuple[int, ...]]:
    """Integer count vectors within two pipelines of the ideal on every scheme but the filler."""
    filler = int(np.argmin(sizes))
    ranges = []
    for index, want in enumerate(ideal):
        if index == filler:
            ranges.append([0])
            continue
        base = int(math.floor(want))
        ranges.append(sorted({max(1, base + delta) for delta in (-1, 0, 1, 2)}))
    vectors = []
    for choice in itertools.product(*ranges):
        remainder = num_gpus - sum(count * size for index, (count, size) in enumerate(zip(choice, sizes)) if index != filler)
        if remainder >= sizes[filler] and remainder % sizes[filler] == 0:
            counts = list(choice)
            counts[filler] = remainder // sizes[filler]
            vectors.append(tuple(counts))
    return vectors
