"""Joint refinement: moves and swaps between pipelines on the true (post-packing) objective, and
local search on the packing of the slowest pipelines (`polish_packings`).

Each round takes the slowest pipeline and tries to move one of its items to, or swap it with a
smaller item of, a faster pipeline whose capacity fits. A try re-packs both pipelines exactly and
is kept only if the slower of the two ends below the old maximum, so the step time never grows.
Cheap filters (the re-packed pair must be able to beat the maximum by the items' raw work) keep the
number of exact re-packs small.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from hydraplan.planner.candidate import Candidate
from hydraplan.planner.packing import PackedPipeline, improve_packing, pack_pipeline

MAX_ITEMS_TRIED = 6
MAX_TARGETS_TRIED = 4


def refine(candidate: Candidate, lengths: np.ndarray, max_rounds: int, should_stop: Callable[[], bool]) -> Candidate:
    """Improve `candidate` by local search; returns it unchanged when no move helps."""
    assignment = [np.asarray(items) for items in candidate.assignment]
    packed = list(candidate.packed)
    coefs = candidate.coefs
    for _ in range(max_rounds):
        if should_stop():
            break
        worst = int(np.argmax([pipeline.time_s for pipeline in packed]))
        change = _improving_change(worst, assignment, packed, lengths, coefs, should_stop)
        if change is None:
            break
        for pipeline, items, repacked in change:
            assignment[pipeline] = items
            packed[pipeline] = repacked
    if all(new is old for new, old in zip(packed, candidate.packed)):
        return candidate
    return replace(candidate, assignment=tuple(assignment), packed=tuple(packed))


def polish_packings(
    candidate: Candidate, lengths: np.ndarray, max_evaluations: int, should_stop: Callable[[], bool]
) -> Candidate:
    """Local search on the packing of the slowest pipeline (`planner.packing.improve_packing`),
    then of the next slowest, while the slowest one keeps getting faster."""
    packed = list(candidate.packed)
    for _ in range(len(packed)):
        if should_stop():
            break
        worst = int(np.argmax([pipeline.time_s for pipeline in packed]))
        better = improve_packing(packed[worst], lengths, candidate.coefs[worst], max_evaluations, should_stop)
        if better is packed[worst]:
            break
        packed[worst] = better
    if all(new is old for new, old in zip(packed, candidate.packed)):
        return candidate
    return replace(candidate, packed=tuple(packed))


def _improving_change(worst, assignment, packed, lengths, coefs, should_stop: Callable[[], bool]):
    """The first move or swap out of the slowest pipeline that lowers the pair's maximum (None
    when there is none, or when `should_stop` says so between items)."""
    limit = packed[worst].time_s * (1 - 1e-9)
    mine = assignment[worst]
    if len(mine) < 2:
        return None
    work_mine = coefs[worst].work_s(lengths[mine])
    by_work = mine[np.argsort(-work_mine, kind="stable")]
    targets = sorted((pipeline.time_s, index) for index, pipeline in enumerate(packed) if index != worst)
    for item in by_work[:MAX_ITEMS_TRIED].tolist():
        if should_stop():
            return None
        length = lengths[item]
        for time_s, target in targets[:MAX_TARGETS_TRIED]:
            coef = coefs[target]
            if length > coef.capacity_tokens:
                continue
            gain = float(coef.work_s(np.array([length]))[0])
            if time_s + gain < limit:
                change = _try(worst, target, [item], [], assignment, lengths, coefs, limit)
                if change:
                    return change
            theirs = assignment[target]
            smaller = theirs[(lengths[theirs] < length) & (lengths[theirs] <= coefs[worst].capacity_tokens)]
            if len(smaller):
                partner = int(smaller[np.argmax(lengths[smaller])])
                change = _try(worst, target, [item], [partner], assignment, lengths, coefs, limit)
                if change:
                    return change
    return None


def _try(source, target, outgoing, incoming, assignment, lengths, coefs, limit):
    """Re-pack both pipelines after the exchange; the change if both end below `limit`."""
    new_source = np.setdiff1d(assignment[source], outgoing)
    if incoming:
        new_source = np.union1d(new_source, incoming)
    new_target = np.union1d(np.setdiff1d(assignment[target], incoming), outgoing)
    if len(new_source) == 0 or len(new_target) == 0:
        return None
    packed_source: PackedPipeline = pack_pipeline(new_source, lengths, coefs[source])
    if packed_source.time_s >= limit:
        return None
    packed_target = pack_pipeline(new_target, lengths, coefs[target])
    if packed_target.time_s >= limit:
        return None
    return [(source, new_source, packed_source), (target, new_target, packed_target)]
