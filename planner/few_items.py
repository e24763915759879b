"""A strategy's bound by enumerating assignments, for batches of only a few items.

With n items and the P pipelines of a strategy, every plan puts each item on one pipeline and at
least one item on every pipeline (an idle pipeline is no plan). A pipeline of scheme s holding k
items of work W, the largest of work w*, runs at least `max(g_s(W; k), W + E_s(w*))`
(`planner.bubble_floor`: the bubble floor over at most k micro-batches, the largest-micro-batch
path). The least over assignments of the slowest pipeline's floor bounds the strategy's pipeline
time. The fluid bounds lose exactly what this sees when a handful of long sequences meet a few
pipelines: which of them must share one.

Depth-first search over the items, longest first: empty pipelines of one scheme are
interchangeable (only the first is tried), pipelines are tried cheapest first, and a branch ends
as soon as its partial floor (`W + E_s(w*)`, which only grows) reaches the best complete
assignment so far or the cutoff. A node budget caps the work; when it runs out nothing is claimed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.planner.bubble_floor import largest_micro_batch_floor_s, pipeline_pieces
from hydraplan.planner.cost import SchemeCoefficients

MAX_ITEMS = 12  # larger batches are left to the fluid and packing bounds
MAX_NODES = 20_000
CLOCK_EVERY = 256


class _OutOfNodes(Exception):
    pass


@dataclass(frozen=True)
class FewItemsBound:
    bound_s: float  # least slowest-pipeline floor over every assignment, at most the cutoff
    assignment: tuple[np.ndarray, ...] | None  # item indices per pipeline attaining it (None: cutoff)


def few_items_bound(
    pipelines: Sequence[SchemeCoefficients],
    lengths: np.ndarray,
    cutoff_s: float,
    should_stop: Callable[[], bool] = lambda: False,
) -> FewItemsBound | None:
    """Least slowest-pipeline floor over every assignment of the items (`lengths`) to these
    pipelines (one scheme each), at most `cutoff_s`, with an assignment attaining it; None when the
    batch is too large or the search runs out of nodes or time (`should_stop`, asked every
    CLOCK_EVERY nodes). The assignment is a good plan too: for one-stage pipelines the floor is
    the time up to micro-batch overheads."""
    count, num_pipelines = len(lengths), len(pipelines)
    if count > MAX_ITEMS:
        return None
    if count < num_pipelines:
        return FewItemsBound(cutoff_s, None)  # some pipeline would stay idle: no plan of this strategy
    by_length = sorted(range(count), key=lambda index: (-int(lengths[index]), index))
    ordered = [int(lengths[index]) for index in by_length]
    work = [
        [
            float(coef.work_s(np.array([length]))[0]) if length <= coef.capacity_tokens else math.inf
            for coef in pipelines
        ]
        for length in ordered
    ]
    path = [
        [largest_micro_batch_floor_s(coef, w) if math.isfinite(w) else math.inf for coef, w in zip(pipelines, row)]
        for row in work
    ]
    pieces = [
        [list(zip(*(values.tolist() for values in pipeline_pieces(coef, k)))) for k in range(count + 1)]
        for coef in pipelines
    ]
    loads, held, largest = [0.0] * num_pipelines, [0] * num_pipelines, [0.0] * num_pipelines
    owners: list[int] = []  # pipeline of each item placed so far (longest first)
    best, best_owners = cutoff_s, None
    nodes = 0

    def complete() -> float:
        return max(
            max(min(alpha * load + beta for alpha, beta in pieces[p][k]), load + top)
            for p, (load, k, top) in enumerate(zip(loads, held, largest))
        )

    def visit(item: int, partial: float) -> None:
        nonlocal best, best_owners, nodes
        nodes += 1
        if nodes > MAX_NODES or (nodes % CLOCK_EVERY == 0 and should_stop()):
            raise _OutOfNodes
        empty = held.count(0)
        if item == count:
            if empty == 0:  # an idle pipeline is no plan
                value = complete()
                if value < best:
                    best, best_owners = value, list(owners)
            return
        if empty > count - item:
            return  # too few items left to give every pipeline one
        options, tried_empty = [], set()
        for p, coef in enumerate(pipelines):
            w = work[item][p]
            if not math.isfinite(w) or (held[p] and empty == count - item):
                continue  # the item does not fit, or every item left must open an empty pipeline
            if held[p] == 0:
                if coef in tried_empty:
                    continue
                tried_empty.add(coef)
                floor = w + path[item][p]  # the first (longest) item of p sets its path floor
            else:
                floor = loads[p] + w + largest[p]
            options.append((max(partial, floor), p))
        for floor, p in sorted(options):
            if floor >= best:
                break
            first = held[p] == 0
            loads[p] += work[item][p]
            held[p] += 1
            if first:
                largest[p] = path[item][p]
            owners.append(p)
            visit(item + 1, floor)
            owners.pop()
            loads[p] -= work[item][p]
            held[p] -= 1
            if first:
                largest[p] = 0.0

    try:
        visit(0, 0.0)
    except _OutOfNodes:
        return None
    if best_owners is None:
        return FewItemsBound(best, None)
    assignment = tuple(
        np.array(sorted(by_length[i] for i, owner in enumerate(best_owners) if owner == p), dtype=np.int64)
        for p in range(num_pipelines)
    )
    return FewItemsBound(best, assignment)
