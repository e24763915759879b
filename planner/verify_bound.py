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
* *bubble floors* (from their definition, no table): with `S = W + m c` (work W, m micro-batches),
  the 1F1B schedule has the path `S + (pp-1)(f t_1 + (1-f) t_m) >= W + pp c`, and the path of
  `planner.bubble_floor`'s docstring (item 1) `T >= (1 + k / m) S`, `k = max(0, 1-2f)(pp-1)`, whose
  least over m is `(sqrt(W) + sqrt(k c))^2`. So `T_p >= g(W) = W + h(W)`, `h = max(pp c, k c +
  2 sqrt(k c W))`, increasing with `h(W) / W` non-increasing. An interleaved scheme (v chunks per
  rank; a, b, c then price a rank's v chunks) runs a positive multiple of pp micro-batches (the
  checker's rule) and has the fill-and-drain path: rank pp-1 starts after pp-1 chunk forwards, runs
  its S, and its last backward is followed by pp-1 chunk backwards, `T >= S + (pp-1) c / v`; so
  `h = (pp + (pp-1)/v) c` (`_interleaved_floors`). Under a step time `T_cap`
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

What it does not recompute (yet): the solver's tabulated bubble floors (`planner.bubble_floor`'s LP
table), its packing bounds (dual feasible functions), its replica-split and set-packing set
bounds and the few-items assignment bound. A plan whose bound rests on them fails with the part
named, and the shortfall stated.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

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
    for row, combo in enumerate(sets):
        sync = _sync_s(profile, columns, combo, _fewest_replicas(columns, combo, num_gpus))
        set_bound = bounds[row, 0] + sync
        if cap_s is not None:
            set_bound = max(set_bound, min(cap_s, bounds[row, 1] + sync))
        part = set_bound
        if combo in expanded and set_bound < floor:
            entry = certificate.expanded[expanded[combo]]
            part, counted, messages = _expanded_bound_s(entry, combo, profile, columns, tables, num_gpus, floor)
            part = max(part, set_bound)
            num_strategies += counted
            short += messages
        elif set_bound < floor:
            kind = "expanded into its strategies" if combo in expanded else "not expanded"
            short.append(
                f"set {_set_text(columns, combo)} ({kind}): verified set bound {set_bound:.6g} s "
                f"< claimed {claimed:.6g} s"
            )
        verified = min(verified, part)
    if short:
        violations += short[:MAX_NAMED]
        if len(short) > MAX_NAMED:
            violations.append(f"... and {len(short) - MAX_NAMED} more parts below the claimed bound")
    if verified < floor and not short:  # cannot happen: every part below the claim is named
        violations.append(f"verified bound {verified:.6g} s < claimed {claimed:.6g} s")
    return BoundVerification(claimed, verified, violations, len(sets), len(expanded), num_strategies)


def _set_text(columns: _Columns, combo: Sequence[int]) -> str:
    return "{" + ", ".join(_scheme_text(columns.schemes[column]) for column in combo) + "}"


def _expanded_bound_s(entry, combo, profile, columns, tables, num_gpus, floor) -> tuple[float, int, list[str]]:
    """The least verified bound over an expanded set's strategies (the verifier lists them itself)."""
    sizes = [int(columns.gpus[column]) for column in combo]
    vectors = _count_vectors(sizes, num_gpus, MAX_ENUMERATED_STRATEGIES)
    if vectors is None:
        return (
            -math.inf,
            0,
            [f"set {_set_text(columns, combo)}: more than {MAX_ENUMERATED_STRATEGIES} strategies to verify one by one"],
        )
    witnesses = {tuple(witness.counts): witness.multipliers for witness in entry.strategies}
    messages = []
    for counts in witnesses:
        if len(counts) != len(combo) or sum(n * g for n, g in zip(counts, sizes)) != num_gpus:
            messages.append(f"set {_set_text(columns, combo)}: witness counts {list(counts)} are not a strategy of it")
    extra = [weights for weights in witnesses.values() if len(weights) == len(combo)]
    if len(extra) != len(witnesses):
        messages.append(f"set {_set_text(columns, combo)}: a witness has not one multiplier per scheme")
    bounds = _strategy_bounds_s(profile, columns, tables, combo, np.array(vectors), num_gpus, extra)
    for counts, bound in zip(vectors, bounds.tolist()):
        if bound < floor and len(messages) < MAX_NAMED:
            messages.append(
                f"strategy {_strategy_text(columns, combo, counts)}: verified bound {bound:.6g} s "
                f"< claimed {floor / (1 - RELATIVE_TOLERANCE):.6g} s"
            )
    return float(bounds.min()), len(vectors), messages


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
) -> np.ndarray:
    """Per row of `counts` (pipelines per scheme of `combo`): the fluid dual at the verifier's own
    grid of multipliers and the given ones, the area, longest item and bubble-floor duals (pipeline
    time) and, for a few items, the assignment bound; plus the strategy's exact sync (and a known
    switch cost)."""
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
    if len(tables.items) <= FEW_ITEMS:
        assigned = [_assignment_bound_s(columns, tables.items, combo, row) for row in counts.astype(int).tolist()]
        bound = np.maximum(bound, assigned)
    replicas = np.rint(counts @ columns.cp[combo]).astype(int)
    sync = np.array([_sync_s(profile, columns, combo, int(count)) for count in replicas.tolist()])
    return bound + sync + extra_switch_s


