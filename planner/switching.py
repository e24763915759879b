"""Strategy-switch cost: the re-sharding of weights when a step changes strategy.

Placement is a pure function of the strategy (`planner.strategies.place_pipelines`): inside a
pipeline TP is innermost, then CP, then PP, so the GPU at position `p` of a `<tp, pp, cp>` block
holds stage `p // (tp*cp)` (the layer fraction `[s/pp, (s+1)/pp)` of the model; with v chunks
per rank, the fractions of virtual stages `s, s + pp, ...` of `pp * v`) and TP slice
`p % tp` (the fraction `[t/tp, (t+1)/tp)` of every sharded tensor); CP ranks and replicas hold the
same shard. In that (layer x TP-slice) square a GPU's new shard is a rectangle, and what it must
load is the part its old rectangle does not cover: `1 - |old & new| / |new|` of the new scheme's
`grad_bytes_per_gpu` (the gradient shard has the weights' size and dtype), times the profile's
`switch_bytes_per_weight_byte` (1 when the optimizer state is ZeRO-sharded over the flat rank space
and stays; 3 when the AdamW moments travel with their shard, as in hydraplan's runtime). Every GPU
loads in parallel over the slowest link (the gradient-sync bandwidth), so the GPU with the most to
load sets the time. A GPU whose old shard covers its new one loads nothing: leaving a strategy of
whole-model replicas (`N x <1,1,1>`, or CP ranks of pp 1) costs nothing.

Layers are taken as equally heavy (the embedding and head sit on the first and last stages, which
`grad_bytes_per_gpu`, the largest stage's shard, already prices); this is what
`benchmarks/switch_bytes.py` compares with the bytes the runtime moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache

from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.errors import PlanningError
from hydraplan.planner.schemas import CostProfile
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.strategies import Strategy, place_pipelines

__all__ = [
    "gpu_load_fraction",
    "load_fractions",
    "pipeline_blocks",
    "require_switch_pricing",
    "shard_rectangle",
    "switch_cost_s",
]

Rectangle = tuple[Fraction, Fraction, Fraction, Fraction]  # layer start, layer stop, TP start, TP stop


def pipeline_blocks(strategy: Strategy) -> list[tuple[ParallelScheme, tuple[int, ...]]]:
    """(scheme, ranks) of every pipeline of a strategy as placed by the planner."""
    schemes = strategy.pipeline_schemes()
    return [(scheme, tuple(placement.ranks)) for scheme, placement in zip(schemes, place_pipelines(schemes))]


def shard_rectangle(scheme: ParallelScheme, position: int) -> Rectangle:
    """The (layer x TP-slice) rectangle the GPU at `position` of a plain `scheme` pipeline holds."""
    (rectangle,) = shard_rectangles(scheme.plain, position)
    return rectangle


def shard_rectangles(scheme: ParallelScheme, position: int) -> tuple[Rectangle, ...]:
    """The disjoint rectangles the GPU at `position` of a `scheme` pipeline holds: one per model
    chunk, chunk c of stage s being the layer fraction of virtual stage `c * pp + s` of `pp * v`."""
    stage, tp_rank = position // (scheme.tp * scheme.cp), position % scheme.tp
    virtual = scheme.num_virtual_stages
    return tuple(
        (
            Fraction(chunk * scheme.pp + stage, virtual),
            Fraction(chunk * scheme.pp + stage + 1, virtual),
            Fraction(tp_rank, scheme.tp),
            Fraction(tp_rank + 1, scheme.tp),
        )
        for chunk in range(scheme.v)
    )


@lru_cache(maxsize=64)
def _held_rectangles(previous: Strategy) -> dict[int, tuple[Rectangle, ...]]:
    return {
        rank: shard_rectangles(scheme, position)
        for scheme, ranks in pipeline_blocks(previous)
        for position, rank in enumerate(ranks)
    }


def _overlap(old: Rectangle, new: Rectangle) -> Fraction:
    layers = max(Fraction(0), min(old[1], new[1]) - max(old[0], new[0]))
    slices = max(Fraction(0), min(old[3], new[3]) - max(old[2], new[2]))
    return layers * slices


def gpu_load_fraction(previous: Strategy, scheme: ParallelScheme, position: int, rank: int) -> Fraction:
    """The share of its new shard (position `position` of a `scheme` pipeline) that GPU `rank`
    did not hold under `previous`: 1 for a GPU `previous` did not use."""
    old = _held_rectangles(previous).get(rank)
    if old is None:
        return Fraction(1)
    new = shard_rectangles(scheme, position)
    held = sum((_overlap(before, after) for before in old for after in new), Fraction(0))
    area = sum(((after[1] - after[0]) * (after[3] - after[2]) for after in new), Fraction(0))
    return 1 - held / area


@lru_cache(maxsize=16384)
def _block_load_fraction(previous: Strategy, scheme: ParallelScheme, ranks: tuple[int, ...]) -> Fraction:
    """The largest share of its new shard any GPU of the block lacks (0: the block loads nothing)."""
    return max(gpu_load_fraction(previous, scheme, position, rank) for position, rank in enumerate(ranks))


def load_fractions(previous: Strategy, pipelines: Sequence[tuple[ParallelScheme, tuple[int, ...]]]) -> list[Fraction]:
    """Per pipeline, the largest share of its weight shard one of its GPUs must load."""
    return [_block_load_fraction(previous, scheme, tuple(ranks)) for scheme, ranks in pipelines]


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
    loads = [
        float(fraction) * cost.coefficients(scheme).grad_bytes_per_gpu
        for (scheme, _), fraction in zip(pipelines, load_fractions(previous, pipelines))
        if fraction
    ]
    if not loads:
        return 0.0
    return max(loads) * cost.profile.switch_bytes_per_weight_byte / bandwidth
