"""Stage 1: assigning items to the pipelines of a strategy.

Greedy: items longest first, each to the pipeline (among those whose capacity fits it) whose
estimated 1F1B time after taking it is smallest. The estimate is the packing model of
`planner.packing`: `L + m*c + (pp-1)*(max(L/m, w_max) + c)` with `m` the best micro-batch count.
Pipelines of one scheme are interchangeable, so only the least loaded of each scheme is a
candidate; a heap per scheme finds it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hydraplan.planner.cost import SchemeCoefficients


@dataclass
class PipelineLoad:
    """What a pipeline holds so far."""

    work_s: float = 0.0
    num_tokens: float = 0.0
    max_item_s: float = 0.0
    num_items: int = 0
    items: list[int] = field(default_factory=list)


def _estimate_s(coef: SchemeCoefficients, work_s: float, num_tokens: float, max_item_s: float, num_items: int) -> float:
    """Estimated 1F1B time of a non-empty pipeline of scheme `coef` holding the given totals."""
    minimum = max(1, math.ceil(num_tokens / coef.capacity_tokens))
    bubbles = coef.scheme.pp - 1
    if bubbles == 0:
        return work_s + minimum * coef.c
    ideal = math.sqrt(bubbles * work_s / coef.c) if coef.c > 0 else num_items
    count = min(max(minimum, num_items), max(minimum, round(ideal)))
    return work_s + count * coef.c + bubbles * (max(work_s / count, max_item_s) + coef.c)


def greedy_dispatch(lengths: np.ndarray, coefs: Sequence[SchemeCoefficients]) -> list[np.ndarray] | None:
    """Item indices per pipeline, or None when some pipeline can get no item at all.

    Every item must fit some pipeline's capacity (the caller guarantees it).
    """
    loads = [PipelineLoad() for _ in coefs]
    groups: dict[SchemeCoefficients, list[tuple[float, int]]] = {}
    for index, coef in enumerate(coefs):
        groups.setdefault(coef, []).append((0.0, index))
    # per scheme: its heap and the constants of `_estimate_s`, which the loop inlines (the same
    # arithmetic: ~2x faster over the millions of (item, scheme) pairs of a large batch)
    kinds = [(heap, coef.a, coef.b, coef.c, coef.capacity_tokens, coef.scheme.pp - 1) for coef, heap in groups.items()]
    order = np.lexsort((np.arange(len(lengths)), -lengths)).tolist()
    as_float = lengths.astype(np.float64).tolist()
    ceil, sqrt = math.ceil, math.sqrt
    for item in order:
        length = as_float[item]
        best_after = math.inf
        best = None
        for heap, a, b, c, capacity, bubbles in kinds:
            if length > capacity:
                continue
            pipeline = heap[0][1]
            load = loads[pipeline]
            work_s = a * length * length + b * length
            total_s = load.work_s + work_s
            minimum = max(1, ceil((load.num_tokens + length) / capacity))
            if bubbles == 0:
                after = total_s + minimum * c
            else:
                num_items = load.num_items + 1
                ideal = sqrt(bubbles * total_s / c) if c > 0 else num_items
                count = min(max(minimum, num_items), max(minimum, round(ideal)))
                after = total_s + count * c + bubbles * (max(total_s / count, load.max_item_s, work_s) + c)
            if after < best_after or (after == best_after and best is not None and pipeline < best[0]):
                best_after, best = after, (pipeline, heap, work_s)
        assert best is not None, "item fits no pipeline"
        pipeline, heap, work_s = best
        load = loads[pipeline]
        load.work_s += work_s
        load.num_tokens += length
        load.max_item_s = max(load.max_item_s, work_s)
        load.num_items += 1
        load.items.append(item)
        heapq.heapreplace(heap, (best_after, pipeline))
    if not _give_every_pipeline_work(loads, lengths, coefs):
        return None
    return [np.asarray(sorted(load.items), dtype=np.int64) for load in loads]


def _give_every_pipeline_work(
    loads: list[PipelineLoad], lengths: np.ndarray, coefs: Sequence[SchemeCoefficients]
) -> bool:
    """Move the shortest fitting item from a pipeline holding several to each empty pipeline."""
    for empty, load in enumerate(loads):
        if load.items:
            continue
        movable = [
            (int(lengths[item]), item, donor)
            for donor, other in enumerate(loads)
            if len(other.items) > 1
            for item in other.items
            if lengths[item] <= coefs[empty].capacity_tokens
        ]
        if not movable:
            return False
        _, item, donor = min(movable)
        loads[donor].items.remove(item)
        load.items.append(item)
    return True
