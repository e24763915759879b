"""The checker accepts planner output and rejects each kind of broken plan."""

from __future__ import annotations

import pytest
from synthetic import synthetic_profile, wikipedia_like_batch

from hydraplan.planner.build import identified
from hydraplan.planner.check import check_plan
from hydraplan.planner.schemas import CostProfile, Plan, PlanRequest, SchemeCost, SolverOptions
from hydraplan.planner.solve import solve

PROFILE = synthetic_profile(max_gpus=16)


@pytest.fixture(scope="module")
def plan() -> Plan:
    lengths = wikipedia_like_batch(40_000, seed=5)
    # two pipelines of different schemes, so that cross-pipeline tampering has something to break
    # a budget far above the work: the clock does not cut it, whatever the load (status not timeout_incumbent)
    options = SolverOptions(time_limit_s=30, strategy_pool=["1x<8,1,1> + 1x<4,2,1>"])
    return solve(PlanRequest(lengths=lengths, num_gpus=16, options=options), PROFILE)


def edited(plan: Plan, edit) -> Plan:
    """A deep copy of the plan's JSON with `edit` applied to it, its `plan_id` the hash of the
    edited content (by the planner's own `identified`), so that the edit is the plan's only fault;
    `test_an_edited_plan_id_is_a_violation` tampers with the id itself."""
    data = plan.model_dump(mode="json")
    edit(data)
    return identified(Plan.model_validate(data))


def first_batch(data):
    return data["pipelines"][0]["micro_batches"][0]


def test_valid_plan_has_no_violations(plan):
    assert check_plan(plan) == []


@pytest.mark.parametrize(
    "name,edit,message",
    [
        (
            "missing sequence",
            lambda d: [first_batch(d)[k].pop() for k in ("sequence_ids", "lengths", "offsets")],
            "is missing",
        ),
        ("unknown id", lambda d: first_batch(d)["sequence_ids"].__setitem__(0, 10**6), "missing"),
        ("duplicate", lambda d: d["pipelines"][1]["micro_batches"].append(first_batch(d)), "placed 2 times"),
        ("over capacity", lambda d: d["pipelines"][0].__setitem__("capacity_tokens", 1), "capacity"),
        (
            "stage time",
            lambda d: first_batch(d).__setitem__("stage_time_s", first_batch(d)["stage_time_s"] * 0.9),
            "stage time",
        ),
        ("pipeline time", lambda d: d["pipelines"][0].__setitem__("time_s", 0.001), "simulated 1F1B"),
        ("step time", lambda d: d.__setitem__("step_time_s", d["step_time_s"] * 0.99), "step_time_s"),
        ("rank overlap", lambda d: d["pipelines"][1]["ranks"].__setitem__(0, d["pipelines"][0]["ranks"][0]), "ranks"),
        ("bound above step", lambda d: d.__setitem__("lower_bound_s", d["step_time_s"] * 2), "lower_bound_s"),
        ("gap", lambda d: d.__setitem__("gap", d["gap"] + 0.1), "gap"),
        ("strategy text", lambda d: d.__setitem__("strategy", "16x<1,1,1>"), "strategy"),
        ("no micro-batches", lambda d: d["pipelines"][0].__setitem__("micro_batches", []), "no micro-batches"),
        ("chunk overlap", lambda d: first_batch(d)["offsets"].__setitem__(0, 3), "tile"),
        ("num gpus", lambda d: d.__setitem__("num_gpus", 32), "cover"),
    ],
)
def test_each_kind_of_broken_plan_is_rejected(plan, name, edit, message):
    violations = check_plan(edited(plan, edit))
    assert violations, name
    assert any(message in violation for violation in violations), violations


def test_checking_against_a_different_profile_recomputes_costs(plan):
    slower = PROFILE.model_copy(update={"schemes": [s.model_copy(update={"b": s.b * 2}) for s in PROFILE.schemes]})
    violations = check_plan(plan, slower)
    assert any("stage time" in violation for violation in violations)
    used = plan.pipelines[0].scheme
    without_used = [s for s in PROFILE.schemes if (s.tp, s.pp, s.cp) != (used.tp, used.pp, used.cp)]
    violations = check_plan(plan, PROFILE.model_copy(update={"schemes": without_used}))
    assert any("not in the cost profile" in violation for violation in violations)


