"""The bound certificate a plan carries (`schemas.BoundCertificate`), built once at the end of the
search from what the search already holds: the schemes its bounds priced, the step time the set
bounds priced bubbles under, and the scheme sets it expanded into their strategies, with the
multipliers of the strategies whose bound lies near the global one (the fluid dual's) and of every
strategy the tightening raised (the packing bound's, with its functions where it mixed them, or the
refined duals').

The certificate lists only what a verifier cannot find itself: every other scheme set of the space
is covered by its set bound, which the verifier recomputes (`planner.verify_bound`). A set the
search expanded only in part (too many strategies to list) is left out: its set bound covers it.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

import numpy as np

from hydraplan.planner.schemas import BoundCertificate, ExpandedSet, StrategyWitness

if TYPE_CHECKING:
    from hydraplan.planner.bounds import BoundTables
    from hydraplan.planner.search import Frontier

# the strategies with the least bounds, up to MAX_WITNESSES of those within WITNESS_MARGIN above the
# global bound, carry their multipliers, and so does every strategy the tightening raised (packing
# bound or refined duals); the verifier bounds the others with its own. Measured
# (benchmarks/verify_bound.py): at 8B / 1,024 H100 12,811 strategies lay within 5% (1.2 MB of
# witnesses) and the verifier proved the same bound with none of them
WITNESS_MARGIN = 0.01
MAX_WITNESSES = 64
MULTIPLIER_DIGITS = 6  # any nonnegative multipliers give a valid bound: rounding costs nothing


def scheme_text(scheme) -> str:
    """`<tp,pp,cp>`, and `<tp,pp,cp,v>` for an interleaved scheme (never two schemes one text)."""
    return str(scheme)


def build_certificate(frontier: Frontier, space: str, max_schemes: int, lower_bound_s: float) -> BoundCertificate:
    """The certificate of `lower_bound_s`, the frontier's global bound."""
    tables = frontier.tables
    near_s = lower_bound_s * (1 + WITNESS_MARGIN)
    least: dict[tuple[int, ...], float] = {}  # per listed set: the least bound of its strategies
    if space == "search":
        for columns, huge, least_s in frontier.expanded:
            if not huge:
                least[columns] = min(least.get(columns, math.inf), least_s)
    close: list[tuple[float, tuple[int, ...], tuple[int, ...]]] = []
    # strategies the tightening raised, with the multipliers that proved it (in column order)
    # and the functions of its packing bound where it priced each scheme by its own
    raised: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[float, tuple[float, ...], tuple[str, ...] | None]] = {}
    for entry in frontier.strategies:
        terms = entry.strategy.counts
        if space == "search" and len(terms) == 1:  # a single scheme has one strategy: it is expanded
            columns = (frontier.column_of[terms[0][0]],)
            least[columns] = min(least.get(columns, math.inf), entry.bound_s)
        listed = entry.bound_s < near_s or space != "search"
        if listed or entry.witness is not None:
            positions = sorted(range(len(terms)), key=lambda k: frontier.column_of[terms[k][0]])
            columns = tuple(frontier.column_of[terms[k][0]] for k in positions)
            counts = tuple(terms[k][1] for k in positions)
            if entry.witness is not None:
                functions = None if entry.functions is None else tuple(entry.functions[k] for k in positions)
                raised[columns, counts] = (entry.bound_s, tuple(entry.witness[k] for k in positions), functions)
        if listed:
            close.append((entry.bound_s, columns, counts))
            if space != "search":
                least[columns] = min(least.get(columns, math.inf), entry.bound_s)
    chosen: dict[tuple[int, ...], list[tuple[tuple[int, ...], float]]] = {}
    for bound_s, columns, counts in heapq.nsmallest(MAX_WITNESSES, (c for c in close if c[0] < near_s)):
        if columns in least:
            chosen.setdefault(columns, []).append((counts, bound_s))
    # every strategy the tightening raised carries its multipliers, however far above the global
    # bound: they may lie off the verifier's grid, which alone may leave the strategy below the claim
    for (columns, counts), (bound_s, *_) in sorted(raised.items()):
        if columns in least and all(counts != member for member, _ in chosen.get(columns, [])):
            chosen.setdefault(columns, []).append((counts, bound_s))
    expanded = []
    for columns in sorted(least):
        members = chosen.get(columns, [])
        witnesses = []
        if members:
            fluid = tables.fluid_multipliers(columns, np.array([counts for counts, _ in members]))
            # a bound the tightening raised is proved by its own multipliers (and functions); the
            # others' fluid dual multipliers lie on the verifier's own grid: it finds those itself
            proofs = [raised.get((columns, counts), (0.0, row, None))[1:] for (counts, _), row in zip(members, fluid)]
            witnesses = [
                StrategyWitness(
                    counts=list(counts),
                    bound_s=bound,
                    multipliers=[round(float(weight), MULTIPLIER_DIGITS) for weight in weights],
                    functions=None if functions is None else list(functions),
                )
                for (counts, bound), (weights, functions) in zip(members, proofs)
            ]
        least_s = least[columns] if math.isfinite(least[columns]) else None  # None: no strategy has a plan
        expanded.append(ExpandedSet(schemes=list(columns), bound_s=least_s, strategies=witnesses))
    pricing = frontier.set_pricing
    cap_s = pricing[2] if pricing is not None and np.isfinite(pricing[2]) else None
    return BoundCertificate(
        space=space,
        max_schemes=max_schemes,
        schemes=[scheme_text(coef.scheme) for coef in tables.coefs],
        pricing_cap_s=cap_s,
        expanded=expanded,
    )


def fixed_certificate(tables: BoundTables, counts: np.ndarray, bound_s: float, max_schemes: int) -> BoundCertificate:
    """The certificate of a fixed strategy's bound (`solve.evaluate_strategy`): its schemes are the
    tables' columns, its pipeline counts one row of `counts`."""
    columns = list(range(len(tables.coefs)))
    weights = tables.fluid_multipliers(columns, counts)[0]
    witness = StrategyWitness(
        counts=[int(count) for count in counts[0]],
        bound_s=bound_s,
        multipliers=[round(float(weight), MULTIPLIER_DIGITS) for weight in weights],
    )
    return BoundCertificate(
        space="fixed",
        max_schemes=max_schemes,
        schemes=[scheme_text(coef.scheme) for coef in tables.coefs],
        expanded=[ExpandedSet(schemes=columns, bound_s=bound_s, strategies=[witness])],
    )
