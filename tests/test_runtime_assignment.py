"""Plan -> per-rank execution without launching ranks: the 1F1B order, rank assignment, refusals,
and the slice-intersection pieces of the gradient sync and of a strategy switch (the tests marked
`runtime` need torch: skipped without it, failed under CI=true)."""

from __future__ import annotations

import pytest

from hydraplan.planner.build import identified
from hydraplan.planner.simulate import stage_operations
from hydraplan.runtime.assignment import (
    PlanRefusedError,
    assign_ranks,
    global_token_count,
    one_f_one_b,
    validate_plan,
)
from tests.runtime_plans import MINI_MODEL, fixed_plan, write_models_file
from tests.runtime_support import require_torch

LENGTHS = [5, 9, 2, 7, 12, 30, 8, 4, 11]


@pytest.mark.parametrize("num_stages", [1, 2, 3, 4])
@pytest.mark.parametrize("num_micro_batches", [1, 2, 3, 5, 8])
def test_the_runtime_runs_the_order_the_planner_simulates(num_stages, num_micro_batches):
    for stage in range(num_stages):
        order = one_f_one_b(stage, num_stages, num_micro_batches)
        assert order == stage_operations(stage, num_stages, num_micro_batches)
        assert sorted(order) == sorted((forward, i) for forward in (True, False) for i in range(num_micro_batches))


def test_ranks_find_their_pipeline_stage_groups_and_micro_batches():
    plan = fixed_plan("1x<2,1,2> + 1x<1,2,2>", LENGTHS, 8)
    assignments = assign_ranks(plan)
    assert [a.rank for a in assignments] == list(range(8))
    by_pipeline = {p.index: p for p in plan.pipelines}
    for a in assignments:
        pipeline = by_pipeline[a.pipeline_index]
        stage_ranks = pipeline.stage_ranks[a.stage]
        # stage-major, then CP, then TP
        assert stage_ranks[a.cp_rank * a.scheme.tp + a.tp_rank] == a.rank
        assert a.rank in a.tp_ranks and a.rank in a.cp_ranks
        assert len(a.tp_ranks) == a.scheme.tp and len(a.cp_ranks) == a.scheme.cp
        assert [w.lengths for w in a.micro_batches] == [tuple(m.lengths) for m in pipeline.micro_batches]
        assert [w.offsets for w in a.micro_batches] == [tuple(m.offsets) for m in pipeline.micro_batches]
    deep = [a for a in assignments if a.scheme.pp == 2]
    first, last = sorted(deep, key=lambda a: a.stage)[0], sorted(deep, key=lambda a: -a.stage)[0]
    assert first.previous_rank is None and first.next_rank is not None
    peer = assignments[first.next_rank]
    assert (peer.stage, peer.tp_rank, peer.cp_rank, peer.previous_rank) == (1, first.tp_rank, first.cp_rank, first.rank)
    assert last.next_rank is None
    assert global_token_count(plan) == sum(LENGTHS)


def test_split_chunks_keep_their_offsets():
    plan = fixed_plan("1x<2,1,1> + 1x<1,2,1>", LENGTHS, 4)
    assert plan.split_sequence_ids == [5]  # 30 tokens, capacity 24
    chunks = sorted(
        (offset, length)
        for a in assign_ranks(plan)
        for work in a.micro_batches
        for sequence_id, offset, length in zip(work.sequence_ids, work.offsets, work.lengths)
        if sequence_id == 5 and a.tp_rank == 0 and a.stage == 0
    )
    assert chunks == [(0, 24), (24, 6)]


@pytest.fixture
def mini(tmp_path):
    require_torch()
    from hydraplan.runtime.assignment import model_config_for

    models_file = write_models_file(tmp_path / "models.json")
    plan = fixed_plan("1x<2,1,1> + 1x<1,2,1>", LENGTHS, 4, model=MINI_MODEL["name"])
    return plan, models_file, model_config_for(plan, models_file)


@pytest.mark.runtime
def test_a_valid_plan_is_accepted(mini):
    plan, _, cfg = mini
    validate_plan(plan, 4, cfg)


@pytest.mark.runtime
def test_a_world_size_other_than_the_plans_is_refused(mini):
    plan, _, cfg = mini
    with pytest.raises(PlanRefusedError, match="^the plan has 4 ranks but the world size is 3$"):
        validate_plan(plan, 3, cfg)


@pytest.mark.runtime
def test_a_plan_failing_the_checker_is_refused(mini):
    plan, _, cfg = mini
    pipelines = list(plan.pipelines)
    pipelines[0] = pipelines[0].model_copy(update={"micro_batches": pipelines[0].micro_batches[1:]})
    broken = identified(plan.model_copy(update={"pipelines": pipelines}))  # its id that of the broken content
    expected = r"^the plan fails the checker: sequence 5: chunks do not tile its tokens \(at offset 24\) \(and 2 more\)"
    with pytest.raises(PlanRefusedError, match=expected):
        validate_plan(broken, 4, cfg)