# ---------------------------------------------------------------------------------------------
# Each check on its own: a plan broken in exactly one way, and the message only that check gives
# (a deleted or loosened check fails its test here).
# ---------------------------------------------------------------------------------------------


def messages(plan: Plan, profile=None) -> str:
    return " | ".join(check_plan(plan, profile))


def test_an_unknown_sequence_id_is_named(plan):
    def add_stray(d):
        batch = first_batch(d)
        batch["sequence_ids"].append(10**6)
        batch["offsets"].append(0)
        batch["lengths"].append(1)

    assert "unknown sequence ids placed: [1000000]" in messages(edited(plan, add_stray))


def test_one_token_over_capacity_is_a_violation(plan):
    """The profile given to the checker has exactly the plan's capacity, one token below the
    largest micro-batch: only the capacity check can object."""
    pipeline = plan.pipelines[0]
    largest = max(batch.num_tokens for batch in pipeline.micro_batches)
    key = (pipeline.scheme.tp, pipeline.scheme.pp, pipeline.scheme.cp)
    schemes = [
        entry.model_copy(update={"capacity_tokens": largest - 1}) if entry.key == key else entry
        for entry in plan.cost_profile.schemes
    ]
    tight = plan.cost_profile.model_copy(update={"schemes": schemes})
    smaller = edited(plan, lambda d: d["pipelines"][0].__setitem__("capacity_tokens", largest - 1))
    found = check_plan(smaller, tight)
    assert found and all("exceed capacity" in violation for violation in found), found
    assert f"{largest} tokens exceed capacity {largest - 1}" in " | ".join(found)


def remove_sequence(d, sequence_id: int) -> None:
    for pipeline in d["pipelines"]:
        for batch in pipeline["micro_batches"]:
            while sequence_id in batch["sequence_ids"]:
                at = batch["sequence_ids"].index(sequence_id)
                for key in ("sequence_ids", "offsets", "lengths"):
                    batch[key].pop(at)


def test_dropping_a_sequence_that_fits_is_a_violation(plan):
    victim = first_batch(plan.model_dump(mode="json"))["sequence_ids"][0]

    def drop(d):
        remove_sequence(d, victim)
        d["dropped_sequence_ids"] = [victim]

    found = messages(edited(plan, drop))
    assert f"sequence {victim} ({plan.input_lengths[victim]} tokens) is dropped though it fits" in found


def test_splitting_a_sequence_that_fits_is_a_violation(plan):
    victim = max(range(plan.num_sequences), key=lambda i: plan.input_lengths[i])
    assert plan.input_lengths[victim] >= 2

    def split(d):
        remove_sequence(d, victim)
        half = plan.input_lengths[victim] // 2
        batch = first_batch(d)
        batch["sequence_ids"] += [victim, victim]
        batch["offsets"] += [0, half]
        batch["lengths"] += [half, plan.input_lengths[victim] - half]
        d["split_sequence_ids"] = [victim]

    assert f"sequence {victim} ({plan.input_lengths[victim]} tokens) is split though it fits" in messages(
        edited(plan, split)
    )


def test_a_bubble_free_pipeline_time_is_caught(plan):
    """The effect of a simulator that forgets the bubble of a 2-stage pipeline: its time is the
    sum of its stage times, with the step and objective made consistent with that lie."""
    index = next(i for i, p in enumerate(plan.pipelines) if p.scheme.pp == 2)

    def bubble_free(d):
        pipeline = d["pipelines"][index]
        pipeline["time_s"] = sum(batch["stage_time_s"] for batch in pipeline["micro_batches"])
        slowest = max(p["time_s"] for p in d["pipelines"])
        d["step_time_s"] = slowest + d["grad_sync_s"]
        d["objective_s"] = d["step_time_s"] + d["switch_cost_s"]
        d["lower_bound_s"] = min(d["lower_bound_s"], d["objective_s"])
        d["gap"] = (d["objective_s"] - d["lower_bound_s"]) / d["objective_s"]

    assert f"pipeline {index} <4,2,1>: time" in messages(edited(plan, bubble_free))


