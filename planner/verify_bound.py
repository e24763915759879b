"""The independent verifier of a plan's lower bound: it recomputes the bound from the plan's
`BoundCertificate` with its own code, trusting nothing the solver reported.

Like the checker (`planner.check`), it shares none of the solver's code: it imports only the
boundary types and the checker's reference costs (`planner.reference`). It

1. defines the strategy space itself: every strategy of at most `max_schemes` distinct schemes of
   the profile that can be placed on the cluster (its own reading of the placement rule) and uses
   exactly its GPUs (`space` 'search'); the request's pool ('pool'); the plan's strategy ('fixed');
2. reduces the schemes to the certificate's: every placeable scheme left out must be dominated by a
   listed one (same GPUs, no worse in `a`, `b`, `c`, stages, CP, gradient bytes and sync time,
   capacity and forward share), whose plans are then no slower (the solver's assumption too);
3. enumerates every scheme set of the space that can fill the cluster and bounds each (below); a set
   the certificate lists as expanded is bounded strategy by strategy instead (the verifier lists its
   count vectors itself), with the certificate's multipliers where it gives them;
4. reports the verified bound, the least of these, and fails when it is below the plan's
   `lower_bound_s` by more than `RELATIVE_TOLERANCE`, naming each set or strategy below it.

**Bounds** (times in seconds; item i of length l on scheme s: work `w = a l^2 + b l`, capacity
`cap`, `g` GPUs, `pp` stages, forward share f, micro-batch overhead c; an item fits s when
`l <= cap`):

* *area*: a pipeline's time is at least its stage-0 work plus `c` per micro-batch, and it runs at
  least `tokens / cap` micro-batches, so with `u = w + c l / cap`, `N T >= sum_i min_s g_s u_is`;
* *longest item*: the micro-batch holding item i crosses every stage forwards and backwards:
  `T >= min_s pp_s (w_is + c_s)`;
* *bubble floors* (from their definition): with `S = W + m c` (work W, m micro-batches),
  the 1F1B schedule has the path `S + (pp-1)(f t_1 + (1-f) t_m) >= W + pp c`, and the path of
  `planner.bubble_floor`'s docstring (item 1) `T >= (1 + k / m) S`, `k = max(0, 1-2f)(pp-1)`, whose
  least over m is `(sqrt(W) + sqrt(k c))^2`. So `T_p >= g(W) = W + h(W)`, `h = max(pp c, k c +
  2 sqrt(k c W))`, increasing with `h(W) / W` non-increasing. An interleaved scheme (v chunks per
  rank; a, b, c then price a rank's v chunks) runs a positive multiple of pp micro-batches (the
  checker's rule) and has the fill-and-drain path: rank pp-1 starts after pp-1 chunk forwards, runs
  its S, and its last backward is followed by pp-1 chunk backwards, `T >= S + (pp-1) c / v`; so
  `h = (pp + (pp-1)/v) c` (`_interleaved_floors`) in the cheap bounds. Under a step time `T_cap`
  (`pricing_cap_s`) every item's work then costs at least `w (1 + h(T_cap) / T_cap)`: a set's
  area may use that pricing per scheme, the set's bound being min(T_cap, that bound);
* *fluid dual* (per strategy, `n_s` pipelines of s): every pipeline has `T_p >= sum u_is + (pp-1) c`
  (interleaved: `(pp-1) c / v`),
  so for any `lambda >= 0`, `T >= (sum_i min_s lambda_s u_is + sum_s lambda_s n_s (pp_s-1) c_s) /
  sum_s lambda_s n_s` (a scheme of zero weight prices its items at 0, one an item does not fit
  cannot take it); and from a valid bound T0, `W_p <= G(T) <= T - (T0 - G(T0))` for every
  pipeline (`G` the inverse of g), the same dual with costs `w` and those floors;
* *gradient sync*: the ring all-reduce of `planner.reference.grad_sync_s` over the fewest weight
  replicas a set allows (`max(sum of its cp, N / max(g/cp))`) and its largest shard; a strategy's
  exact replicas.

**Costlier bounds, at the claimed time.** The bounds above are cheap and cover most of the space.
A part (set or strategy) they leave below the claimed bound T* is then tested at T* itself (a hair
under it: `aim`), which needs no witness from the solver: the claim is the step time to be shown
infeasible, and the verifier finds the rest with its own code. In order, least parts first (once
more than MAX_NAMED parts stay below, the claim fails and the rest are not raised):

* *LP bubble floors* (`least_bubble`): rho_m, the least relative bubble of m micro-batches,
  re-solved here by LP with highspy from `reference.one_f_one_b_order`'s dependency rules (not the
  solver's table), only for the counts m a floor needs (solved lazily: a floor `g(W) = min_m
  max((1 + r_m)(W + m c), W + (m + pp - 1) c)` solves only the count of its least piece, until
  that piece is solved). They price a set's area under `pricing_cap_s` and the strategies' bubble
  dual (over at most `items - pipelines + 1` micro-batches, with the pipeline holding the longest
  item: `T >= W + E(w*)`, `E` the largest-micro-batch path). An interleaved scheme has its own LP
  (`least_bubble(..., schedule=SCHEDULE_INTERLEAVED, num_chunks=v)`), from the rules of
  `reference.interleaved_rank_order` and `reference.interleaved_pipeline_time_s`: its makespan is
  the longest path of a fixed graph, a maximum of linear functions of the micro-batches' times,
  so convex and positively homogeneous, and a run of m micro-batches (m a multiple of pp) scaled
  to sum 1 is a feasible point of the LP: `T >= (1 + rho_m) S`. Its floor is `g(W) = min over
  m = pp, 2 pp, ... of max((1 + rho_m)(W + m c), W + m c + (pp-1) c / v)`, counts past
  LP_MICRO_BATCHES by the fill-and-drain term alone;
* *replica split* (sets): for every threshold R of weight replicas and the verifier's own grid of
  mu, `min(area + sync(R), max(sum_i min_s (g_s + mu cp_s) u_is / (N + mu (R-1)), longest) +
  sync floor)` (`_raised_set_bound_s`);
* *set packing* and *packing* (dual feasible functions: the identity, f_eps and u_k of Fekete &
  Schepers 2001): at T*, an item of work w on scheme s has size `w / min(G_s(T*), T* - E_s(w))`
  and one pipeline's sizes sum to at most 1; a set whose items need more than N GPUs' worth
  (`sum_i min_s g_s f(x_is) > N`), or a strategy whose items need more than its pipelines
  (`sum_i min_s lambda_s f(x_is) > sum_s lambda_s n_s` at some lambda of the verifier's grid or
  the certificate's multipliers for its set: the solver's packing bound searches lambda off its
  grid and puts the one that proved a strategy's bound in the certificate), cannot finish by T*;
  so can a strategy whose witness names a function f_s per scheme, at its multipliers
  (`sum_i min_s lambda_s f_s(x_is) > sum_s lambda_s n_s`: each pipeline's images under its own
  scheme's function sum to at most 1 as well);
* *assignment* (batches of at most FEW_ITEMS items): the search over assignments, its branches cut
  at T*.

`BoundVerification.raised_by` counts the parts each kind lifted to the claim. An interleaved
scheme (v > 1) has no largest-micro-batch path (it is 1F1B's): `E(w)` is the fill-and-drain
`(pp + (pp-1)/v) c` whatever the item; its pipelines' floors in the costlier kinds (`_floor_pieces`,
`_pipeline_floor_s`) are its own LP's above, never below the fill-and-drain one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cache

import numpy as np

from hydraplan.planner import reference
from hydraplan.planner.schemas import BoundCertificate, CostProfile, Plan, PlanRequest

RELATIVE_TOLERANCE = 1e-6  # of the claimed bound: float noise between two ways of summing
MAX_ENUMERATED_STRATEGIES = 20_000  # count vectors of one expanded set the verifier lists
SET_CHUNK_ELEMENTS = 4_000_000  # rows x sets per vectorised step
MAX_NAMED = 10  # parts named in the violations (the rest counted)
FEW_ITEMS = 12  # batches of at most this many items get the assignment bound
MAX_ASSIGNMENT_NODES = 100_000  # per strategy: past it the assignment bound claims nothing
GRID_RESOLUTION = 12  # the verifier's own fluid dual multipliers: steps of 1/12 of the simplex
EXACT_BLOCK_ITEMS = 6  # a pipeline holding at most this many items is timed exactly (4,683 orderings at 6) ...
EXACT_BATCH_ITEMS = 8  # ... in batches of at most this many items; in larger ones, up to
EXACT_BLOCK_ITEMS_LARGE_BATCH = 3

Scheme = reference.Scheme


@dataclass
class BoundVerification:
    """What the verifier proved: `verified_bound_s` (the least bound over the covered space) and
    every violation (empty when the claimed bound is verified)."""

    claimed_bound_s: float
    verified_bound_s: float
    violations: list[str] = field(default_factory=list)
    num_sets: int = 0  # scheme sets of the space (after the dominance reduction)
    num_expanded_sets: int = 0
    num_strategies: int = 0  # strategies bounded one by one
    # parts the cheap bounds left below the claim, by the costlier kind that raised each to it
    raised_by: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclass(frozen=True)
class _Columns:
    """The certificate's schemes as arrays (one entry per scheme)."""

    schemes: list[Scheme]
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    capacity: np.ndarray
    gpus: np.ndarray
    stages: np.ndarray
    cp: np.ndarray
    fwd: np.ndarray
    sync_factor: np.ndarray  # seconds per ring factor of its largest shard
    chunks: np.ndarray  # v: model chunks per PP rank (1: plain 1F1B)


