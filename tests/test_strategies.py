"""Schemes, strategies, rank placement and pipeline-count enumeration."""

from __future__ import annotations

import pytest

from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.strategies import Strategy, count_vectors, parse_strategy, place_pipelines


def test_scheme_is_validated_and_derives_gpu_counts():
    scheme = ParallelScheme(4, 2, 2)
    assert scheme.num_gpus == 16 and scheme.gpus_per_stage == 8 and str(scheme) == "<4,2,2>"
    assert ParallelScheme.parse("<4,2,2>") == scheme and ParallelScheme.parse("8,1") == ParallelScheme(8, 1, 1)
    for bad in [(0, 1, 1), (1, -2, 1), (1, 1, 1.5), (True, 1, 1)]:
        with pytest.raises(ValueError):
            ParallelScheme(*bad)
    with pytest.raises(ValueError, match="<a,b>"):
        ParallelScheme.parse("<a,b>")


def test_strategy_text_round_trip_and_totals():
    strategy = parse_strategy("6x<4,2,1> + 1x<8,1,2>")
    assert str(strategy) == "1x<8,1,2> + 6x<4,2,1>"
    assert strategy.num_gpus == 64 and strategy.num_pipelines == 7
    assert parse_strategy(str(strategy)) == strategy
    assert Strategy.of([(ParallelScheme(1, 1), 2), (ParallelScheme(1, 1), 1)]) == parse_strategy("3x<1,1,1>")
    with pytest.raises(ValueError, match="COUNTx"):
        parse_strategy("two of <1,1,1>")
    with pytest.raises(ValueError, match="at least one"):
        Strategy.of({ParallelScheme(1, 1): 0})


def test_placement_keeps_tp_and_cp_groups_inside_nodes():
    strategy = parse_strategy("2x<2,2,1> + 1x<4,1,2> + 3x<1,4,1> + 1x<8,2,1>")
    gpus_per_node = 8
    placements = place_pipelines(strategy.pipeline_schemes())
    all_ranks = [rank for placement in placements for rank in placement.ranks]
    assert sorted(all_ranks) == list(range(strategy.num_gpus))
    for scheme, placement in zip(strategy.pipeline_schemes(), placements):
        assert len(placement.stage_ranks) == scheme.pp
        for stage in placement.stage_ranks:
            assert len(stage) == scheme.gpus_per_stage
            for start in range(0, len(stage), scheme.tp):
                group = stage[start : start + scheme.tp]
                assert len({rank // gpus_per_node for rank in group}) == 1, (scheme, group)
            if scheme.gpus_per_stage <= gpus_per_node:
                assert len({rank // gpus_per_node for rank in stage}) == 1, (scheme, stage)


def test_count_vectors_enumerate_exact_covers():
    schemes = [ParallelScheme(8, 1, 1), ParallelScheme(4, 1, 1), ParallelScheme(2, 1, 1)]
    vectors = list(count_vectors(schemes, 24))
    assert vectors and len(set(vectors)) == len(vectors)
    for counts in vectors:
        assert min(counts) >= 1
        assert sum(count * scheme.num_gpus for count, scheme in zip(counts, schemes)) == 24
    brute = {(x, y, z) for x in range(1, 4) for y in range(1, 7) for z in range(1, 13) if 8 * x + 4 * y + 2 * z == 24}
    assert set(vectors) == brute
    assert list(count_vectors([ParallelScheme(8, 1, 1)], 12)) == []
