"""Stage 1: assigning items to the pipelines of a strategy.

Greedy: items longest first, each to the pipeline (among those whose capacity fits it) whose
estimated 1F1B time after taking it is smallest. The estimate is the packing model of
`planner.packing`: `L + m*c + (pp-1)*(max(L/m, w_max) + c)` with `m` the best micro-batch count.
Pipelines of one scheme are interchangeable, so only the least loaded of each scheme is a
candidate. The loop is `kernels.greedy_assign`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hydraplan.planner.cost import SchemeCoefficients
from hydraplan.planner.kernels import greedy_assign, group_by_owner


def _estimate_s(coef: SchemeCoefficients, work_s: float, num_tokens: float, max_item_s: float, num_items: int) -> float:
    """Estimated 1F1B time of a non-empty pipeline of scheme `coef` holding the given totals."""
    minimum = max(1, math.ceil(num_tokens / coef.capacity_tokens))
    bubbles = coef.scheme.pp - 1
    if bubbles == 0:
        return work_s + minimum * coef.c
    ideal = math.sqrt(bubbles * work_s / coef.c) if coef.c > 0 else num_items
    count = min(max(minimum, num_items), max(minimum, round(ideal)))
    return work_s + count * coef.c + bubbles * (max(work_s / count, max_item_s) + coef.c)


def pipeline_kinds(coefs: Sequence[SchemeCoefficients]) -> tuple[list[SchemeCoefficients], np.ndarray]:
    """The distinct pipeline kinds (schemes) of `coefs` in order of first appearance, and each
    pipeline's kind index."""
    kinds = list(dict.fromkeys(coefs))
    index_of = {coef: index for index, coef in enumerate(kinds)}
    return kinds, np.array([index_of[coef] for coef in coefs], dtype=np.int64)


def greedy_dispatch(lengths: np.ndarray, coefs: Sequence[SchemeCoefficients]) -> list[np.ndarray] | None:
    """Item indices per pipeline, or None when some pipeline can get no item at all.

    Every item must fit some pipeline's capacity (the caller guarantees it).
    """
    kinds, kind_of = pipeline_kinds(coefs)  # in order of first appearance, as the loop visits them
    owner = greedy_assign(
        lengths.astype(np.float64),
        np.lexsort((np.arange(len(lengths)), -lengths)).astype(np.int64),
        kind_of,
        np.array([coef.a for coef in kinds], dtype=np.float64),
        np.array([coef.b for coef in kinds], dtype=np.float64),
        np.array([coef.c for coef in kinds], dtype=np.float64),
        np.array([coef.capacity_tokens for coef in kinds], dtype=np.float64),
        np.array([coef.scheme.pp - 1 for coef in kinds], dtype=np.int64),
    )
    assert (owner >= 0).all(), "item fits no pipeline"
    held = group_by_owner(owner, len(coefs))  # each pipeline's items in increasing index order
    if not _give_every_pipeline_work(held, lengths, coefs):
        return None
    return [np.asarray(sorted(items), dtype=np.int64) for items in held]


def least_items(coef: SchemeCoefficients) -> int:
    """Items a pipeline of this scheme must hold: one, or pp for an interleaved scheme (it runs a
    multiple of pp micro-batches, `simulate.interleaved_count_ok`, each holding an item)."""
    return coef.scheme.pp if coef.scheme.v > 1 else 1


def _give_every_pipeline_work(held: list[list[int]], lengths: np.ndarray, coefs: Sequence[SchemeCoefficients]) -> bool:
    """Move the shortest fitting item from a pipeline holding more than it needs to each pipeline
    holding fewer than it needs (`least_items`), until none is short."""
    for short, items in enumerate(held):
        while len(items) < least_items(coefs[short]):
            movable = [
                (int(lengths[item]), item, donor)
                for donor, other in enumerate(held)
                if donor != short and len(other) > least_items(coefs[donor])
                for item in other
                if lengths[item] <= coefs[short].capacity_tokens
            ]
            if not movable:
                return False
            _, item, donor = min(movable)
            held[donor].remove(item)
            items.append(item)
    return True
