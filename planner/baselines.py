"""Baselines the planner is compared against.

`megatron`: the fixed layout of Megatron-LM style training — one homogeneous scheme for every
data-parallel replica (the best one for this batch, chosen by simulated step time), sequences
packed in arrival order into micro-batches up to the capacity (token-count packing), and the
micro-batches dealt round-robin to the replicas.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from planner.bounds import BoundTables
from planner.build import build_plan
from planner.cost import ProfileCostModel, SchemeCoefficients
from planner.errors import PlanningError
from planner.items import Items, prepare_items
from planner.packing import PackedPipeline
from planner.schemas import CostProfile, Plan, PlanRequest, SolverStats
from planner.search import Candidate
from planner.simulate import simulate_1f1b
from planner.strategies import Strategy


def arrival_order_micro_batches(lengths: np.ndarray, capacity_tokens: int) -> list[np.ndarray]:
    """Next-fit in arrival order: a new micro-batch starts when the next item does not fit."""
    batches: list[list[int]] = [[]]
    used = 0
    for index, length in enumerate(lengths.tolist()):
        if batches[-1] and used + length > capacity_tokens:
            batches.append([])
            used = 0
        batches[-1].append(index)
        used += length
    return [np.asarray(batch, dtype=np.int64) for batch in batches]


def _megatron_candidate(items: Items, coef: SchemeCoefficients, num_gpus: int, cost: ProfileCostModel) -> Candidate | None:
    num_replicas = num_gpus // coef.scheme.num_gpus
    if num_replicas * coef.scheme.num_gpus != num_gpus or items.lengths.max() > coef.capacity_tokens:
        return None
    batches = arrival_order_micro_batches(items.lengths, coef.capacity_tokens)
    if len(batches) < num_replicas:
        return None
    packed = []
    for replica in range(num_replicas):
        mine = batches[replica::num_replicas]
        times = [coef.stage_time_s(float(items.lengths[b] @ items.lengths[b]), float(items.lengths[b].sum())) for b in mine]
        packed.append(PackedPipeline(tuple(mine), tuple(times), simulate_1f1b(times, coef.scheme.pp, coef.fwd_fraction)))
    strategy = Strategy.of([(coef.scheme, num_replicas)])
    schemes = strategy.pipeline_schemes()
    return Candidate(
        strategy=strategy,
        coefs=tuple(coef for _ in schemes),
        assignment=tuple(np.concatenate(p.micro_batches) for p in packed),
        packed=tuple(packed),
        grad_sync_s=cost.grad_sync_s(schemes),
    )


def megatron(request: PlanRequest, profile: CostProfile) -> Plan:
    """The best homogeneous arrival-order plan (see module docstring)."""
    started = time.perf_counter()
    cost = ProfileCostModel(profile)
    homogeneous = [
        cost.coefficients(scheme) for scheme in cost.schemes() if request.num_gpus % scheme.num_gpus == 0
    ]
    if not homogeneous:
        raise PlanningError(f"no scheme of the profile divides {request.num_gpus} GPUs evenly")
    largest = max(coef.capacity_tokens for coef in homogeneous)
    items = prepare_items(request.lengths, largest, request.options.oversize)
    candidates = [_megatron_candidate(items, coef, request.num_gpus, cost) for coef in homogeneous]
    feasible = [candidate for candidate in candidates if candidate is not None]
    if not feasible:
        raise PlanningError("no homogeneous strategy can hold the batch (too few sequences or capacity)")
    best = min(feasible, key=lambda candidate: (candidate.step_time_s, str(candidate.strategy)))
    tables = BoundTables.build(items.lengths, [best.coefs[0]])
    bound = tables.pipeline_time_bound_s([0], request.num_gpus) + best.grad_sync_s
    stats = SolverStats(
        backend="baseline:megatron",
        solve_time_s=time.perf_counter() - started,
        num_schemes=len(homogeneous),
        num_strategies=len(homogeneous),
        num_strategies_solved=len(feasible),
        seed=request.options.seed,
    )
    return build_plan(request, profile, items, best, bound, stats, False, best.strategy)


BASELINES: dict[str, Callable[[PlanRequest, CostProfile], Plan]] = {"megatron": megatron}


def run_baseline(name: str, request: PlanRequest, profile: CostProfile) -> Plan:
    """Plan the batch the way baseline `name` would."""
    try:
        baseline = BASELINES[name]
    except KeyError:
        raise PlanningError(f"unknown baseline {name!r}; valid: {', '.join(sorted(BASELINES))}") from None
    return baseline(request, profile)