def test_a_bound_just_above_the_objective_is_a_violation(plan):
    def inflate(d):
        d["lower_bound_s"] = d["objective_s"] * (1 + 1e-4)
        d["gap"] = (d["objective_s"] - d["lower_bound_s"]) / d["objective_s"]

    assert "lower_bound_s" in messages(edited(plan, inflate))


def test_the_solver_simulator_broken_is_caught_end_to_end(monkeypatch):
    """A deliberate solver bug (2-stage pipelines priced bubble-free) makes `solve` refuse its
    own plan: the checker does not share the simulator it checks."""
    import hydraplan.planner.packing as packing
    from hydraplan.planner.simulate import simulate_1f1b

    def bubble_free(times, num_stages, fwd_fraction):
        return float(sum(times)) if num_stages <= 2 else simulate_1f1b(times, num_stages, fwd_fraction)

    monkeypatch.setattr(packing, "simulate_1f1b", bubble_free)
    options = SolverOptions(time_limit_s=0.5, strategy_pool=["2x<4,2,1>"], solver="greedy")
    with pytest.raises(AssertionError, match="invalid plan.*simulated 1F1B"):
        solve(PlanRequest(lengths=wikipedia_like_batch(20_000, seed=1), num_gpus=16, options=options), PROFILE)


def test_the_checker_imports_none_of_the_solver():
    import ast
    from pathlib import Path

    for name in ("check.py", "reference.py"):
        tree = ast.parse((Path(__file__).resolve().parents[1] / "planner" / name).read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        project = {module for module in imported if module.startswith("hydraplan")}
        assert project <= {"hydraplan.planner", "hydraplan.planner.schemas", "hydraplan.planner.reference"}, project


def test_a_legitimate_drop_of_the_first_sequence_passes_and_bad_ids_do_not():
    """Sequence 0 longer than every capacity, dropped under `drop`: valid; a dropped id outside
    the input (negative or past the end) is named."""
    lengths = [10**7, *wikipedia_like_batch(5_000, seed=2)]
    options = SolverOptions(time_limit_s=0.3, oversize="drop", solver="greedy")
    dropped = solve(PlanRequest(lengths=lengths, num_gpus=16, options=options), PROFILE)
    assert dropped.dropped_sequence_ids == [0] and check_plan(dropped) == []
    for bad in (-1, len(lengths)):
        broken = edited(dropped, lambda d, bad=bad: d["dropped_sequence_ids"].append(bad))
        assert f"sequence {bad} is listed as dropped or split but is no input sequence" in messages(broken)


def test_a_plan_shorter_than_a_second_checks_its_gap():
    """Objective below 1 s with a non-zero gap: the gap is recomputed, not taken as 0."""
    small = solve(
        PlanRequest(lengths=[300, 500, 800, 1200], num_gpus=4, options=SolverOptions(time_limit_s=0.3)), PROFILE
    )
    assert 0 < small.objective_s < 1 and small.gap > 0
    assert check_plan(small) == []
    assert "gap" in messages(edited(small, lambda d: d.__setitem__("gap", 0.0)))


def test_a_short_stage_is_named_as_such(plan):
    """One stage a rank short: the stage-size check speaks, not only the flattening one."""
    assert "stage_ranks must be 1 lists of 8 ranks" in messages(
        edited(plan, lambda d: d["pipelines"][0]["stage_ranks"][0].pop())
    )


def test_uncovered_ranks_are_listed_exactly(plan):
    found = messages(edited(plan, lambda d: d.__setitem__("num_gpus", 24)))
    assert "ranks do not cover 0..23 exactly (missing [16, 17, 18, 19, 20], outside [])" in found


def test_ids_far_past_the_input_are_named(plan):
    far = plan.num_sequences + 5
    assert f"sequence {far} is listed as dropped or split but is no input sequence" in messages(
        edited(plan, lambda d: d["split_sequence_ids"].append(far))
    )


def test_a_malformed_previous_strategy_is_a_violation_not_a_crash(plan):
    found = check_plan(edited(plan, lambda d: d.__setitem__("previous_strategy", "garbage")))
    assert any(violation.startswith("previous_strategy: strategy term 'garbage'") for violation in found), found


def test_a_previous_strategy_of_millions_of_pipelines_is_refused_from_its_text(plan):
    """Pricing the switch places every previous pipeline on ranks: one that does not use the
    plan's GPUs is a violation found from the text, in microseconds (issue 29)."""
    found = check_plan(edited(plan, lambda d: d.__setitem__("previous_strategy", "10000000x<1,1,1>")))
    assert any(
        violation.startswith("previous_strategy: '10000000x<1,1,1>' uses 10000000 GPUs") for violation in found
    ), found


def test_pipelines_of_hundreds_of_sequences_check_cleanly():
    """Counts past the small-integer cache: equal counts compare by value."""
    many = solve(PlanRequest(lengths=[100] * 700, num_gpus=1, options=SolverOptions(time_limit_s=0.3)), PROFILE)
    assert many.pipelines[0].num_sequences == 700
    assert check_plan(many) == []


def test_stage_ranks_in_another_order_than_ranks(plan):
    """Right sizes, same ranks, another order: the flattening check speaks."""

    def reorder(d):
        stages = d["pipelines"][1]["stage_ranks"]
        stages[0], stages[1] = stages[1], stages[0]

    assert "pipeline 1 <4,2,1>: stage_ranks do not flatten to ranks" in messages(edited(plan, reorder))


def test_ranks_used_twice_are_listed_exactly(plan):
    def overlap(d):
        d["pipelines"][1]["ranks"] = list(range(8))
        d["pipelines"][1]["stage_ranks"] = [list(range(4)), list(range(4, 8))]

    assert "pipeline 1 <4,2,1>: ranks used twice ([0, 1, 2, 3, 4])" in messages(edited(plan, overlap))


def test_sequences_both_dropped_and_split_are_listed_exactly(plan):
    both = list(range(7))
    found = messages(edited(plan, lambda d: d.update(dropped_sequence_ids=both, split_sequence_ids=both)))
    assert "sequences listed as both dropped and split: [0, 1, 2, 3, 4]" in found


def test_unknown_ids_are_listed_exactly(plan):
    def strays(d):
        batch = first_batch(d)
        for stray in range(10**6, 10**6 + 7):
            batch["sequence_ids"].append(stray)
            batch["offsets"].append(0)
            batch["lengths"].append(1)

    assert "unknown sequence ids placed: [1000000, 1000001, 1000002, 1000003, 1000004]" in messages(
        edited(plan, strays)
    )


@pytest.fixture(scope="module")
def split_plan() -> Plan:
    """A valid plan with a split sequence (chunk offsets past 256) and a one-token sequence."""
    lengths = [1, 10**6, *wikipedia_like_batch(20_000, seed=7)]
    options = SolverOptions(time_limit_s=0.3, oversize="split", solver="greedy")
    return solve(PlanRequest(lengths=lengths, num_gpus=16, options=options), PROFILE)


def test_a_split_plan_with_a_one_token_sequence_is_valid(split_plan):
    assert split_plan.split_sequence_ids == [1] and split_plan.input_lengths[0] == 1
    assert check_plan(split_plan) == []


def test_a_zero_length_chunk_does_not_tile(split_plan):
    def empty_chunk(d):
        batch = first_batch(d)
        batch["sequence_ids"].append(1)
        batch["offsets"].append(0)
        batch["lengths"].append(0)

    found = check_plan(edited(split_plan, empty_chunk))
    assert [v for v in found if v.startswith("sequence 1:")] == [
        "sequence 1: chunks do not tile its tokens (at offset 0)"
    ]


def test_one_tiling_error_one_message(plan):
    """An overlap stops the tiling walk: one message for the sequence, not one per chunk."""
    sequence_id = first_batch(plan.model_dump(mode="json"))["sequence_ids"][0]
    found = check_plan(edited(plan, lambda d: first_batch(d)["offsets"].__setitem__(0, 3)))
    assert [v for v in found if v.startswith(f"sequence {sequence_id}")] == [
        f"sequence {sequence_id}: chunks do not tile its tokens (at offset 3)"
    ]


def test_an_id_without_its_length_and_offset(plan):
    assert "must be equal-length and non-empty" in messages(
        edited(plan, lambda d: first_batch(d)["sequence_ids"].append(0))
    )


def test_pipeline_token_counts_off_by_one_either_way(plan):
    for delta in (-1, 1):
        broken = edited(
            plan,
            lambda d, delta=delta: d["pipelines"][0].__setitem__("num_tokens", d["pipelines"][0]["num_tokens"] + delta),
        )
        assert "pipeline 0 <8,1,1>: num_tokens" in messages(broken)


def test_a_negative_bound_is_a_violation(plan):
    def negative(d):
        d["lower_bound_s"] = -1.0
        d["gap"] = (d["objective_s"] + 1.0) / d["objective_s"]

    assert "lower_bound_s -1.0 is not within" in messages(edited(plan, negative))


def test_a_cost_free_plan_has_gap_zero():
    """A profile with zero costs: objective 0, and the gap of a zero objective is 0."""
    free = CostProfile(num_layers=4, schemes=[SchemeCost(tp=1, pp=1, a=0, b=0, c=0, capacity_tokens=10**6)])
    plan = solve(PlanRequest(lengths=[100, 200, 300], num_gpus=2, options=SolverOptions(time_limit_s=0.2)), free)
    assert plan.objective_s == 0 and plan.gap == 0
    assert check_plan(plan) == []


def test_a_missing_rank_is_counted_exactly(plan):
    found = check_plan(edited(plan, lambda d: d["pipelines"][0]["ranks"].pop()))
    assert "pipeline 0 <8,1,1>: 7 ranks, scheme needs 8" in found


def test_pipeline_indices_out_of_order(plan):
    def swap(d):
        d["pipelines"][0]["index"], d["pipelines"][1]["index"] = 1, 0

    assert "pipeline indices are not 0..P-1 in order" in messages(edited(plan, swap))


def test_an_extra_rank_is_counted_exactly(plan):
    found = messages(edited(plan, lambda d: d["pipelines"][0]["ranks"].append(99)))
    assert "pipeline 0 <8,1,1>: 9 ranks, scheme needs 8" in found
    assert "(missing [], outside [99])" in found


def test_ranks_outside_the_cluster_are_listed_exactly(plan):
    found = messages(edited(plan, lambda d: d["pipelines"][0]["ranks"].extend(range(99, 105))))
    assert "ranks do not cover 0..15 exactly (missing [], outside [99, 100, 101, 102, 103])" in found


def test_dropping_a_sequence_exactly_at_the_largest_capacity_is_a_violation():
    largest = max(entry.capacity_tokens for entry in PROFILE.schemes)
    lengths = [largest, *wikipedia_like_batch(5_000, seed=3)]
    options = SolverOptions(time_limit_s=0.3, solver="greedy")
    fits = solve(PlanRequest(lengths=lengths, num_gpus=16, options=options), PROFILE)

    def drop_first(d):
        remove_sequence(d, 0)
        d["dropped_sequence_ids"] = [0]

    assert f"sequence 0 ({largest} tokens) is dropped though it fits" in messages(edited(fits, drop_first))


def test_a_dropped_sequence_that_is_placed_anyway(plan):
    victim = first_batch(plan.model_dump(mode="json"))["sequence_ids"][0]
    found = messages(edited(plan, lambda d: d.__setitem__("dropped_sequence_ids", [victim])))
    assert f"sequence {victim} is listed as dropped but placed" in found


def test_a_capacity_above_the_profiles_is_a_violation(plan):
    capacity = plan.pipelines[0].capacity_tokens
    found = messages(edited(plan, lambda d: d["pipelines"][0].__setitem__("capacity_tokens", capacity + 1)))
    assert f"pipeline 0 <8,1,1>: capacity {capacity + 1} differs from the profile's {capacity}" in found


def test_a_malformed_micro_batch_does_not_hide_the_next_ones(plan):
    index = next(i for i, pipeline in enumerate(plan.pipelines) if len(pipeline.micro_batches) >= 2)

    def two_faults(d):
        batches = d["pipelines"][index]["micro_batches"]
        batches[0]["sequence_ids"].append(0)
        batches[1]["stage_time_s"] *= 0.9

    found = messages(edited(plan, two_faults))
    assert f"pipeline {index} <4,2,1> micro-batch 0: sequence_ids, lengths and offsets must be equal-length" in found
    assert f"pipeline {index} <4,2,1> micro-batch 1: stage time" in found


def test_micro_batch_token_counts_off_by_one_either_way(plan):
    for delta in (-1, 1):
        broken = edited(
            plan, lambda d, delta=delta: first_batch(d).__setitem__("num_tokens", first_batch(d)["num_tokens"] + delta)
        )
        assert "micro-batch 0: num_tokens" in messages(broken)


def test_a_missing_sequence_after_a_dropped_one_is_found():
    lengths = [10**7, *wikipedia_like_batch(5_000, seed=2)]
    options = SolverOptions(time_limit_s=0.3, oversize="drop", solver="greedy")
    dropped = solve(PlanRequest(lengths=lengths, num_gpus=16, options=options), PROFILE)
    last = len(lengths) - 1
    assert f"sequence {last} ({lengths[last]} tokens) is missing" in messages(
        edited(dropped, lambda d: remove_sequence(d, last))
    )


def last_chunk(d, sequence_id: int) -> tuple[dict, int]:
    """(micro-batch, position in it) of the sequence's chunk with the largest offset."""
    chunks = [
        (batch, position)
        for pipeline in d["pipelines"]
        for batch in pipeline["micro_batches"]
        for position, placed in enumerate(batch["sequence_ids"])
        if placed == sequence_id
    ]
    return max(chunks, key=lambda chunk: chunk[0]["offsets"][chunk[1]])


@pytest.mark.parametrize("delta", [-1, 1])
def test_chunks_covering_too_few_or_too_many_tokens(split_plan, delta):
    def resize_last_chunk(d):
        batch, position = last_chunk(d, 1)
        batch["lengths"][position] += delta

    total = split_plan.input_lengths[1]
    assert f"sequence 1: chunks cover {total + delta} of {total} tokens" in messages(
        edited(split_plan, resize_last_chunk)
    )


def test_a_micro_batch_exactly_at_capacity_is_valid(plan):
    pipeline = plan.pipelines[0]
    largest = max(batch.num_tokens for batch in pipeline.micro_batches)
    key = (pipeline.scheme.tp, pipeline.scheme.pp, pipeline.scheme.cp)
    schemes = [
        entry.model_copy(update={"capacity_tokens": largest}) if entry.key == key else entry
        for entry in plan.cost_profile.schemes
    ]
    exact = plan.cost_profile.model_copy(update={"schemes": schemes})
    at_capacity = edited(plan, lambda d: d["pipelines"][0].__setitem__("capacity_tokens", largest))
    assert check_plan(at_capacity, exact) == []


def test_a_strategy_text_after_the_true_one_is_a_violation(plan):
    assert plan.strategy < "2x<8,1,1>"
    assert "strategy '2x<8,1,1>' does not match the pipelines" in messages(
        edited(plan, lambda d: d.__setitem__("strategy", "2x<8,1,1>"))
    )


def test_a_plan_with_a_switch_cost_checks():
    lengths = wikipedia_like_batch(40_000, seed=5)
    options = SolverOptions(time_limit_s=0.5, strategy_pool=["1x<8,1,1> + 1x<4,2,1>"], solver="greedy")
    request = PlanRequest(lengths=lengths, num_gpus=16, previous_strategy="4x<4,1,1>", options=options)
    switched = solve(request, PROFILE)
    assert switched.switch_cost_s > 0 and switched.objective_s > switched.step_time_s
    assert check_plan(switched) == []
    # a switch the plan's profile cannot price (no bandwidth) is a violation, not a free switch
    unpriced = edited(switched, lambda d: d["cost_profile"].__setitem__("grad_sync_bandwidth_bytes_per_s", None))
    assert any("previous_strategy: " in m and "grad_sync_bandwidth_bytes_per_s" in m for m in check_plan(unpriced))


def test_a_long_stage_is_named_as_such(plan):
    assert "stage_ranks must be 1 lists of 8 ranks" in messages(
        edited(plan, lambda d: d["pipelines"][0]["stage_ranks"][0].append(99))
    )


def test_an_offset_without_its_id_and_length(plan):
    assert "must be equal-length and non-empty" in messages(edited(plan, lambda d: first_batch(d)["offsets"].append(0)))


@pytest.mark.parametrize("delta", [-1, 1])
def test_a_pipeline_claiming_one_sequence_too_many_or_few(plan, delta):
    count = plan.pipelines[0].num_sequences
    broken = edited(plan, lambda d: d["pipelines"][0].__setitem__("num_sequences", count + delta))
    assert f"pipeline 0 <8,1,1>: num_sequences {count + delta} != {count}" in messages(broken)


def test_a_bound_equal_to_the_objective_is_valid(plan):
    def tight(d):
        d["lower_bound_s"] = d["objective_s"]
        d["gap"] = 0.0
        d["status"] = "optimal"  # a gap of 0 is within any tolerance

    assert check_plan(edited(plan, tight)) == []


def test_ranks_listed_out_of_stage_order(plan):
    """stage_ranks flatten to the ranks in order; the ranks listed in another order are named."""

    def reorder(d):
        ranks = d["pipelines"][1]["ranks"]
        d["pipelines"][1]["ranks"] = ranks[4:] + ranks[:4]

    assert "pipeline 1 <4,2,1>: stage_ranks do not flatten to ranks" in messages(edited(plan, reorder))


def test_large_pipelines_and_micro_batches_compare_counts_by_value():
    """Pipelines of 320 ranks, of 300 stages and of 320 ranks a stage, and a micro-batch of 300
    sequences: counts past CPython's small-int cache (256) must compare by value, not identity."""
    options = SolverOptions(time_limit_s=0.5, solver="greedy")
    for tp, pp, cp in [(4, 80, 1), (1, 300, 1), (4, 1, 80)]:
        scheme = SchemeCost(tp=tp, pp=pp, cp=cp, a=1e-10, b=1e-5, c=1e-3, capacity_tokens=100_000)
        profile = CostProfile(num_layers=max(pp, 4), schemes=[scheme])
        request = PlanRequest(lengths=[10] * 300, num_gpus=tp * pp * cp, gpus_per_node=4, options=options)
        large = solve(request, profile)
        assert len(large.pipelines[0].stage_ranks) == pp and check_plan(large) == []
    single = SchemeCost(tp=1, pp=1, cp=1, a=1e-10, b=1e-5, c=1.0, capacity_tokens=100_000)
    packed = solve(
        PlanRequest(lengths=[10] * 300, num_gpus=1, options=options), CostProfile(num_layers=4, schemes=[single])
    )
    assert [len(batch.sequence_ids) for batch in packed.pipelines[0].micro_batches] == [300]
    assert check_plan(packed) == []


@pytest.mark.parametrize(
    "keys", [("lengths", "offsets"), ("sequence_ids", "lengths"), ("sequence_ids", "offsets")], ids="-".join
)
def test_entries_missing_one_of_their_three_lists(plan, keys):
    def extend(d):
        for key in keys:
            first_batch(d)[key].append(first_batch(d)[key][0])

    assert "must be equal-length and non-empty" in messages(edited(plan, extend))


@pytest.mark.parametrize("change", ["split", "merge", "one more", "one fewer"])
def test_a_wrong_number_of_stages(plan, change):
    """Stage lists of the wrong sizes, and of the right size but too many or too few."""

    def restage(d):
        pipeline = d["pipelines"][1]
        stages = pipeline["stage_ranks"]
        pipeline["stage_ranks"] = {
            "split": [stages[0], stages[1][:2], stages[1][2:]],
            "merge": [stages[0] + stages[1]],
            "one more": [*stages, [99, 98, 97, 96]],
            "one fewer": stages[:1],
        }[change]

    assert "pipeline 1 <4,2,1>: stage_ranks must be 2 lists of 4 ranks" in messages(edited(plan, restage))


def test_a_rank_twice_inside_one_pipeline(plan):
    def duplicate(d):
        ranks = d["pipelines"][0]["ranks"]
        ranks[1] = ranks[0]
        d["pipelines"][0]["stage_ranks"] = [list(ranks)]

    assert "pipeline 0 <8,1,1>: ranks used twice" in messages(edited(plan, duplicate))


def test_repeated_pipeline_indices(plan):
    assert "pipeline indices are not 0..P-1 in order" in messages(
        edited(plan, lambda d: d["pipelines"][1].__setitem__("index", 0))
    )


def test_overlapping_chunks_do_not_tile(split_plan):
    def overlap(d):
        batch, position = last_chunk(d, 1)
        batch["offsets"][position] -= 1

    found = [v for v in check_plan(edited(split_plan, overlap)) if v.startswith("sequence 1:")]
    assert found and found[0].startswith("sequence 1: chunks do not tile its tokens")


def test_every_missing_sequence_is_named(plan):
    first, second = first_batch(plan.model_dump(mode="json"))["sequence_ids"][:2]

    def remove_both(d):
        remove_sequence(d, first)
        remove_sequence(d, second)

    found = messages(edited(plan, remove_both))
    assert f"sequence {first} (" in found and f"sequence {second} (" in found


# ---------------------------------------------------------------------------------------------
# The totals one at a time: each edit below is seen by exactly one check, so turning that check
# off leaves the plan valid and fails its test (issue 28: the grad_sync_s, switch_cost_s and
# objective_s checks had no test that failed without them).
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def switched_plan() -> Plan:
    lengths = wikipedia_like_batch(40_000, seed=5)
    options = SolverOptions(time_limit_s=30, strategy_pool=["1x<8,1,1> + 1x<4,2,1>"], solver="greedy")
    request = PlanRequest(lengths=lengths, num_gpus=16, previous_strategy="4x<4,1,1>", options=options)
    return solve(request, PROFILE)


def test_a_grad_sync_time_off_by_a_percent_is_the_only_violation(plan):
    assert plan.grad_sync_s > 0
    claimed = plan.grad_sync_s * 1.01
    found = check_plan(edited(plan, lambda d: d.__setitem__("grad_sync_s", claimed)))
    assert found == [f"grad_sync_s {claimed} != recomputed {plan.grad_sync_s}"]


def test_a_free_grad_sync_is_the_only_violation(plan):
    found = check_plan(edited(plan, lambda d: d.__setitem__("grad_sync_s", 0.0)))
    assert found == [f"grad_sync_s 0.0 != recomputed {plan.grad_sync_s}"]


def test_a_switch_cost_off_by_a_percent_is_the_only_violation(switched_plan):
    assert check_plan(switched_plan) == [] and switched_plan.switch_cost_s > 0
    claimed = switched_plan.switch_cost_s * 0.99
    found = check_plan(edited(switched_plan, lambda d: d.__setitem__("switch_cost_s", claimed)))
    assert found == [f"switch_cost_s {claimed} != recomputed {switched_plan.switch_cost_s}"]


def test_a_switch_claimed_free_is_the_only_violation(switched_plan):
    found = check_plan(edited(switched_plan, lambda d: d.__setitem__("switch_cost_s", 0.0)))
    assert found == [f"switch_cost_s 0.0 != recomputed {switched_plan.switch_cost_s}"]


def with_objective(d: dict, objective_s: float) -> None:
    """`objective_s` with the gap (and the status it decides, unless the clock cut the plan) that go with it."""
    d["objective_s"] = objective_s
    d["gap"] = (objective_s - d["lower_bound_s"]) / objective_s
    if not d["solver"]["cut_by_clock"]:
        d["status"] = "optimal" if d["gap"] <= d["solver"]["gap_tolerance"] else "feasible"


@pytest.mark.parametrize("shift", ["down", "up"])
def test_an_objective_off_with_its_gap_is_the_only_violation(plan, switched_plan, shift):
    """Claimed 1% high, or low but still above the bound (halfway to it: these plans' gaps are under
    1%, and an objective below the bound is a second violation)."""
    for source in (plan, switched_plan):
        halfway = (source.objective_s + source.lower_bound_s) / 2
        claimed = halfway if shift == "down" else source.objective_s * 1.01
        assert claimed != source.objective_s
        found = check_plan(edited(source, lambda d, claimed=claimed: with_objective(d, claimed)))
        assert len(found) == 1 and found[0].startswith(f"objective_s {claimed} != step time + switch cost "), found


def test_an_objective_without_the_switch_cost_is_the_only_violation(switched_plan):
    """The objective claimed as the step time alone, the switch left out of it."""
    step_time_s = switched_plan.step_time_s
    found = check_plan(edited(switched_plan, lambda d: with_objective(d, step_time_s)))
    assert len(found) == 1 and found[0].startswith(f"objective_s {step_time_s} != step time + switch cost "), found