@dataclass(frozen=True)
class _Tables:
    """Per distinct item length (rows) and scheme (columns); inf where the item does not fit."""

    multiplicity: np.ndarray
    work: np.ndarray  # w = a l^2 + b l
    unit_cost: np.ndarray  # u = w + c l / cap
    gpu_cost: np.ndarray  # g u
    longest: np.ndarray  # pp (w + c)
    items: np.ndarray  # every item's length


def verify_bound(plan: Plan, profile: CostProfile, request: PlanRequest | None = None) -> BoundVerification:
    """Verify `plan.lower_bound_s` from `plan.bound_certificate` against the whole `profile` the
    plan was made with (the plan's own embeds only the schemes it uses) and, when given, the
    request (its `max_schemes` and pool define the space; without it the certificate's are taken).
    The plan itself must have passed `planner.check.check_plan`: its items are the placed chunks."""
    claimed = plan.lower_bound_s
    certificate = plan.bound_certificate
    if certificate is None:
        return BoundVerification(claimed, 0.0, ["bound: the plan carries no bound certificate"])
    violations = _check_space(certificate, plan, request)
    columns, column_violations = _columns(certificate, profile, plan)
    violations += column_violations
    if violations:
        return BoundVerification(claimed, 0.0, violations)
    tables = _tables(_item_lengths(plan), columns)
    if certificate.space == "search":
        result = _verify_search(certificate, plan, profile, columns, tables)
    else:
        result = _verify_listed(certificate, plan, profile, request, columns, tables)
    return result


def _check_space(certificate: BoundCertificate, plan: Plan, request: PlanRequest | None) -> list[str]:
    if request is None:
        return []
    options = request.options
    violations = []
    if certificate.max_schemes != options.max_schemes:
        violations.append(
            f"bound certificate: max_schemes {certificate.max_schemes} is not the request's {options.max_schemes}"
        )
    pooled = options.strategy_pool is not None
    if pooled != (certificate.space == "pool"):
        violations.append(f"bound certificate: space {certificate.space!r} but the request has a strategy pool")
    return violations


def _parse_scheme(text: str) -> Scheme:
    """(tp, pp, cp), or (tp, pp, cp, v) for an interleaved scheme (`reference.short_scheme`)."""
    degrees = text.strip().removeprefix("<").removesuffix(">").split(",")
    if len(degrees) not in (3, 4) or not all(degree.strip().isdigit() for degree in degrees):
        raise ValueError(f"scheme {text!r} is not <tp,pp,cp> or <tp,pp,cp,v>")
    tp, pp, cp, *chunks = (int(degree) for degree in degrees)
    if min(tp, pp, cp, *chunks) < 1 or (chunks and chunks[0] > 1 and pp == 1):
        raise ValueError(f"scheme {text!r} is not a valid <tp,pp,cp,v>")
    return reference.short_scheme(tp, pp, cp, *chunks)


def _scheme_text(scheme: Scheme) -> str:
    return "<" + ",".join(map(str, scheme)) + ">"


def _chunks(scheme: Scheme) -> int:
    return scheme[3] if len(scheme) > 3 else 1


def _interleaved_floors(columns: _Columns) -> tuple[np.ndarray, np.ndarray]:
    """Per scheme: the fewest micro-batches a pipeline runs (1, or pp for an interleaved scheme,
    whose count is a positive multiple of pp) and the fill-and-drain floor `(pp-1) c / v` (module
    docstring: 1F1B's `(pp-1) c` at v = 1)."""
    fewest = np.where(columns.chunks > 1, columns.stages, 1.0)
    return fewest, (columns.stages - 1) * columns.c / columns.chunks


def _interleaved_overhead_s(columns: _Columns, column: int) -> float:
    """`T - W` at least for a pipeline of an interleaved scheme: pp micro-batches' overheads at
    least (a positive multiple of pp) and the fill-and-drain floor."""
    fewest, fill_drain = _interleaved_floors(columns)
    return float(fewest[column] * columns.c[column] + fill_drain[column])


def _placeable(scheme: Scheme, num_gpus: int, gpus_per_node: int) -> bool:
    """The cluster rule plans are held to (`planner.check`): TP groups inside nodes, and a TP x CP
    grid no larger than a node inside one, under the planner's largest-grid-first layout: such a
    grid is a whole node or a power of two dividing it; a larger grid is whole nodes, TP dividing
    a node."""
    tp, pp, cp = scheme[:3]
    if tp * pp * cp > num_gpus:
        return False
    if num_gpus <= gpus_per_node:
        return True
    grid = tp * cp
    if grid <= gpus_per_node:
        return grid == gpus_per_node or (grid & (grid - 1) == 0 and gpus_per_node % grid == 0)
    return grid % gpus_per_node == 0 and gpus_per_node % tp == 0


def _columns(certificate: BoundCertificate, profile: CostProfile, plan: Plan) -> tuple[_Columns, list[str]]:
    entries = reference.scheme_entries(profile)
    violations = []
    schemes = []
    for text in certificate.schemes:
        try:
            scheme = _parse_scheme(text)
        except ValueError as error:
            violations.append(f"bound certificate: {error}")
            continue
        if scheme not in entries:
            violations.append(f"bound certificate: scheme {text} is not in the profile")
        elif not _placeable(scheme, plan.num_gpus, plan.gpus_per_node):
            violations.append(f"bound certificate: scheme {text} cannot be placed on the cluster")
        elif scheme in schemes:
            violations.append(f"bound certificate: scheme {text} is listed twice")
        else:
            schemes.append(scheme)
    if not schemes and not violations:
        violations.append("bound certificate: no schemes")
    chosen = [entries[scheme] for scheme in schemes]
    # an interleaved entry prices one of a rank's v chunks: the floors price the rank's micro-batch
    per_rank = [profile.seconds_per_unit * entry.v for entry in chosen]
    columns = _Columns(
        schemes,
        np.array([entry.a * unit for entry, unit in zip(chosen, per_rank)]),
        np.array([entry.b * unit for entry, unit in zip(chosen, per_rank)]),
        np.array([entry.c * unit for entry, unit in zip(chosen, per_rank)]),
        np.array([float(reference.capacity_tokens(profile, entry)) for entry in chosen]),
        np.array([float(scheme[0] * scheme[1] * scheme[2]) for scheme in schemes]),
        np.array([float(scheme[1]) for scheme in schemes]),
        np.array([float(scheme[2]) for scheme in schemes]),
        np.array([entry.fwd_fraction for entry in chosen]),
        np.array([_sync_factor(profile, scheme, entries) for scheme in schemes]),
        np.array([float(_chunks(scheme)) for scheme in schemes]),
    )
    if certificate.space == "search" and not violations:
        violations += _check_dominated(profile, plan, entries, columns)
    return columns, violations


def _sync_factor(profile: CostProfile, scheme: Scheme, entries) -> float:
    entry = entries[scheme]
    bandwidth = entry.grad_sync_bandwidth_bytes_per_s or profile.grad_sync_bandwidth_bytes_per_s
    if bandwidth is None:
        return 0.0
    sync_bytes = entry.grad_bytes_per_gpu if entry.grad_sync_bytes_per_gpu is None else entry.grad_sync_bytes_per_gpu
    return sync_bytes / bandwidth


def _terms(profile: CostProfile, scheme: Scheme, entries) -> tuple[float, ...]:
    """The cost terms a plan's time can only grow with (capacity negated)."""
    entry = entries[scheme]
    pp, cp = scheme[1], scheme[2]
    capacity = reference.capacity_tokens(profile, entry)
    sync = _sync_factor(profile, scheme, entries)
    return (entry.a, entry.b, entry.c, pp, cp, entry.grad_bytes_per_gpu, sync, -capacity, entry.fwd_fraction)


def _check_dominated(profile: CostProfile, plan: Plan, entries, columns: _Columns) -> list[str]:
    """Every placeable scheme left out of the certificate is dominated by a listed one of the same
    schedule (both plain 1F1B, or both interleaved with the same pp and v: the same order of
    operations, so no worse terms give no slower plans)."""
    listed = {scheme: _terms(profile, scheme, entries) for scheme in columns.schemes}
    violations = []
    for scheme in entries:
        if scheme in listed or not _placeable(scheme, plan.num_gpus, plan.gpus_per_node):
            continue
        terms = _terms(profile, scheme, entries)
        gpus = scheme[0] * scheme[1] * scheme[2]
        schedule = (_chunks(scheme), scheme[1] if _chunks(scheme) > 1 else 0)
        if not any(
            other[0] * other[1] * other[2] == gpus
            and (_chunks(other), other[1] if _chunks(other) > 1 else 0) == schedule
            and all(x <= y for x, y in zip(other_terms, terms))
            for other, other_terms in listed.items()
        ):
            violations.append(
                f"bound certificate: scheme {_scheme_text(scheme)} is left out of its schemes "
                "and no listed scheme dominates it"
            )
    return violations


def _item_lengths(plan: Plan) -> np.ndarray:
    return np.array(
        [length for pipeline in plan.pipelines for batch in pipeline.micro_batches for length in batch.lengths],
        dtype=np.float64,
    )