def _multiplier_grid(gpus: np.ndarray, multipliers: Sequence[Sequence[float]]) -> np.ndarray:
    """The verifier's own multipliers (points of the simplex in steps of 1/GRID_RESOLUTION for up
    to three schemes, else corners and centre; and GPUs per pipeline), then the given ones."""
    size = len(gpus)
    if size <= 3:
        points = [p for p in itertools.product(range(GRID_RESOLUTION + 1), repeat=size) if sum(p) == GRID_RESOLUTION]
        own = np.array(points, dtype=np.float64) / GRID_RESOLUTION
    else:
        own = np.vstack([np.eye(size), np.full((1, size), 1.0 / size)])
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


def _assignment_bound_s(columns: _Columns, items: np.ndarray, combo: Sequence[int], counts: Sequence[int]) -> float:
    """Least over every assignment of the items to the strategy's pipelines (none idle) of the
    slowest pipeline's floor: a pipeline of at most `exact` items timed exactly
    (`_least_pipeline_s`), a larger one by `_pipeline_floor_s`. Depth-first over the items, longest
    first; empty pipelines of one scheme are interchangeable (only the first is tried); a branch
    ends when a pipeline's partial floor `W + max(1, tokens / cap) c + (pp-1) c` (which only grows
    as items join it, and is below both floors) reaches the best complete assignment. -inf (no
    claim) past MAX_ASSIGNMENT_NODES nodes."""
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
            if partial(column, work[pipeline] + item_s, tokens[pipeline] + length) >= best:
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
    return best


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
    """A floor under the 1F1B time of one pipeline of scheme `column` holding these items: over
    every micro-batch count m it can run (at least the tokens over the capacity, at most one per
    item), the largest of `S + (pp-1) c` (first forward, last stage, last backward), `(1 + k/m) S`
    and `S + k (w* + c)` (the largest-micro-batch path, k = max(0, 1-2f)(pp-1), w* the longest
    item's work), with S = W + m c; inf when an item does not fit."""
    capacity = float(columns.capacity[column])
    if max(lengths) > capacity:
        return math.inf
    a, b, c = float(columns.a[column]), float(columns.b[column]), float(columns.c[column])
    stages = float(columns.stages[column])
    k = max(0.0, 1.0 - 2.0 * float(columns.fwd[column])) * (stages - 1)
    work = sum(a * length * length + b * length for length in lengths)
    largest = max(a * length * length + b * length for length in lengths)
    fewest = max(1, math.ceil(sum(lengths) / capacity - 1e-12))
    best = math.inf
    if columns.chunks[column] > 1:  # interleaved: multiples of pp, the fill-and-drain floor alone
        fill_drain = float(_interleaved_floors(columns)[1][column])
        for count in range(int(stages) * math.ceil(fewest / stages), len(lengths) + 1, int(stages)):
            best = min(best, work + count * c + fill_drain)
        return best
    for count in range(fewest, len(lengths) + 1):
        total = work + count * c
        best = min(best, max(total + (stages - 1) * c, (1 + k / count) * total, total + k * (largest + c)))
    return best


def _verify_listed(certificate, plan, profile, request, columns, tables) -> BoundVerification:
    """Spaces of listed strategies: the request's pool, or the plan's own strategy ('fixed')."""
    claimed = plan.lower_bound_s
    floor = claimed * (1 - RELATIVE_TOLERANCE) - 1e-12
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
            witnesses[(tuple(entry.schemes), tuple(witness.counts))] = witness.multipliers
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
        extra = [given] if given is not None and len(given) == len(combo) else []
        bound = float(
            _strategy_bounds_s(profile, columns, tables, combo, np.array([counts]), plan.num_gpus, extra, switch)[0]
        )
        if bound < floor:
            violations.append(
                f"strategy {_strategy_text(columns, combo, counts)}: verified bound {bound:.6g} s "
                f"< claimed {claimed:.6g} s"
            )
        verified = min(verified, bound)
    return BoundVerification(claimed, verified, violations, 0, len(certificate.expanded), len(space))
