"""Strategy-switch cost: the re-sharding of weights when a step changes strategy.

Placement is a pure function of the strategy (`planner.strategies.place_pipelines`). A pipeline
whose scheme and rank block are the same as in the previous step keeps its weights; every GPU of any
other pipeline loads its new bf16 weight shard (`grad_bytes_per_gpu` bytes: the gradient shard has
the weights' size and dtype). The loads run in parallel over the slowest link (the gradient-sync
bandwidth), so the largest shard sets the time. Optimizer states are sharded over all GPUs
independently of the strategy (ZeRO-1 over the flat rank space) and do not move.
"""

from __future__ import annotations

from collections.abc import Sequence

from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.errors import PlanningError
from hydraplan.planner.schemas import CostProfile
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.strategies import Strategy, place_pipelines


def pipeline_blocks(strategy: Strategy) -> list[tuple[ParallelScheme, tuple[int, ...]]]:
    """(scheme, ranks) of every pipeline of a strategy as placed by the planner."""
    schemes = strategy.pipeline_schemes()
    return [(scheme, tuple(placement.ranks)) for scheme, placement in zip(schemes, place_pipelines(schemes))]


def require_switch_pricing(previous_strategy: str | None, profile: CostProfile) -> None:
    """Refuse a previous strategy the profile cannot price: without the gradient-sync bandwidth a
    switch would silently cost nothing, and the planner would switch for any gain."""
    if previous_strategy is not None and profile.grad_sync_bandwidth_bytes_per_s is None:
        raise PlanningError(
            f"previous_strategy {previous_strategy!r}: the cost profile has no grad_sync_bandwidth_bytes_per_s, "
            "so the re-sharding cost of a strategy switch cannot be priced (add it to the profile, or plan "
            "without a previous strategy)"
        )


def switch_cost_s(
    previous: Strategy | None, pipelines: Sequence[tuple[ParallelScheme, tuple[int, ...]]], cost: ProfileCostModel
) -> float:
    """Seconds to re-shard from `previous` to the given (scheme, ranks) pipelines; 0 without one
    (callers refuse a previous strategy without a bandwidth first: `require_switch_pricing`)."""
    if previous is None:
        return 0.0
    bandwidth = cost.profile.grad_sync_bandwidth_bytes_per_s
    if bandwidth is None:
        raise PlanningError("the cost profile has no grad_sync_bandwidth_bytes_per_s to price a strategy switch")
    kept = set(pipeline_blocks(previous))
    moved = {scheme for scheme, ranks in pipelines if (scheme, tuple(ranks)) not in kept}
    if not moved:
        return 0.0
    return max(cost.coefficients(scheme).grad_bytes_per_gpu for scheme in moved) / bandwidth