def _tables(lengths: np.ndarray, columns: _Columns) -> _Tables:
    unique, multiplicity = np.unique(lengths, return_counts=True)
    rows = unique[:, None]
    fits = rows <= columns.capacity[None, :]
    work = np.where(fits, columns.a * rows * rows + columns.b * rows, np.inf)
    unit_cost = work + columns.c * rows / columns.capacity
    return _Tables(
        multiplicity.astype(np.float64),
        work,
        unit_cost,
        unit_cost * columns.gpus,
        columns.stages * (work + columns.c),
        lengths,
    )


def _bubble_overhead_s(columns: _Columns, work_s: np.ndarray | float) -> np.ndarray:
    """h(W) per scheme (see the module docstring), for work W (broadcast against the schemes)."""
    k = np.where(columns.chunks > 1, 0.0, np.maximum(0.0, 1.0 - 2.0 * columns.fwd) * (columns.stages - 1))
    fewest, fill_drain = _interleaved_floors(columns)
    work_s = np.maximum(np.asarray(work_s, dtype=np.float64), 0.0)
    return np.maximum(fewest * columns.c + fill_drain, k * columns.c + 2.0 * np.sqrt(k * columns.c * work_s))


def _most_work_s(columns: _Columns, time_s: np.ndarray | float) -> np.ndarray:
    """G(T) per scheme: the most work a pipeline finishing by T can carry (inverse of g; T
    broadcast against the schemes)."""
    k = np.where(columns.chunks > 1, 0.0, np.maximum(0.0, 1.0 - 2.0 * columns.fwd) * (columns.stages - 1))
    fewest, fill_drain = _interleaved_floors(columns)
    time_s = np.maximum(np.asarray(time_s, dtype=np.float64), 0.0)
    root = np.sqrt(time_s) - np.sqrt(k * columns.c)
    by_path = np.where(root > 0, root * root, 0.0)
    return np.maximum(np.minimum(time_s - (fewest * columns.c + fill_drain), by_path), 0.0)


def _sync_s(profile: CostProfile, columns: _Columns, set_columns: Sequence[int], replicas: int) -> float:
    """`reference.grad_sync_s` for `replicas` weight replicas whose largest shard is the set's."""
    if profile.grad_sync_s is not None:
        return profile.grad_sync_s * profile.seconds_per_unit
    if profile.grad_sync_bandwidth_bytes_per_s is None or replicas <= 1:
        return 0.0
    largest = max(float(columns.sync_factor[column]) for column in set_columns)
    return 2 * (replicas - 1) / replicas * largest * profile.grad_sync_exposed_fraction


def _fewest_replicas(columns: _Columns, set_columns: Sequence[int], num_gpus: int) -> int:
    per_replica = max(float(columns.gpus[column] / columns.cp[column]) for column in set_columns)
    return max(int(sum(columns.cp[column] for column in set_columns)), math.ceil(num_gpus / per_replica - 1e-9))


