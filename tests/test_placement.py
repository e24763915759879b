"""Pipelines placed on nodes as `planner.check` requires: TP groups, and TP x CP grids no larger
than a node, inside one node. The planner keeps to schemes whose placement guarantees it
(`strategies.unplaceable_reason`) and refuses a strategy that names another, naming the scheme."""

from __future__ import annotations

import random

import pytest
from synthetic import synthetic_profile, wikipedia_like_batch

from hydraplan.planner.check import check_plan
from hydraplan.planner.errors import PlanningError
from hydraplan.planner.schemas import PlanRequest, SolverOptions
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.solve import evaluate_strategy, solve
from hydraplan.planner.strategies import Strategy, place_pipelines, unplaceable_reason


@pytest.mark.parametrize(
    ("scheme", "num_gpus", "per_node", "placeable"),
    [
        ((8, 1, 1), 16, 8, True),
        ((8, 1, 1), 16, 4, False),  # TP across two nodes
        ((2, 1, 4), 16, 4, True),  # a grid of two whole nodes, TP 2 dividing one
        ((4, 1, 2), 16, 4, True),  # two whole nodes, TP 4 divides one
        ((3, 1, 1), 16, 8, False),  # 3 does not divide a node of 8
        ((2, 2, 1), 24, 6, True),  # a power of two dividing 6
        ((4, 1, 1), 24, 6, False),
        ((3, 1, 2), 24, 6, True),  # one whole node
        ((3, 1, 1), 24, 6, False),  # 3 divides 6, but beside grids of 2 it would straddle nodes
        ((8, 1, 1), 8, 16, True),  # part of one node: anything goes
    ],
)
def test_which_schemes_the_placement_keeps_inside_nodes(scheme, num_gpus, per_node, placeable) -> None:
    reason = unplaceable_reason(ParallelScheme(*scheme), num_gpus, per_node)
    assert (reason is None) == placeable, reason


def _in_nodes(strategy: Strategy, per_node: int) -> bool:
    """The checker's rule, restated: TP groups and grids of at most a node inside one node."""
    for scheme, placement in zip(strategy.pipeline_schemes(), place_pipelines(strategy.pipeline_schemes())):
        for stage in placement.stage_ranks:
            groups = [stage[start : start + scheme.tp] for start in range(0, len(stage), scheme.tp)]
            if len(stage) <= per_node:
                groups.append(stage)
            if any(min(group) // per_node != max(group) // per_node for group in groups):
                return False
    return True


def test_strategies_of_placeable_schemes_are_placed_inside_nodes() -> None:
    rng = random.Random(3)
    checked = 0
    for _ in range(400):
        per_node = rng.choice([4, 6, 8, 12, 16])
        nodes = rng.randint(2, 6)
        num_gpus = per_node * nodes
        schemes = [ParallelScheme(tp, pp, cp) for tp in (1, 2, 3, 4, 8) for pp in (1, 2, 3) for cp in (1, 2, 4)]
        schemes = [s for s in schemes if unplaceable_reason(s, num_gpus, per_node) is None]
        chosen = rng.sample(schemes, rng.randint(1, 3))
        counts, used = [], 0
        for scheme in chosen:
            count = rng.randint(1, 3)
            counts.append((scheme, count))
            used += scheme.num_gpus * count
        if used > num_gpus:
            continue
        filler = ParallelScheme(1, 1, 1)
        strategy = Strategy.of(counts + ([(filler, num_gpus - used)] if num_gpus > used else []))
        assert _in_nodes(strategy, per_node), (strategy, per_node)
        checked += 1
    assert checked > 150


def test_the_search_keeps_to_schemes_it_can_place() -> None:
    """A profile for 8-GPU nodes planned on 4-GPU nodes: no TP 8 and the plan passes the checker."""
    profile = synthetic_profile(max_gpus=16, gpus_per_node=8)
    assert any(entry.tp == 8 for entry in profile.schemes)
    request = PlanRequest(
        lengths=wikipedia_like_batch(60_000, seed=2),
        num_gpus=16,
        gpus_per_node=4,
        options=SolverOptions(time_limit_s=30, solver="greedy"),
    )
    plan = solve(request, profile)
    assert check_plan(plan) == [] and all(pipeline.scheme.tp <= 4 for pipeline in plan.pipelines)


def test_a_strategy_that_cannot_be_placed_is_refused_naming_the_scheme() -> None:
    profile = synthetic_profile(max_gpus=16, gpus_per_node=8)
    options = SolverOptions(time_limit_s=30, solver="greedy", strategy_pool=["2x<8,1,1>"])
    request = PlanRequest(lengths=wikipedia_like_batch(30_000, seed=1), num_gpus=16, gpus_per_node=4, options=options)
    with pytest.raises(PlanningError, match=r"<8,1,1> cannot be placed on 4-GPU nodes"):
        solve(request, profile)
    plain = request.model_copy(update={"options": SolverOptions(time_limit_s=30, solver="greedy")})
    with pytest.raises(PlanningError, match=r"<8,1,1> cannot be placed on 4-GPU nodes"):
        evaluate_strategy(plain, profile, Strategy.of([(ParallelScheme(8, 1, 1), 2)]))
