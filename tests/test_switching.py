"""The strategy-switch model by hand: a GPU loads the part of its new (layer x TP-slice) shard its
old shard lacks, the GPU with the most to load sets the time; the solver's code
(planner/switching.py) and the checker's reference (planner/reference.py) give the same figures."""

from __future__ import annotations

import math

import pytest

from hydraplan.planner import reference
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.schemas import CostProfile, SchemeCost
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.strategies import parse_strategy
from hydraplan.planner.switching import load_fractions, pipeline_blocks, shard_rectangle, switch_cost_s

BANDWIDTH = 1e9
SHARD_BYTES = {(1, 1, 1): 8e8, (2, 1, 1): 4e8, (1, 2, 1): 4e8, (1, 1, 2): 8e8, (4, 1, 1): 2e8, (1, 4, 1): 2e8}


def profile(factor: float = 1.0) -> CostProfile:
    schemes = [
        SchemeCost(tp=tp, pp=pp, cp=cp, a=1e-9, b=1e-5, c=1e-3, capacity_tokens=4096, grad_bytes_per_gpu=shard)
        for (tp, pp, cp), shard in SHARD_BYTES.items()
    ]
    return CostProfile(
        num_layers=8, schemes=schemes, grad_sync_bandwidth_bytes_per_s=BANDWIDTH, switch_bytes_per_weight_byte=factor
    )


def both(previous: str, current: str, factor: float = 1.0) -> tuple[float, float]:
    cost_profile = profile(factor)
    pipelines = pipeline_blocks(parse_strategy(current))
    solver = switch_cost_s(parse_strategy(previous), pipelines, ProfileCostModel(cost_profile))
    keyed = [((s.tp, s.pp, s.cp), ranks) for s, ranks in pipelines]
    return solver, reference.switch_cost_s(cost_profile, previous, keyed)


@pytest.mark.parametrize(
    ("previous", "current", "seconds"),
    [
        # same placement: nothing moves
        ("2x<2,1,1>", "2x<2,1,1>", 0.0),
        # whole-model replicas hold every new shard
        ("4x<1,1,1>", "2x<2,1,1>", 0.0),
        ("4x<1,1,1>", "1x<2,1,1> + 1x<1,2,1>", 0.0),
        # CP ranks hold the whole model too: going back to TP / PP halves loads nothing
        ("1x<1,1,2> + 2x<1,1,1>", "1x<2,1,1> + 1x<1,2,1>", 0.0),
        # a TP half becomes a whole replica: each GPU loads the other half of the whole model
        ("2x<2,1,1>", "4x<1,1,1>", 0.5 * 8e8 / BANDWIDTH),
        # ranks 0-1 (TP halves) become CP ranks, ranks 2-3 (PP stages) replicas: each lacks half
        ("1x<2,1,1> + 1x<1,2,1>", "1x<1,1,2> + 2x<1,1,1>", 0.5 * 8e8 / BANDWIDTH),
        # a quarter TP slice of every layer becomes every slice of a quarter of the layers: 3/4 is new
        ("1x<4,1,1>", "1x<1,4,1>", 0.75 * 2e8 / BANDWIDTH),
        # the same strategy written in another order is the same placement
        ("1x<2,1,1> + 2x<1,1,1>", "2x<1,1,1> + 1x<2,1,1>", 0.0),
    ],
)
def test_switch_costs_by_hand(previous: str, current: str, seconds: float) -> None:
    solver, checker = both(previous, current)
    assert solver == pytest.approx(seconds, rel=1e-12, abs=1e-15)
    assert checker == pytest.approx(seconds, rel=1e-12, abs=1e-15)


def test_moments_that_travel_with_their_shard_triple_the_bytes() -> None:
    single, _ = both("2x<2,1,1>", "4x<1,1,1>")
    solver, checker = both("2x<2,1,1>", "4x<1,1,1>", factor=3.0)
    assert single > 0 and solver == pytest.approx(3 * single) and checker == pytest.approx(3 * single)


def test_the_gpu_with_the_most_to_load_sets_the_time() -> None:
    # from 1x<4,1,1>: <2,1,1> on ranks 0-1 needs slices [0, 1/2) and [1/2, 1) where ranks held
    # [0, 1/4) and [1/4, 1/2): rank 0 lacks half, rank 1 all; the <1,1,1> replicas lack 3/4
    previous = parse_strategy("1x<4,1,1>")
    pipelines = pipeline_blocks(parse_strategy("1x<2,1,1> + 2x<1,1,1>"))
    assert [float(f) for f in load_fractions(previous, pipelines)] == [1.0, 0.75, 0.75]
    solver, checker = both("1x<4,1,1>", "1x<2,1,1> + 2x<1,1,1>")
    expected = max(1.0 * 4e8, 0.75 * 8e8) / BANDWIDTH
    assert math.isclose(solver, expected) and math.isclose(checker, expected)


def test_shard_rectangles_follow_the_placement_order() -> None:
    # <2,2,2>: TP innermost, then CP, then PP; position 5 = stage 1, CP rank 0, TP rank 1
    scheme = ParallelScheme(2, 2, 2)
    assert [float(x) for x in shard_rectangle(scheme, 5)] == [0.5, 1.0, 0.5, 1.0]
    assert [float(x) for x in shard_rectangle(scheme, 2)] == [0.0, 0.5, 0.0, 0.5]