def _fillable(sizes: Sequence[int], num_gpus: int) -> bool:
    """Whether at least one pipeline of each size can use exactly `num_gpus` GPUs: bit r of
    `reachable` says r more GPUs can be filled by further pipelines of these sizes."""
    remainder = num_gpus - sum(sizes)
    if remainder < 0:
        return False
    mask = (1 << (remainder + 1)) - 1
    reachable = 1
    for size in set(sizes):
        for _ in range(remainder // size):
            reachable |= (reachable << size) & mask
    return bool(reachable >> remainder & 1)


def _count_vectors(sizes: Sequence[int], num_gpus: int, most: int) -> list[tuple[int, ...]] | None:
    """Every vector of counts >= 1 with `sum(n_s g_s) = num_gpus`, or None past `most`."""
    vectors: list[tuple[int, ...]] = []

    def extend(index: int, remaining: int, prefix: tuple[int, ...]) -> bool:
        if index == len(sizes) - 1:
            if remaining >= sizes[index] and remaining % sizes[index] == 0:
                vectors.append((*prefix, remaining // sizes[index]))
            return len(vectors) <= most
        rest = sum(sizes[index + 1 :])
        for count in range(1, (remaining - rest) // sizes[index] + 1):
            if not extend(index + 1, remaining - count * sizes[index], (*prefix, count)):
                return False
        return True

    return vectors if extend(0, num_gpus, ()) else None


def _set_bounds_s(
    tables: _Tables, columns: _Columns, sets: np.ndarray, num_gpus: int, cap_s: float | None
) -> np.ndarray:
    """Pipeline-time bounds (area, longest item, bubble-priced area under `cap_s`) of scheme sets
    (sets x width, a shorter set repeating a column), without the sync."""
    priced = None
    if cap_s is not None and cap_s > 0:
        factor = 1.0 + _bubble_overhead_s(columns, cap_s) / cap_s
        bubbled = tables.work * columns.gpus * factor
        finite = np.isfinite(tables.gpu_cost)
        plain_total = (np.where(finite, tables.gpu_cost, 0.0) * tables.multiplicity[:, None]).sum(axis=0)
        bubbled_total = (np.where(finite, bubbled, 0.0) * tables.multiplicity[:, None]).sum(axis=0)
        priced = np.where((bubbled_total > plain_total)[None, :], bubbled, tables.gpu_cost)
    result = np.empty((len(sets), 2))
    chunk = max(1, SET_CHUNK_ELEMENTS // max(1, tables.work.shape[0] * sets.shape[1]))
    for first in range(0, len(sets), chunk):
        part = sets[first : first + chunk]
        longest = tables.longest[:, part].min(axis=2).max(axis=0)
        area = tables.multiplicity @ tables.gpu_cost[:, part].min(axis=2) / num_gpus
        result[first : first + chunk, 0] = np.maximum(area, longest)
        if priced is not None:
            bubbled_area = tables.multiplicity @ priced[:, part].min(axis=2) / num_gpus
            result[first : first + chunk, 1] = np.maximum(bubbled_area, longest)
        else:
            result[first : first + chunk, 1] = -np.inf
    return result


def _all_sets(columns: _Columns, max_schemes: int, num_gpus: int) -> list[tuple[int, ...]]:
    sizes = [int(gpus) for gpus in columns.gpus]
    memo: dict[tuple[int, ...], bool] = {}
    sets = []
    for width in range(1, max_schemes + 1):
        for combo in itertools.combinations(range(len(sizes)), width):
            key = tuple(sorted(sizes[column] for column in combo))
            if key not in memo:
                memo[key] = _fillable(key, num_gpus)
            if memo[key]:
                sets.append(combo)
    return sets


def _verify_search(
    certificate: BoundCertificate, plan: Plan, profile: CostProfile, columns: _Columns, tables: _Tables
) -> BoundVerification:
    claimed = plan.lower_bound_s
    num_gpus = plan.num_gpus
    floor = claimed * (1 - RELATIVE_TOLERANCE) - 1e-12
    aim = claimed * (1 - RELATIVE_TOLERANCE / 2)  # the time the costlier bounds test (above the floor)
    tally: dict[str, int] = {}
    violations: list[str] = []
    expanded: dict[tuple[int, ...], int] = {}
    for index, entry in enumerate(certificate.expanded):
        key = tuple(entry.schemes)
        if list(key) != sorted(set(key)) or key[-1] >= len(columns.schemes):
            violations.append(f"bound certificate: expanded set {index} {list(key)} is not increasing scheme indices")
        elif key in expanded:
            violations.append(f"bound certificate: expanded set {_set_text(columns, key)} is listed twice")
        else:
            expanded[key] = index
    if violations:
        return BoundVerification(claimed, 0.0, violations)
    sets = _all_sets(columns, certificate.max_schemes, num_gpus)
    known = set(sets)
    for key in expanded:
        if key not in known:
            violations.append(f"bound certificate: expanded set {_set_text(columns, key)} is not a set of the space")
    width = max(1, certificate.max_schemes)
    padded = np.array([(*combo, *[combo[0]] * (width - len(combo))) for combo in sets], dtype=np.int64)
    bounds = _set_bounds_s(tables, columns, padded, num_gpus, certificate.pricing_cap_s)
    cap_s = certificate.pricing_cap_s
    verified = math.inf
    short: list[str] = []
    num_strategies = 0
    cheap = np.empty(len(sets))
    for row, combo in enumerate(sets):
        sync = _sync_s(profile, columns, combo, _fewest_replicas(columns, combo, num_gpus))
        cheap[row] = bounds[row, 0] + sync
        if cap_s is not None:
            cheap[row] = max(cheap[row], min(cap_s, bounds[row, 1] + sync))
    low = np.flatnonzero(cheap < floor)
    verified = float(np.delete(cheap, low).min()) if len(low) < len(sets) else math.inf
    # the parts below the claim, least first: once more than MAX_NAMED stay below it, the claim fails
    # whatever the others prove, and they are no longer raised (their cheap bounds stand)
    for row in low[np.argsort(cheap[low], kind="stable")].tolist():
        combo, set_bound = sets[row], float(cheap[row])
        lift = aim if len(short) <= MAX_NAMED else -math.inf
        part = set_bound
        if combo in expanded:
            entry = certificate.expanded[expanded[combo]]
            part, counted, messages = _expanded_bound_s(
                entry, combo, profile, columns, tables, num_gpus, floor, lift, tally
            )
            part = max(part, set_bound)
            num_strategies += counted
            short += messages
        else:
            if math.isfinite(lift):
                part = max(part, _raised_set_bound_s(profile, columns, tables, combo, num_gpus, cap_s, lift, tally))
            if part < floor:
                short.append(
                    f"set {_set_text(columns, combo)} (not expanded): verified set bound {part:.6g} s "
                    f"< claimed {claimed:.6g} s"
                )
        verified = min(verified, part)
    if short:
        violations += short[:MAX_NAMED]
        if len(short) > MAX_NAMED:
            violations.append(f"... and {len(short) - MAX_NAMED} more parts below the claimed bound")
    if verified < floor and not short:  # cannot happen: every part below the claim is named
        violations.append(f"verified bound {verified:.6g} s < claimed {claimed:.6g} s")
    return BoundVerification(claimed, verified, violations, len(sets), len(expanded), num_strategies, tally)


def _set_text(columns: _Columns, combo: Sequence[int]) -> str:
    return "{" + ", ".join(_scheme_text(columns.schemes[column]) for column in combo) + "}"


def _expanded_bound_s(
    entry, combo, profile, columns, tables, num_gpus, floor, aim, tally
) -> tuple[float, int, list[str]]:
    """The least verified bound over an expanded set's strategies (the verifier lists them itself)."""
    sizes = [int(columns.gpus[column]) for column in combo]
    vectors = _count_vectors(sizes, num_gpus, MAX_ENUMERATED_STRATEGIES)
    if vectors is None:
        return (
            -math.inf,
            0,
            [f"set {_set_text(columns, combo)}: more than {MAX_ENUMERATED_STRATEGIES} strategies to verify one by one"],
        )
    witnesses = {tuple(witness.counts): witness for witness in entry.strategies}
    messages = []
    for counts in witnesses:
        if len(counts) != len(combo) or sum(n * g for n, g in zip(counts, sizes)) != num_gpus:
            messages.append(f"set {_set_text(columns, combo)}: witness counts {list(counts)} are not a strategy of it")
    fitting = [witness for witness in witnesses.values() if len(witness.multipliers) == len(combo)]
    if len(fitting) != len(witnesses):
        messages.append(f"set {_set_text(columns, combo)}: a witness has not one multiplier per scheme")
    bounds = _strategy_bounds_s(
        profile,
        columns,
        tables,
        combo,
        np.array(vectors),
        num_gpus,
        [witness.multipliers for witness in fitting],
        target_s=aim,
        tally=tally,
        mixed=_mixed_functions(fitting),
    )
    for counts, bound in zip(vectors, bounds.tolist()):
        if bound < floor and len(messages) < MAX_NAMED:
            messages.append(
                f"strategy {_strategy_text(columns, combo, counts)}: verified bound {bound:.6g} s "
                f"< claimed {floor / (1 - RELATIVE_TOLERANCE):.6g} s"
            )
    return float(bounds.min()), len(vectors), messages


def _mixed_functions(witnesses) -> list[tuple[Sequence[float], list[int]]]:
    """The witnesses' multipliers that come with a dual feasible function per scheme, with those
    functions as indices into `_dual_feasible_images` (tried at every strategy of the set: each is
    a valid proof for any of them)."""
    return [
        (witness.multipliers, [DFF_NAMES.index(name) for name in witness.functions])
        for witness in witnesses
        if witness.functions is not None
    ]


def _strategy_text(columns: _Columns, combo: Sequence[int], counts: Sequence[int]) -> str:
    terms = (f"{count}x<{','.join(map(str, columns.schemes[column]))}>" for column, count in zip(combo, counts))
    return " + ".join(terms)


def _strategy_bounds_s(
    profile: CostProfile,
    columns: _Columns,
    tables: _Tables,
    combo: Sequence[int],
    counts: np.ndarray,
    num_gpus: int,
    multipliers: Sequence[Sequence[float]] = (),
    extra_switch_s: float = 0.0,
    target_s: float = -math.inf,
    tally: dict[str, int] | None = None,
    mixed: Sequence[tuple[Sequence[float], Sequence[int]]] = (),
) -> np.ndarray:
    """Per row of `counts` (pipelines per scheme of `combo`): the fluid dual at the verifier's own
    grid of multipliers and the given ones, the area, longest item and bubble-floor duals (pipeline
    time) and, for a few items, the assignment bound; plus the strategy's exact sync (and a known
    switch cost). `mixed`: multipliers with a dual feasible function per scheme (indices into
    `_dual_feasible_images`) the packing tries beside its functions alike."""
    combo = list(combo)
    counts = np.asarray(counts, dtype=np.float64).reshape(-1, len(combo))
    cost, work = tables.unit_cost[:, combo], tables.work[:, combo]
    if not np.isfinite(cost).any(axis=1).all():
        return np.full(len(counts), math.inf)  # some item fits no scheme of the strategy: it has no plan
    grid = _multiplier_grid(columns.gpus[combo], multipliers)
    denominator = counts @ grid.T  # strategies x grid points
    positive = denominator > 0
    floors = _interleaved_floors(columns)[1][combo]
    area = float(tables.multiplicity @ tables.gpu_cost[:, combo].min(axis=1)) / num_gpus
    longest = float(tables.longest[:, combo].min(axis=1).max())
    fluid = _best_dual(_grid_totals(tables, cost, grid), counts * floors, grid, denominator, positive)
    bound = np.maximum(max(area, longest), fluid)
    work_totals = _grid_totals(tables, work, grid)
    for _ in range(2):  # bubble floors from the bound so far (module docstring)
        held = _bubble_overhead_s(columns, _most_work_s(columns, bound[:, None]))[:, combo]  # h(G(T0))
        raised = _best_dual(work_totals, counts * held, grid, denominator, positive)
        if not (raised > bound * (1 + 1e-9)).any():
            break
        bound = np.maximum(bound, raised)
    replicas = np.rint(counts @ columns.cp[combo]).astype(int)
    sync = np.array([_sync_s(profile, columns, combo, int(count)) for count in replicas.tolist()])
    if math.isfinite(target_s):  # the rows below the target: the costlier bounds, at the target
        bound = _raised_strategy_bounds_s(
            columns, tables, combo, counts, bound, grid, target_s - sync - extra_switch_s, tally, mixed
        )
    return bound + sync + extra_switch_s


def _multiplier_grid(gpus: np.ndarray, multipliers: Sequence[Sequence[float]]) -> np.ndarray:
    """The verifier's own multipliers (points of the simplex in steps of 1/GRID_RESOLUTION for up
    to three schemes, else corners, centre and the midpoint of every pair of corners; and GPUs per
    pipeline), then the given ones."""
    size = len(gpus)
    if size <= 3:
        points = [p for p in itertools.product(range(GRID_RESOLUTION + 1), repeat=size) if sum(p) == GRID_RESOLUTION]
        own = np.array(points, dtype=np.float64) / GRID_RESOLUTION
    else:
        corners = np.eye(size)
        pairs = [(corners[i] + corners[j]) / 2 for i, j in itertools.combinations(range(size), 2)]
        own = np.vstack([corners, np.full((1, size), 1.0 / size), *pairs])
    rows = [own, (gpus / gpus.sum())[None, :]]
    if len(multipliers):
        rows.append(np.maximum(np.asarray(multipliers, dtype=np.float64), 0.0))
    return np.vstack(rows)


def _grid_totals(tables: _Tables, cost: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Per grid point lambda: `sum_i min_s lambda_s cost_is`, where zero weight prices an item at 0
    on its scheme and a scheme the item does not fit cannot take it (inf: it fits none)."""
    unfit = np.where(np.isfinite(cost), 0.0, np.inf)[:, None, :]
    with np.errstate(invalid="ignore"):  # inf * 0 in the branch np.where leaves out
        priced = np.where(grid[None, :, :] > 0, cost[:, None, :] * grid[None, :, :], unfit)
    return tables.multiplicity @ priced.min(axis=2)


def _best_dual(
    totals: np.ndarray, floors: np.ndarray, grid: np.ndarray, denominator: np.ndarray, positive: np.ndarray
) -> np.ndarray:
    """Per strategy, the best over grid points of `(totals + sum_s lambda_s n_s floor_s) / sum_s
    lambda_s n_s` (`floors`: strategies x schemes, already times the counts)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = (totals[None, :] + floors @ grid.T) / denominator
    return np.where(positive & np.isfinite(ratios), ratios, -np.inf).max(axis=1)


class _OutOfNodes(Exception):
    pass


def _assignment_bound_s(
    columns: _Columns, items: np.ndarray, combo: Sequence[int], counts: Sequence[int], target_s: float = math.inf
) -> float:
    """Least over every assignment of the items to the strategy's pipelines (none idle) of the
    slowest pipeline's floor: a pipeline of at most `exact` items timed exactly
    (`_least_pipeline_s`), a larger one by `_pipeline_floor_s`. Depth-first over the items, longest
    first; empty pipelines of one scheme are interchangeable (only the first is tried); a branch
    ends when a pipeline's partial floor `W + max(1, tokens / cap) c + (pp-1) c` (which only grows
    as items join it, and is below both floors) reaches the best complete assignment. -inf (no
    claim) past MAX_ASSIGNMENT_NODES nodes. Branches are also cut at `target_s`: the result is then
    min(the least floor, target_s), all a caller testing the target needs."""
    labels = [column for column, count in zip(combo, counts) for _ in range(count)]
    num_pipelines, num_items = len(labels), len(items)
    if num_pipelines > num_items:
        return math.inf
    exact = EXACT_BLOCK_ITEMS if num_items <= EXACT_BATCH_ITEMS else EXACT_BLOCK_ITEMS_LARGE_BATCH
    lengths = sorted((float(length) for length in items), reverse=True)
    blocks: list[list[int]] = [[] for _ in labels]
    work, tokens = [0.0] * num_pipelines, [0.0] * num_pipelines
    memo: dict[tuple[tuple[int, ...], int], float] = {}
    best, nodes = math.inf, 0

    def full(block: tuple[int, ...], column: int) -> float:
        if (block, column) not in memo:
            members = [lengths[index] for index in block]
            least = _least_pipeline_s if len(members) <= exact else _pipeline_floor_s
            memo[(block, column)] = least(columns, column, members)
        return memo[(block, column)]

    least_counts, fill_drain = _interleaved_floors(columns)

    def partial(column: int, work_s: float, num_tokens: float) -> float:
        c = float(columns.c[column])
        fewest = max(int(least_counts[column]), math.ceil(num_tokens / float(columns.capacity[column]) - 1e-12))
        return work_s + fewest * c + float(fill_drain[column])

    def descend(index: int, empty: int) -> None:
        nonlocal best, nodes
        nodes += 1
        if nodes > MAX_ASSIGNMENT_NODES:
            raise _OutOfNodes
        if num_items - index < empty:
            return  # too few items left to give every empty pipeline one
        if index == num_items:
            best = min(best, max(full(tuple(block), column) for block, column in zip(blocks, labels)))
            return
        length = lengths[index]
        tried_empty = set()
        for pipeline, column in enumerate(labels):
            if length > columns.capacity[column]:
                continue
            if not blocks[pipeline]:
                if column in tried_empty:
                    continue
                tried_empty.add(column)
            item_s = float(columns.a[column]) * length * length + float(columns.b[column]) * length
            if partial(column, work[pipeline] + item_s, tokens[pipeline] + length) >= min(best, target_s):
                continue
            was_empty = not blocks[pipeline]
            blocks[pipeline].append(index)
            work[pipeline] += item_s
            tokens[pipeline] += length
            descend(index + 1, empty - was_empty)
            blocks[pipeline].pop()
            work[pipeline] -= item_s
            tokens[pipeline] -= length

    try:
        descend(0, num_pipelines)
    except _OutOfNodes:
        return -math.inf
    return min(best, target_s)  # no assignment below the target: the target is a floor


def _least_pipeline_s(columns: _Columns, column: int, lengths: Sequence[float]) -> float:
    """The least 1F1B time (`reference.pipeline_time_s`) of one pipeline of scheme `column` over
    every ordered packing of these items into micro-batches under its capacity; inf when none fits.
    A packing no faster than the best so far on its first stage alone is not simulated."""
    capacity = float(columns.capacity[column])
    a, b, c = float(columns.a[column]), float(columns.b[column]), float(columns.c[column])
    stages, fwd, chunks = int(columns.stages[column]), float(columns.fwd[column]), int(columns.chunks[column])
    best = math.inf
    for blocks in _ordered_packings(tuple(lengths), capacity):
        if chunks > 1 and len(blocks) % stages:
            continue  # interleaved: a multiple of pp micro-batches (the checker's rule)
        times = [a * sum(x * x for x in block) + b * sum(block) + c for block in blocks]
        if sum(times) >= best:
            continue
        if chunks > 1:
            best = min(best, reference.interleaved_pipeline_time_s(times, stages, chunks, fwd, stages))
        else:
            best = min(best, sum(times) if stages == 1 else reference.pipeline_time_s(times, stages, fwd))
    return best


def _ordered_packings(lengths: tuple[float, ...], capacity: float):
    """Every sequence of micro-batches (blocks of the items, in execution order) under `capacity`."""
    if not lengths:
        yield ()
        return
    indices = range(len(lengths))
    for size in range(len(lengths), 0, -1):
        for chosen in itertools.combinations(indices, size):
            block = tuple(lengths[index] for index in chosen)
            if sum(block) > capacity:
                continue
            rest = tuple(lengths[index] for index in indices if index not in chosen)
            for tail in _ordered_packings(rest, capacity):
                yield (block, *tail)


def _pipeline_floor_s(columns: _Columns, column: int, lengths: Sequence[float]) -> float:
    """A floor under the time of one pipeline of scheme `column` holding these items (interleaved:
    multiples of pp micro-batches, the larger of the fill-and-drain floor and `(1 + rho_m) S` with
    the interleaved LP's rho_m; else as follows): over
    every micro-batch count m it can run (at least the tokens over the capacity, at most one per
    item), the largest of `S + (pp-1) c` (first forward, last stage, last backward), `(1 + r_m) S`
    (r_m the larger of k/m and the LP's least bubble `least_bubble`, solved for the least count
    only) and `S + k (w* + c)` (the largest-micro-batch path, k = max(0, 1-2f)(pp-1), w* the
    longest item's work), with S = W + m c; inf when an item does not fit."""
    capacity = float(columns.capacity[column])
    if max(lengths) > capacity:
        return math.inf
    a, b, c = float(columns.a[column]), float(columns.b[column]), float(columns.c[column])
    stages = float(columns.stages[column])
    k = max(0.0, 1.0 - 2.0 * float(columns.fwd[column])) * (stages - 1)
    work = sum(a * length * length + b * length for length in lengths)
    largest = max(a * length * length + b * length for length in lengths)
    fewest = max(1, math.ceil(sum(lengths) / capacity - 1e-12))
    if columns.chunks[column] > 1:  # interleaved: multiples of pp, fill and drain and the LP's rho_m
        step = int(stages)
        counts = np.arange(step * math.ceil(fewest / step), len(lengths) + 1, step)
        if not len(counts):
            return math.inf  # too few items for a multiple of pp micro-batches
        total = work + counts * c
        fill_drain = float(_interleaved_floors(columns)[1][column])
        while True:
            solved = _relative(columns, column, LP_MICRO_BATCHES, True)[np.minimum(counts, LP_MICRO_BATCHES) - 1]
            relative = np.where(counts <= LP_MICRO_BATCHES, solved, 0.0)
            values = np.maximum(total + fill_drain, (1 + relative) * total)
            if not _solve_counts(columns, column, [int(counts[values.argmin()])]):
                return float(values.min())
    counts = np.arange(fewest, len(lengths) + 1)
    total = work + counts * c
    while True:
        solved = _relative(columns, column, LP_MICRO_BATCHES, True)[np.minimum(counts, LP_MICRO_BATCHES) - 1]
        relative = np.where(counts <= LP_MICRO_BATCHES, np.maximum(k / counts, solved), k / counts)
        values = np.maximum(np.maximum(total + (stages - 1) * c, (1 + relative) * total), total + k * (largest + c))
        least = int(counts[values.argmin()])
        if stages <= 1 or not _solve_counts(columns, column, [least]):
            return float(values.min())


def _verify_listed(certificate, plan, profile, request, columns, tables) -> BoundVerification:
    """Spaces of listed strategies: the request's pool, or the plan's own strategy ('fixed')."""
    claimed = plan.lower_bound_s
    floor = claimed * (1 - RELATIVE_TOLERANCE) - 1e-12
    aim = claimed * (1 - RELATIVE_TOLERANCE / 2)  # the time the costlier bounds test (above the floor)
    tally: dict[str, int] = {}
    if certificate.space == "fixed":
        space = [reference.parse_strategy_text(plan.strategy)]
    elif request is None or request.options.strategy_pool is None:
        return BoundVerification(claimed, 0.0, ["bound: a pool certificate is verified against the request's pool"])
    else:
        space = [reference.parse_strategy_text(text) for text in request.options.strategy_pool]
    index_of = {scheme: column for column, scheme in enumerate(columns.schemes)}
    witnesses = {}
    for entry in certificate.expanded:
        for witness in entry.strategies:
            witnesses[(tuple(entry.schemes), tuple(witness.counts))] = witness
    violations = []
    verified = math.inf
    for terms in space:
        merged: dict[int, int] = {}
        missing = [scheme for scheme, _ in terms if scheme not in index_of]
        if missing:
            violations.append(f"bound certificate: scheme <{','.join(map(str, missing[0]))}> is not among its schemes")
            verified = -math.inf
            continue
        for scheme, count in terms:
            merged[index_of[scheme]] = merged.get(index_of[scheme], 0) + count
        combo = sorted(merged)
        counts = [merged[column] for column in combo]
        switch = plan.switch_cost_s if certificate.space == "fixed" else 0.0
        given = witnesses.get((tuple(combo), tuple(counts)))
        fitting = [given] if given is not None and len(given.multipliers) == len(combo) else []
        bound = float(
            _strategy_bounds_s(
                profile,
                columns,
                tables,
                combo,
                np.array([counts]),
                plan.num_gpus,
                [witness.multipliers for witness in fitting],
                switch,
                target_s=aim,
                tally=tally,
                mixed=_mixed_functions(fitting),
            )[0]
        )
        if bound < floor:
            violations.append(
                f"strategy {_strategy_text(columns, combo, counts)}: verified bound {bound:.6g} s "
                f"< claimed {claimed:.6g} s"
            )
        verified = min(verified, bound)
    return BoundVerification(claimed, verified, violations, 0, len(certificate.expanded), len(space), tally)


# --- bubble floors: the least relative bubble by LP, and the floors g(W), G(T) built on it ---

SCHEDULE_1F1B = "1f1b"
SCHEDULE_INTERLEAVED = "interleaved"
LP_MICRO_BATCHES = 64  # rho_m by LP for m up to this; beyond, the path floor kappa / m
LP_SAFETY = 1e-6  # subtracted from every LP optimum (HiGHS's tolerances are ~1e-7)
TAIL_RATIO = 1.25  # counts above LP_MICRO_BATCHES are priced in ranges this wide ...
MOST_MICRO_BATCHES = 1 << 16  # ... up to this many; more are priced by their overheads alone


@cache
def least_bubble(
    num_stages: int,
    num_micro_batches: int,
    fwd_fraction: float,
    schedule: str = SCHEDULE_1F1B,
    num_chunks: int = 1,
) -> float:
    """rho_m: a floor on `T(t) / sum(t) - 1` over every run of m micro-batches (stage times t >= 0,
    forward share f) of the schedule, T its makespan as `planner.reference` times it. The LP: the
    ends of the operations and the shares u (summing to 1) are the variables, each operation ends
    no earlier than its duration after the operation before it on its rank and the one it waits
    for, and T no earlier than each rank's last operation; minimise T. Any run scaled to sum 1 is a
    feasible point, so the optimum is a floor (less LP_SAFETY).

    `SCHEDULE_1F1B`: `reference.one_f_one_b_order` and `reference.pipeline_time_s`' rules.
    `SCHEDULE_INTERLEAVED` (`num_chunks` v > 1 chunks per rank, groups of pp, so m a multiple of
    pp): `reference.interleaved_rank_order` and `reference.interleaved_pipeline_time_s`' rules,
    micro-batch i taking `f u_i / v` forward and `(1-f) u_i / v` backward on each chunk."""
    if schedule not in (SCHEDULE_1F1B, SCHEDULE_INTERLEAVED):
        raise ValueError(f"no bubble floor for schedule {schedule!r}")
    if num_stages <= 1 or num_micro_batches < 1:
        return 0.0
    if schedule == SCHEDULE_INTERLEAVED:
        if num_chunks < 2 or num_micro_batches % num_stages:
            raise ValueError(
                f"no bubble floor for schedule {schedule!r} with {num_chunks} chunks and {num_micro_batches} "
                f"micro-batches (it needs v > 1 and a multiple of pp {num_stages})"
            )
        orders = [  # (kind, virtual stage, micro-batch) per rank, in its order
            [
                (kind, chunk * num_stages + rank, micro)
                for kind, micro, chunk in reference.interleaved_rank_order(
                    rank, num_stages, num_chunks, num_micro_batches, num_stages
                )
            ]
            for rank in range(num_stages)
        ]
        last_stage, scale = num_chunks * num_stages - 1, 1.0 / num_chunks
    else:
        orders = [
            [(kind, stage, micro) for kind, micro in reference.one_f_one_b_order(stage, num_stages, num_micro_batches)]
            for stage in range(num_stages)
        ]
        last_stage, scale = num_stages - 1, 1.0
    import highspy

    position = {op: place for place, op in enumerate(op for order in orders for op in order)}
    first_share = len(position)
    makespan = first_share + num_micro_batches
    starts, indices, values = [0], [], []

    def after(op: int, before: int | None, duration: float, micro: int) -> None:
        # end[op] - duration u[micro] - end[before] >= 0
        indices.extend((op, first_share + micro))
        values.extend((1.0, -duration))
        if before is not None:
            indices.append(before)
            values.append(-1.0)
        starts.append(len(indices))

    for order in orders:
        previous = None
        for kind, stage, micro in order:
            op = position[(kind, stage, micro)]
            duration = scale * (fwd_fraction if kind == "F" else 1.0 - fwd_fraction)
            if kind == "F":
                waited = position[("F", stage - 1, micro)] if stage > 0 else None
            elif stage < last_stage:
                waited = position[("B", stage + 1, micro)]
            else:
                waited = position[("F", stage, micro)]
            after(op, previous, duration, micro)
            if waited is not None:
                after(op, waited, duration, micro)
            previous = op
        # T - end[last op of this rank] >= 0
        indices.extend((makespan, previous))
        values.extend((1.0, -1.0))
        starts.append(len(indices))
    num_waits = len(starts) - 1
    indices.extend(range(first_share, first_share + num_micro_batches))
    values.extend([1.0] * num_micro_batches)
    starts.append(len(indices))
    num_vars = makespan + 1
    model = highspy.HighsLp()
    model.num_col_, model.num_row_ = num_vars, num_waits + 1
    objective = np.zeros(num_vars)
    objective[makespan] = 1.0
    model.col_cost_ = objective
    model.col_lower_ = np.zeros(num_vars)
    model.col_upper_ = np.full(num_vars, highspy.kHighsInf)
    model.row_lower_ = np.r_[np.zeros(num_waits), 1.0]
    model.row_upper_ = np.r_[np.full(num_waits, highspy.kHighsInf), 1.0]
    model.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    model.a_matrix_.start_ = np.asarray(starts, dtype=np.int32)
    model.a_matrix_.index_ = np.asarray(indices, dtype=np.int32)
    model.a_matrix_.value_ = np.asarray(values, dtype=np.float64)
    solver = highspy.Highs()
    solver.setOptionValue("output_flag", False)
    solver.passModel(model)
    solver.run()
    if solver.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return 0.0  # no floor claimed
    return max(0.0, float(solver.getInfo().objective_function_value) - 1.0 - LP_SAFETY)


def _path_kappa(columns: _Columns, column: int) -> float:
    return max(0.0, 1.0 - 2.0 * float(columns.fwd[column])) * (float(columns.stages[column]) - 1.0)


# the LP floors solved so far, per (stages, forward share, chunks): m -> rho_m. The floors are solved
# lazily (one LP each, 0.01-2 s: pp=8 takes 4.6 s for all 64 counts, pp=32 57 s): a floor g(W) or
# its inverse needs rho_m only for the counts m that would be its least (greatest) piece if raised
_LP_SOLVED: dict[tuple[int, float, int], dict[int, float]] = {}


def _lp_key(columns: _Columns, column: int) -> tuple[int, float, int]:
    return int(columns.stages[column]), float(columns.fwd[column]), int(columns.chunks[column])


def _count_step(columns: _Columns, column: int) -> int:
    """Micro-batch counts a pipeline of this scheme can run are multiples of this: pp for an
    interleaved scheme (groups of pp, the checker's rule), else 1."""
    return int(columns.stages[column]) if columns.chunks[column] > 1 else 1


def _relative(columns: _Columns, column: int, most: int, by_lp: bool) -> np.ndarray:
    """r_m for m = 1..most: the path floor kappa / m (none for an interleaved scheme), raised to
    the LP's rho_m where solved."""
    counts = np.arange(1, most + 1, dtype=np.float64)
    relative = (_path_kappa(columns, column) if columns.chunks[column] == 1 else 0.0) / counts
    if by_lp:
        for count, rho in _LP_SOLVED.get(_lp_key(columns, column), {}).items():
            if count <= most:
                relative[count - 1] = max(relative[count - 1], rho)
    return relative


def _solve_counts(columns: _Columns, column: int, counts) -> bool:
    """Solve rho_m for these counts (<= LP_MICRO_BATCHES; for an interleaved scheme, multiples of
    pp) not solved yet; whether any was."""
    stages, fwd, chunks = _lp_key(columns, column)
    step = _count_step(columns, column)
    solved = _LP_SOLVED.setdefault((stages, fwd, chunks), {})
    pending = [int(m) for m in counts if 1 <= m <= LP_MICRO_BATCHES and int(m) % step == 0 and int(m) not in solved]
    for count in pending:
        if chunks > 1:
            solved[count] = least_bubble(stages, count, fwd, SCHEDULE_INTERLEAVED, chunks)
        else:
            solved[count] = least_bubble(stages, count, fwd)
    return bool(pending)


def _floor_pieces(columns: _Columns, column: int, cap: int | None, by_lp: bool) -> tuple[np.ndarray, ...]:
    """(alpha, beta, added) with `g(W) = min_j max(alpha_j W + beta_j, W + added_j)`: a pipeline of
    this scheme whose items carry work W over m micro-batches (at most `cap`) runs at least
    `(1 + r_m)(W + m c)` and `W + (m + pp - 1) c`; piece j < LP_MICRO_BATCHES is m = j + 1, counts
    above in ranges [a, b] priced at `(1 + kappa / b)(W + a c)`, every count past the last by
    `W + (a + pp - 1) c`. A cap above LP_MICRO_BATCHES ends the ranges at it, with no piece past
    it (no count above the cap is run).

    An interleaved scheme (v > 1) runs m = pp, 2 pp, ...: piece j is m = (j + 1) pp up to
    LP_MICRO_BATCHES, at least `(1 + rho_m)(W + m c)` and `W + m c + (pp-1) c / v`, and one piece
    `W + (a + (pp-1)/v) c` for every count from a, the next multiple of pp; a cap below pp (no such
    pipeline) keeps the fill-and-drain piece alone."""
    stages, c, kappa = int(columns.stages[column]), float(columns.c[column]), _path_kappa(columns, column)
    if stages <= 1:
        return np.array([1.0]), np.array([c]), np.array([c])
    capped = cap is not None and cap <= LP_MICRO_BATCHES
    if columns.chunks[column] > 1:
        fill_drain = float(_interleaved_floors(columns)[1][column])
        if capped and cap < stages:
            overhead = _interleaved_overhead_s(columns, column)
            return np.array([1.0]), np.array([overhead]), np.array([overhead])
        relative = _relative(columns, column, cap if capped else LP_MICRO_BATCHES, by_lp)
        counts = np.arange(stages, len(relative) + 1, stages, dtype=np.float64)
        relative = relative[stages - 1 :: stages]
        alpha, beta, added = list(1.0 + relative), list((1.0 + relative) * counts * c), list(counts * c + fill_drain)
        if not capped:
            following = (LP_MICRO_BATCHES // stages + 1) * stages
            alpha.append(1.0)
            beta.append(following * c + fill_drain)
            added.append(following * c + fill_drain)
        return np.asarray(alpha), np.asarray(beta), np.asarray(added)
    relative = _relative(columns, column, max(1, cap) if capped else LP_MICRO_BATCHES, by_lp)
    counts = np.arange(1, len(relative) + 1, dtype=np.float64)
    alpha, beta, added = list(1.0 + relative), list((1.0 + relative) * counts * c), list((counts + stages - 1) * c)
    if not capped:
        most = MOST_MICRO_BATCHES if cap is None else min(cap, MOST_MICRO_BATCHES)
        first = LP_MICRO_BATCHES + 1
        while first <= most:
            last = min(most, max(first, math.floor(first * TAIL_RATIO)))
            alpha.append(1.0 + kappa / last)
            beta.append((1.0 + kappa / last) * first * c)
            added.append((first + stages - 1) * c)
            first = last + 1
        if cap is None or cap > MOST_MICRO_BATCHES:
            alpha.append(1.0)
            beta.append((first + stages - 1) * c)
            added.append((first + stages - 1) * c)
    return np.asarray(alpha), np.asarray(beta), np.asarray(added)


def _pipeline_floor_of_work_s(columns: _Columns, column: int, work_s, cap: int | None = None, by_lp: bool = False):
    """g(W): the least time of a pipeline of this scheme whose items carry work W. With `by_lp`,
    the LP floors of the counts that are the least piece for some W, until each least piece is
    solved (an unsolved piece prices at most its LP value: the least stays the least)."""
    work = np.asarray(work_s, dtype=np.float64)[..., None]
    while True:
        alpha, beta, added = _floor_pieces(columns, column, cap, by_lp)
        values = np.maximum(alpha * work + beta, work + added)
        least = (np.unique(values.argmin(axis=-1)) + 1) * _count_step(columns, column)
        if not by_lp or not _solve_counts(columns, column, least):
            return values.min(axis=-1)


def _room_s(columns: _Columns, column: int, time_s, cap: int | None = None, by_lp: bool = False):
    """G(T): the most work a pipeline of this scheme finishing by T can carry (g is increasing);
    with `by_lp`, lazily as `_pipeline_floor_of_work_s` (the greatest piece)."""
    time = np.asarray(time_s, dtype=np.float64)[..., None]
    while True:
        alpha, beta, added = _floor_pieces(columns, column, cap, by_lp)
        values = np.minimum((time - beta) / alpha, time - added)
        greatest = (np.unique(values.argmax(axis=-1)) + 1) * _count_step(columns, column)
        if not by_lp or not _solve_counts(columns, column, greatest):
            return values.max(axis=-1)


def _rooms_capped_s(columns: _Columns, column: int, time_s: np.ndarray, caps: np.ndarray, by_lp: bool) -> np.ndarray:
    """`_room_s` per row, each with its own micro-batch cap (caps above LP_MICRO_BATCHES price
    like none)."""
    result = np.empty(len(time_s))
    caps = np.minimum(np.asarray(caps, dtype=np.int64), LP_MICRO_BATCHES + 1)
    for cap in np.unique(caps).tolist():
        same = caps == cap
        result[same] = _room_s(columns, column, time_s[same], cap if cap <= LP_MICRO_BATCHES else None, by_lp)
    return result


def _largest_item_extra_s(columns: _Columns, column: int, work_s: np.ndarray) -> np.ndarray:
    """E(w): `T - W` at least for a pipeline of this scheme holding an item of work w (the path of
    the module docstring through the largest micro-batch, or the `(pp-1) c` fill and drain)."""
    c, stages, fwd = float(columns.c[column]), float(columns.stages[column]), float(columns.fwd[column])
    if columns.chunks[column] > 1:  # interleaved: the fill-and-drain floor, whatever the item
        return np.full(np.shape(work_s), _interleaved_overhead_s(columns, column))
    by_path = _path_kappa(columns, column) * (c + np.asarray(work_s)) + (stages - 1) * fwd * c if fwd <= 0.5 else 0.0
    return c + np.maximum((stages - 1) * c, by_path)


# --- packing: items are not divisible between pipelines (dual feasible functions) ---

DFF_THRESHOLDS = (0.2, 0.25, 0.3, 1 / 3, 0.4, 0.45, 0.5)  # eps of f_eps (Fekete & Schepers 2001)
DFF_STEPS = (2, 3, 4)  # k of u_k
# names of the functions after the identity, in `_dual_feasible_images`' order (a witness names them)
DFF_NAMES = (
    "identity",
    *(f"f_eps({Fraction(eps).limit_denominator(20)})" for eps in DFF_THRESHOLDS),
    *(f"u_k({k})" for k in DFF_STEPS),
)
SIZE_SHRINK = 1e-9  # sizes are shrunk this much before the functions (all non-decreasing): float noise
ROOM_CAP_ROUNDS = 3  # rounds of the item-count cap on a pipeline's room (each only lowers it)


def _dual_feasible_images(sizes: np.ndarray) -> np.ndarray:
    """Images of sizes in [0, 1] under the identity, every f_eps and every u_k, stacked on a new
    first axis; each function maps sizes summing to at most 1 to images summing to at most 1, and
    is non-decreasing, so pricing a size shrunk by SIZE_SHRINK never overstates an image."""
    x = np.clip(sizes * (1.0 - SIZE_SHRINK), 0.0, 1.0)
    images = [x]
    for eps in DFF_THRESHOLDS:
        images.append(np.where(x > 1.0 - eps, 1.0, np.where(x < eps, 0.0, x)))
    for k in DFF_STEPS:
        scaled = (k + 1) * x
        whole = np.floor(scaled)
        images.append(np.where(scaled == whole, x, whole / k))
    return np.stack(images)


def _item_sizes(
    columns: _Columns, tables: _Tables, combo: Sequence[int], time_s: float, caps: Sequence[int], by_lp: bool
) -> np.ndarray:
    """Rows x schemes of `combo`: item sizes `x = w / min(R, T - E(w))` at step time T for pipelines
    of at most `caps[k]` micro-batches, R the room `G(T)` (lowered while the lightest items that
    would fill it are fewer than the cap), inf where the item cannot go: the sizes of one
    pipeline's items sum to at most 1 (its largest item j leaves `T - E(w_j) <= T - E(w_i)`)."""
    sizes = np.full((len(tables.multiplicity), len(combo)), np.inf)
    repeats = np.rint(tables.multiplicity).astype(np.int64)
    for place, column in enumerate(combo):
        work = tables.work[:, column]
        cap = int(caps[place])
        room = float(_room_s(columns, column, time_s, cap, by_lp))
        lightest = np.cumsum(np.repeat(work, repeats))  # the k lightest items' work (rows are sorted)
        for _ in range(ROOM_CAP_ROUNDS):
            fewer = max(1, int(np.searchsorted(lightest, room * (1 + 1e-9), side="right")))
            if fewer >= cap:
                break
            cap = fewer
            room = float(_room_s(columns, column, time_s, cap, by_lp))
        finite = np.isfinite(work)
        extra = np.where(finite, _largest_item_extra_s(columns, column, np.where(finite, work, 0.0)), np.inf)
        beside = time_s - extra
        fits = finite & (work + extra <= time_s * (1 + 1e-12)) & (work <= room * (1 + 1e-12))
        item_room = np.maximum(np.minimum(room, beside), 1e-300)
        sizes[:, place] = np.where(fits, np.minimum(np.where(finite, work, 0.0) / item_room, 1.0), np.inf)
    return sizes


def _packing_infeasible(
    columns: _Columns,
    tables: _Tables,
    combo: Sequence[int],
    weights: np.ndarray,
    capacity: np.ndarray,
    time_s: float,
    caps: Sequence[int],
    by_lp: bool,
    functions: np.ndarray | None = None,
) -> bool:
    """Whether no assignment of the items to pipelines finishing by `time_s` exists, shown by some
    dual feasible function f and row of `weights` (points x schemes, >= 0): every pipeline's images
    sum to at most 1, so `sum_i min_s weight_s f(x_is) <= capacity` (per point: the weighted
    pipeline count, or the GPUs with weights g_s) for any assignment. A point whose row of
    `functions` (points x schemes, indices into `_dual_feasible_images`, -1 for every function
    alike) names one function per scheme prices each scheme's items by its own function f_s instead
    (each pipeline's images under its scheme's sum to at most 1, so `sum_i min_s weight_s f_s(x_is)
    <= capacity` as well)."""
    if time_s <= 0:
        return True
    sizes = _item_sizes(columns, tables, combo, time_s, caps, by_lp)
    if not np.isfinite(sizes).any(axis=1).all():
        return True  # some item fits no pipeline by then
    images = _dual_feasible_images(np.where(np.isfinite(sizes), sizes, 0.0))  # functions x rows x schemes
    misfit = ~np.isfinite(sizes)
    for index, (point, limit) in enumerate(zip(weights, capacity)):
        if functions is not None and functions[index][0] >= 0:  # one function per scheme: one image row
            picked = images[functions[index], :, np.arange(len(combo))].T  # rows x schemes
            priced = np.where(misfit, np.inf, picked * point[None, :])[None]
        else:
            priced = np.where(misfit[None], np.inf, images * point[None, None, :])
        used = priced.min(axis=2) @ tables.multiplicity
        if (used > limit * (1 + 1e-9) + 1e-12).any():
            return True
    return False


# --- the costlier bounds, only for the parts below the claimed bound, at the claimed time ---

REPLICA_WEIGHTS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0)  # mu / N


def _bubble_priced_costs(tables: _Tables, columns: _Columns, combo: Sequence[int], cap_s: float, by_lp: bool):
    """Rows x schemes of `combo`: GPU-seconds per item for plans whose pipelines all finish within
    `cap_s`. A pipeline of work W runs at least `g(W) >= W g(T_cap) / T_cap` (g(W)/W is
    non-increasing and W <= T_cap; g over at most as many micro-batches as there are items) and at
    least its items' `u`: each scheme takes the one of the two pricings, `g u` or `g w g(T_cap) /
    T_cap`, with the larger total, for all its items (one pricing per scheme: the item-wise larger
    of the two would not bound a pipeline)."""
    priced = tables.gpu_cost[:, list(combo)].copy()
    cap = len(tables.items)
    for place, column in enumerate(combo):
        factor = float(_pipeline_floor_of_work_s(columns, column, cap_s, cap, by_lp)) / cap_s
        bubbled = tables.work[:, column] * columns.gpus[column] * factor
        fits = np.isfinite(bubbled)
        if fits.any() and tables.multiplicity[fits] @ bubbled[fits] > tables.multiplicity[fits] @ priced[fits, place]:
            priced[:, place] = bubbled
    return priced


def _raised_set_bound_s(profile, columns, tables, combo, num_gpus, cap_s, aim, tally=None) -> float:
    """A set's bound by the costlier arguments (each valid on its own; the best is taken):

    * the area priced with the LP bubble floors under `cap_s` (`pricing_cap_s`), the set's bound
      being min(cap_s, it);
    * the replica split: a strategy with R or more weight replicas syncs at least sync(R); one with
      fewer has `sum_s cp_s n_s <= R - 1`, so with `y_s = n_s T` and any `mu >= 0`,
      `T >= sum_i min_s (g_s + mu cp_s) u_is / (N + mu (R - 1))` (the verifier's own grid of mu
      and every R);
    * the set packing at the claimed time T (`aim`, a hair under it; less the set's sync floor): every pipeline's items'
      images under a dual feasible function sum to at most 1, so `sum_i min_s g_s f(x_is) <= N`
      for any plan finishing by T; a violation proves the set's pipelines need longer."""
    combo = list(combo)
    fewest = _fewest_replicas(columns, combo, num_gpus)
    plain_sync = _sync_s(profile, columns, combo, fewest)
    longest = float(tables.longest[:, combo].min(axis=1).max())
    per_gpu = columns.cp[combo] / columns.gpus[combo]
    most = int(math.floor(num_gpus * float(per_gpu.max()) + 1e-9))
    capped = cap_s is not None and cap_s > 0

    def under_cap(value: float) -> float:
        return min(cap_s, value) if capped else value

    def split_s(costs: np.ndarray) -> float:
        area = float(tables.multiplicity @ costs.min(axis=1)) / num_gpus
        if most <= fewest:
            return -math.inf
        weights = num_gpus * np.asarray(REPLICA_WEIGHTS)
        numerators = tables.multiplicity @ (costs[:, None, :] * (1.0 + weights[:, None] * per_gpu[None, :])).min(axis=2)
        thresholds = np.arange(fewest + 1, most + 2)
        few = (numerators[None, :] / (num_gpus + weights[None, :] * (thresholds[:, None] - 1))).max(axis=1)
        many = np.array([_sync_s(profile, columns, combo, int(r)) for r in thresholds.tolist()]) + area
        many[-1] = math.inf  # more than the most replicas the set allows: no strategy
        return under_cap(float(np.minimum(many, np.maximum(few, longest) + plain_sync).max()))

    best = -math.inf
    for by_lp in (False, True):
        if best >= aim or (by_lp and not capped):
            break
        costs = _bubble_priced_costs(tables, columns, combo, cap_s, by_lp) if capped else tables.gpu_cost[:, combo]
        if capped:
            area = float(tables.multiplicity @ costs.min(axis=1)) / num_gpus
            lifted = under_cap(max(area, longest) + plain_sync)
            _count(tally, "set: LP-priced area" if by_lp else "set: capped area", best < aim <= lifted)
            best = max(best, lifted)
        if best < aim:
            lifted = split_s(costs)
            _count(tally, "set: replica split", best < aim <= lifted)
            best = max(best, lifted)
    caps = [len(tables.items)] * len(combo)
    for by_lp in (False, True):
        if best < aim and _packing_infeasible(
            columns,
            tables,
            combo,
            columns.gpus[combo][None, :],
            np.array([float(num_gpus)]),
            aim - plain_sync,
            caps,
            by_lp,
        ):
            best = max(best, aim)  # the packing needs no cap
            _count(tally, "set: set packing", True)
    return best


def _raised_strategy_bounds_s(columns, tables, combo, counts, bound, grid, target, tally=None, mixed=()) -> np.ndarray:
    """Raise the pipeline-time bounds `bound` (per row of `counts`) below `target` (per row): the
    bubble dual with the LP floors over at most `items - pipelines + 1` micro-batches and the
    pipeline holding the longest item, then the packing at the target (each function alike on
    every scheme, and the `mixed` functions at their multipliers), then (a few items) the
    assignment search at the target. `tally` (when given) counts the kind that lifted each row."""
    combo = list(combo)
    bound = bound.copy()
    low = np.flatnonzero(bound < target)
    if not low.size:
        return bound
    rows = counts[low]
    caps = len(tables.items) - np.rint(rows.sum(axis=1)).astype(np.int64) + 1
    work = tables.work[:, combo]
    totals = _grid_totals(tables, work, grid)
    denominator = rows @ grid.T
    positive = denominator > 0
    longest_work = tables.work[-1, combo]
    holder_extra = np.array(
        [
            float(_largest_item_extra_s(columns, column, w)) if math.isfinite(w) else math.inf
            for column, w in zip(combo, longest_work.tolist())
        ]
    )
    current = bound[low]
    for _ in range(3):
        room = np.stack([_rooms_capped_s(columns, column, current, caps, True) for column in combo], axis=1)
        floors = current[:, None] - np.maximum(room, 0.0)  # K_s = T0 - G_s(T0)
        excess = np.maximum(holder_extra[None, :] - floors, 0.0)  # rows x schemes, inf where l* misfits
        with np.errstate(invalid="ignore"):
            holder = np.where(
                grid[None, :, :] > 0,
                excess[:, None, :] * grid[None, :, :],
                np.where(np.isfinite(excess), 0.0, np.inf)[:, None, :],
            ).min(axis=2)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratios = (totals[None, :] + (rows * floors) @ grid.T + holder) / denominator
        raised = np.where(positive & np.isfinite(ratios), ratios, -np.inf).max(axis=1)
        if not (raised > current * (1 + 1e-9)).any():
            break
        current = np.maximum(current, raised)
    bound[low] = current
    for reached in (current >= target[low]).tolist():
        _count(tally, "strategy: bubble dual (LP floors)", reached)
    # the packing's points: the grid with every function alike (-1), then the mixed witnesses'
    points = np.vstack([grid, *(np.asarray(weights, dtype=np.float64)[None] for weights, _ in mixed)])
    functions = np.vstack([np.full(grid.shape, -1), *(np.asarray(names)[None] for _, names in mixed)])
    for place, row in zip(low.tolist(), rows):
        if bound[place] >= target[place]:
            continue
        row_caps = [int(len(tables.items) - row.sum() + 1)] * len(combo)
        if any(
            _packing_infeasible(
                columns, tables, combo, points, row @ points.T, float(target[place]), row_caps, by_lp, functions
            )
            for by_lp in (False, True)
        ):
            bound[place] = target[place]
            _count(tally, "strategy: packing", True)
        elif len(tables.items) <= FEW_ITEMS:
            assigned = _assignment_bound_s(columns, tables.items, combo, row.astype(int).tolist(), target[place])
            bound[place] = max(bound[place], assigned)
            _count(tally, "strategy: assignment", assigned >= target[place])
    return bound


def _count(tally: dict[str, int] | None, kind: str, reached: bool) -> None:
    if tally is not None and reached:
        tally[kind] = tally.get(kind, 0) + 1