@pytest.mark.runtime
def test_a_model_the_runtime_cannot_build_is_refused(mini):
    from hydraplan.runtime.assignment import model_config_for

    plan, models_file, cfg = mini
    unknown = plan.model_copy(update={"cost_profile": plan.cost_profile.model_copy(update={"model": "no-such-model"})})
    with pytest.raises(PlanRefusedError, match="the plan's model 'no-such-model' cannot be built"):
        model_config_for(unknown, models_file)
    nameless = plan.model_copy(update={"cost_profile": plan.cost_profile.model_copy(update={"model": None})})
    with pytest.raises(PlanRefusedError, match="names no model"):
        model_config_for(nameless, models_file)
    with pytest.raises(PlanRefusedError, match=r"pipeline 0 <2,1,1>: tp=2 does not divide the 1 KV heads"):
        validate_plan(plan, 4, type(cfg)(**{**cfg.__dict__, "num_kv_heads": 1}))
    with pytest.raises(PlanRefusedError, match="has 3 layers, the plan's cost profile 2"):
        validate_plan(plan, 4, type(cfg)(**{**cfg.__dict__, "num_layers": 3}))


@pytest.mark.runtime
def test_pieces_are_the_intersections_of_every_ranks_slices():
    require_torch()
    from hydraplan.runtime.grad_sync import pieces_of

    # rank 0: rows [0, 2) (TP shard), rank 1: rows [2, 4), rank 2: all rows of a 4x3 weight;
    # a norm weight replicated on ranks 0 and 1 (TP), whole on rank 2, and one held by rank 2 alone.
    layouts = [
        {"w": (((0, 2), (0, 3)), True), "norm": (((0, 3),), True)},
        {"w": (((2, 4), (0, 3)), True), "norm": (((0, 3),), False)},
        {"w": (((0, 4), (0, 3)), True), "norm": (((0, 3),), True), "alone": (((0, 5),), True)},
    ]
    pieces = {(p.name, p.box): p.holders for p in pieces_of(layouts)}
    assert pieces == {
        ("norm", ((0, 3),)): (0, 1, 2),
        ("w", ((0, 2), (0, 3))): (0, 2),
        ("w", ((2, 4), (0, 3))): (1, 2),
    }


@pytest.mark.runtime
def test_a_switch_takes_each_new_cell_from_its_old_holder_and_keeps_what_stays():
    require_torch()
    from hydraplan.runtime.reshard import Transfer, transfers_between

    old = [{"w": (((0, 2), (0, 3)), True)}, {"w": (((2, 4), (0, 3)), True)}, {"w": (((0, 4), (0, 3)), True)}]
    new = [{"w": (((0, 4), (0, 3)), True)}, {"w": (((1, 3), (0, 3)), True)}, {"w": (((2, 4), (0, 3)), True)}]
    assert transfers_between(old, new) == [
        Transfer("w", ((0, 2), (0, 3)), 0, 0),  # kept
        Transfer("w", ((2, 4), (0, 3)), 1, 0),  # ranks 1 and 2 hold it, neither sends yet: the lower
        Transfer("w", ((1, 2), (0, 3)), 0, 1),
        Transfer("w", ((2, 3), (0, 3)), 1, 1),  # kept
        Transfer("w", ((2, 4), (0, 3)), 2, 2),  # kept
    ]
    with pytest.raises(ValueError, match="no rank of the old layout holds it"):
        transfers_between([{"w": (((0, 2), (0, 3)), True)}], [{"w": (((0, 4), (0, 3)), True)}])
    # two old replicas, four new ones: the two newcomers are served one by each replica
    replicas = [{"w": (((0, 4), (0, 3)), True)}] * 2 + [{}] * 2
    sources = [t.source for t in transfers_between(replicas, [{"w": (((0, 4), (0, 3)), True)}] * 4)]
    assert sources == [0, 1, 0, 1]


def test_the_critical_path_of_a_hand_computed_schedule():
    from hydraplan.runtime.timeline import critical_path_s

    # pp=2, m=2, forwards 1 s, backwards 2 s: s1 F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7]; s0 B1 [7,9]
    durations = {
        (stage, forward, index): 1.0 if forward else 2.0
        for stage in (0, 1)
        for forward in (True, False)
        for index in (0, 1)
    }
    assert critical_path_s(durations, 2, 2) == 9.0


@pytest.mark.parametrize("num_stages", [1, 2, 3, 4])
def test_the_critical_path_equals_the_planners_simulation_with_the_same_times(num_stages):
    from hydraplan.planner.simulate import simulate_1f1b
    from hydraplan.runtime.timeline import critical_path_s

    stage_times = [0.3, 1.7, 0.9, 2.4, 0.5, 1.1]
    fwd_fraction = 0.3
    durations = {}
    for stage in range(num_stages):
        for index, time_s in enumerate(stage_times):
            durations[(stage, True, index)] = fwd_fraction * time_s
            durations[(stage, False, index)] = time_s - fwd_fraction * time_s
    expected = simulate_1f1b(stage_times, num_stages, fwd_fraction)
    assert critical_path_s(durations, num_stages, len(stage_times)) == pytest.approx(expected, rel=1e-12)
