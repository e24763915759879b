"""The checker's checks of what a plan claims beyond its costs (issue 28): the cluster layout
(whole nodes, TP groups and node-sized TP x CP grids inside a node), the status against the gap
and the tolerance, the `plan_id` and, given the request, that the plan answers it and its
`request_hash`. Each tampered plan is broken in one way and named by exactly that check."""

from __future__ import annotations

import hashlib
import json

import pytest
from synthetic import synthetic_profile, wikipedia_like_batch

from hydraplan.planner.build import identified
from hydraplan.planner.check import check_plan
from hydraplan.planner.schemas import CostProfile, Plan, PlanRequest, SchemeCost, SolverOptions
from hydraplan.planner.solve import solve

PROFILE = synthetic_profile(max_gpus=16)
LENGTHS = wikipedia_like_batch(40_000, seed=5)
# a budget far above the work (a few tens of ms): the clock never cuts these plans, whatever the load
OPTIONS = SolverOptions(time_limit_s=30, strategy_pool=["1x<8,1,1> + 1x<4,2,1>"], solver="greedy")
REQUEST = PlanRequest(lengths=LENGTHS, num_gpus=16, options=OPTIONS)


def solved(request: PlanRequest) -> Plan:
    return solve(request, PROFILE)


@pytest.fixture(scope="module")
def plan() -> Plan:
    """`<8,1,1>` on ranks 0-7 (node 0), `<4,2,1>` on 8-15 (node 1), not cut by the clock."""
    made = solved(REQUEST)
    assert not made.solver.cut_by_clock and made.solver.gap_tolerance == 0.01
    return made


@pytest.fixture(scope="module")
def cp_plan() -> Plan:
    """Four `<2,1,2>` pipelines: a TP x CP grid of 4 ranks fits a node of 8."""
    options = SolverOptions(time_limit_s=30, strategy_pool=["4x<2,1,2>"], solver="greedy")
    return solved(PlanRequest(lengths=wikipedia_like_batch(20_000, seed=3), num_gpus=16, options=options))


def edited(plan: Plan, edit) -> Plan:
    """The plan's JSON with `edit` applied, its `plan_id` recomputed by the planner's `identified`."""
    data = plan.model_dump(mode="json")
    edit(data)
    return identified(Plan.model_validate(data))


def test_the_plans_pass(plan, cp_plan):
    assert check_plan(plan) == [] and check_plan(cp_plan) == []
    assert check_plan(plan, PROFILE, REQUEST) == []


# ---------------------------------------------------------------------------------------------
# Cluster layout
# ---------------------------------------------------------------------------------------------


def swap_ranks(d: dict, first: tuple[int, int, int], second: tuple[int, int, int]) -> None:
    """Swap two ranks given as (pipeline, stage, position), in stage_ranks and ranks alike."""
    stages = [pipeline["stage_ranks"] for pipeline in d["pipelines"]]
    (p, s, i), (q, t, j) = first, second
    stages[p][s][i], stages[q][t][j] = stages[q][t][j], stages[p][s][i]
    for pipeline in d["pipelines"]:
        pipeline["ranks"] = [rank for stage in pipeline["stage_ranks"] for rank in stage]


def test_tp_groups_across_two_nodes_are_named(plan):
    """Rank 7 (last of the `<8,1,1>` group) and rank 8 (first of `<4,2,1>`'s stage 0) swapped:
    both TP groups then span nodes 0 and 1; ranks, costs and everything else stay valid."""
    found = check_plan(edited(plan, lambda d: swap_ranks(d, (0, 0, 7), (1, 0, 0))))
    assert found == [
        "pipeline 0 <8,1,1>: TP group of ranks [0, 1, 2, 3, 4, 5, 6, 8] spans nodes 0 to 1 (gpus_per_node 8)",
        "pipeline 1 <4,2,1>: TP group of ranks [7, 9, 10, 11] spans nodes 0 to 1 (gpus_per_node 8)",
    ]


def test_a_tp_pair_across_nodes_is_named(cp_plan):
    """A TP=2 pair whose two ranks sit on different nodes (rank 7 swapped with rank 9)."""
    found = check_plan(edited(cp_plan, lambda d: swap_ranks(d, (1, 0, 3), (2, 0, 1))))
    assert found == [
        "pipeline 1 <2,1,2>: TP group of ranks [6, 9] spans nodes 0 to 1 (gpus_per_node 8)",
        "pipeline 2 <2,1,2>: TP group of ranks [8, 7] spans nodes 0 to 1 (gpus_per_node 8)",
    ]


def test_a_cp_grid_across_nodes_is_named_though_its_tp_pairs_are_not(cp_plan):
    """Pipelines 1 and 2 trade a TP pair: [4, 5, 8, 9] and [6, 7, 10, 11] keep every TP pair in
    a node, but their 4-rank TP x CP grids, which fit a node, span two."""

    def trade(d):
        swap_ranks(d, (1, 0, 2), (2, 0, 0))
        swap_ranks(d, (1, 0, 3), (2, 0, 1))

    found = check_plan(edited(cp_plan, trade))
    assert found == [
        "pipeline 1 <2,1,2>: TP x CP grid of ranks [4, 5, 8, 9] spans nodes 0 to 1 (gpus_per_node 8)",
        "pipeline 2 <2,1,2>: TP x CP grid of ranks [6, 7, 10, 11] spans nodes 0 to 1 (gpus_per_node 8)",
    ]


def test_an_empty_stage_is_a_rank_violation_not_a_crash(cp_plan):
    found = check_plan(edited(cp_plan, lambda d: d["pipelines"][0].__setitem__("stage_ranks", [[]])))
    assert found == ["pipeline 0 <2,1,2>: stage_ranks must be 1 lists of 4 ranks"]


def test_a_grid_of_exactly_a_node_must_be_inside_one():
    """`<4,1,2>`: its TP x CP grid of 8 fills a node; two pipelines trading TP groups keep every
    TP group inside a node but put each grid on two."""
    options = SolverOptions(time_limit_s=30, strategy_pool=["2x<4,1,2>"], solver="greedy")
    full = solved(PlanRequest(lengths=wikipedia_like_batch(20_000, seed=3), num_gpus=16, options=options))
    assert check_plan(full) == []

    def trade(d):
        for position in range(4, 8):
            swap_ranks(d, (0, 0, position), (1, 0, position - 4))

    assert check_plan(edited(full, trade)) == [
        "pipeline 0 <4,1,2>: TP x CP grid of ranks [0, 1, 2, 3, 8, 9, 10, 11] spans nodes 0 to 1 (gpus_per_node 8)",
        "pipeline 1 <4,1,2>: TP x CP grid of ranks [4, 5, 6, 7, 12, 13, 14, 15] spans nodes 0 to 1 (gpus_per_node 8)",
    ]


def test_a_grid_larger_than_a_node_may_span_nodes():
    """`<8,1,2>` on 16 GPUs of 8 per node: its two TP groups fill a node each, its grid spans both."""
    options = SolverOptions(time_limit_s=30, strategy_pool=["1x<8,1,2>"], solver="greedy")
    wide = solved(PlanRequest(lengths=wikipedia_like_batch(20_000, seed=3), num_gpus=16, options=options))
    assert check_plan(wide) == []
    # the same pipeline with its two TP groups interleaved over the nodes is not
    found = check_plan(edited(wide, lambda d: swap_ranks(d, (0, 0, 7), (0, 0, 8))))
    assert found == [
        "pipeline 0 <8,1,2>: TP group of ranks [0, 1, 2, 3, 4, 5, 6, 8] spans nodes 0 to 1 (gpus_per_node 8)"
    ]


EIGHT = "pipeline 0 <8,1,1>: TP group of ranks [0, 1, 2, 3, 4, 5, 6, 7] spans nodes"


@pytest.mark.parametrize(
    ("gpus_per_node", "expected"),
    [
        (
            1,
            [
                f"{EIGHT} 0 to 7 (gpus_per_node 1)",
                "pipeline 1 <4,2,1>: TP group of ranks [8, 9, 10, 11] spans nodes 8 to 11 (gpus_per_node 1)",
            ],
        ),
        (3, ["gpus_per_node 3: num_gpus 16 is not a whole number of nodes"]),
        (4, [f"{EIGHT} 0 to 1 (gpus_per_node 4)"]),
        (6, ["gpus_per_node 6: num_gpus 16 is not a whole number of nodes"]),
    ],
)
def test_a_wrong_gpus_per_node_is_named(plan, gpus_per_node, expected):
    """The request said 8 GPUs per node; the plan claims another count."""
    found = check_plan(edited(plan, lambda d: d.__setitem__("gpus_per_node", gpus_per_node)))
    assert found == expected
    request_view = check_plan(edited(plan, lambda d: d.__setitem__("gpus_per_node", gpus_per_node)), request=REQUEST)
    assert request_view == [*expected, f"gpus_per_node {gpus_per_node} is not the request's 8"]


def test_gpus_per_node_of_the_whole_cluster_is_a_layout_but_not_the_requests(plan):
    """16 GPUs in one node of 16 is a valid layout; the request said 8 per node."""
    sixteen = edited(plan, lambda d: d.__setitem__("gpus_per_node", 16))
    assert check_plan(sixteen) == []
    assert check_plan(sixteen, request=REQUEST) == ["gpus_per_node 16 is not the request's 8"]


def test_counts_past_the_small_int_cache_compare_by_value():
    """300 nodes of 2 GPUs, one `<2,1,1>` pipeline on each: node indices up to 299 and the
    request's 300 sequences (past CPython's cache of small ints) are equal by value, not by
    identity."""
    scheme = SchemeCost(tp=2, pp=1, cp=1, a=1e-10, b=1e-5, c=1e-3, capacity_tokens=100_000)
    options = SolverOptions(time_limit_s=30, solver="greedy")
    request = PlanRequest(lengths=[10] * 300, num_gpus=600, gpus_per_node=2, options=options)
    many = solve(request, CostProfile(num_layers=4, schemes=[scheme]))
    assert many.strategy == "300x<2,1,1>" and check_plan(many) == []
    assert check_plan(many, request=request) == []  # and 300 sequences, 600 GPUs as many as the request's


def test_part_of_one_node_is_a_valid_cluster():
    """4 GPUs of a node of 8: every group is on node 0."""
    options = SolverOptions(time_limit_s=30, strategy_pool=["1x<2,1,2>"], solver="greedy")
    part = solved(PlanRequest(lengths=[500, 900, 1200, 300], num_gpus=4, options=options))
    assert part.gpus_per_node == 8 and check_plan(part) == []


# ---------------------------------------------------------------------------------------------
# Status, gap and tolerance
# ---------------------------------------------------------------------------------------------


def with_gap(gap: float, status: str, tolerance: float | None = 0.01):
    def edit(d):
        d["lower_bound_s"] = d["objective_s"] * (1 - gap)
        d["gap"] = (d["objective_s"] - d["lower_bound_s"]) / d["objective_s"]
        d["status"] = status
        d["solver"]["gap_tolerance"] = tolerance

    return edit


def test_optimal_with_a_gap_of_a_half_is_named(plan):
    broken = edited(plan, with_gap(0.5, "optimal"))
    assert check_plan(broken) == [f"status optimal with gap {broken.gap}, above the gap tolerance 0.01"]


def test_feasible_with_a_gap_within_the_tolerance_is_named(plan):
    broken = edited(plan, with_gap(0.001, "feasible"))
    assert check_plan(broken) == [f"status feasible with gap {broken.gap}, at most the gap tolerance 0.01"]
    assert check_plan(edited(plan, with_gap(0.001, "optimal"))) == []


def test_a_gap_equal_to_the_tolerance_is_optimal(plan):
    """The planner's rule is `gap <= tolerance`: at the tolerance itself the plan is optimal."""
    gap = plan.gap
    assert check_plan(edited(plan, with_gap(0.0, "optimal", tolerance=0.0))) == []
    at = edited(plan, lambda d: (d.__setitem__("status", "optimal"), d["solver"].__setitem__("gap_tolerance", gap)))
    assert check_plan(at) == []
    feasible = edited(plan, lambda d: d["solver"].__setitem__("gap_tolerance", gap))
    assert check_plan(feasible) == [f"status feasible with gap {gap}, at most the gap tolerance {gap}"]


def test_the_recorded_tolerance_decides_and_the_default_stands_in_for_none(plan):
    """A plan made with gap_tolerance 0.6 is optimal at a gap of 0.5; a plan that records no
    tolerance (written before it was recorded) is held to the default, 0.01."""
    assert check_plan(edited(plan, with_gap(0.5, "optimal", tolerance=0.6))) == []
    unrecorded = edited(plan, with_gap(0.5, "optimal", tolerance=None))
    assert check_plan(unrecorded) == [f"status optimal with gap {unrecorded.gap}, above the gap tolerance 0.01"]
    assert check_plan(edited(plan, with_gap(0.005, "optimal", tolerance=None))) == []


def test_the_requests_tolerance_decides_when_the_request_is_given(plan):
    loose = edited(plan, with_gap(0.5, "optimal", tolerance=0.6))
    request = REQUEST.model_copy(update={"options": OPTIONS.model_copy(update={"gap_tolerance": 0.6})})
    assert check_plan(loose, request=request) == []
    assert check_plan(loose, request=REQUEST) == [
        "solver.gap_tolerance 0.6 is not the request's gap_tolerance 0.01",
        f"status optimal with gap {loose.gap}, above the gap tolerance 0.01",
    ]
    unrecorded = edited(plan, with_gap(0.5, "optimal", tolerance=None))
    assert check_plan(unrecorded, request=request) == []


@pytest.mark.parametrize("status", ["optimal", "feasible"])
def test_a_plan_the_clock_cut_must_say_timeout_incumbent(plan, status):
    cut = edited(plan, lambda d: (d.__setitem__("status", status), d["solver"].__setitem__("cut_by_clock", True)))
    assert check_plan(cut) == [
        f"status {status} with solver.cut_by_clock True: timeout_incumbent is the status of a plan the clock "
        "cut, and only of one"
    ]


def test_timeout_incumbent_needs_the_clock_and_then_any_gap_goes(plan):
    uncut = edited(plan, lambda d: d.__setitem__("status", "timeout_incumbent"))
    assert check_plan(uncut) == [
        "status timeout_incumbent with solver.cut_by_clock False: timeout_incumbent is the status of a plan the "
        "clock cut, and only of one"
    ]

    def timed_out(gap):
        def edit(d):
            with_gap(gap, "timeout_incumbent")(d)
            d["solver"]["cut_by_clock"] = True

        return edit

    for gap in (0.0, 0.5):
        assert check_plan(edited(plan, timed_out(gap))) == []
    # the request's tolerance is still compared with the recorded one
    request = REQUEST.model_copy(update={"options": OPTIONS.model_copy(update={"gap_tolerance": 0.2})})
    assert check_plan(edited(plan, timed_out(0.5)), request=request) == [
        "solver.gap_tolerance 0.01 is not the request's gap_tolerance 0.2"
    ]


# ---------------------------------------------------------------------------------------------
# plan_id and request_hash
# ---------------------------------------------------------------------------------------------


def test_plan_id_is_the_documented_hash_of_the_content(plan):
    """docs/planner.md: `hp-` and the first 20 hex digits of SHA-256 over the plan's canonical
    JSON without plan_id, and without session_feedback where it is null, as here (computed from
    that definition, apart from planner and checker)."""
    assert plan.session_feedback is None
    excluded = {"plan_id", "session_feedback"}
    content = json.dumps(plan.model_dump(mode="json", exclude=excluded), sort_keys=True, separators=(",", ":"))
    assert plan.plan_id == "hp-" + hashlib.sha256(content.encode()).hexdigest()[:20]


def test_a_session_plans_id_covers_its_feedback(plan):
    """A plan made in a session hashes its session_feedback too: editing it breaks the id."""
    from hydraplan.planner.measurements import SessionFeedback

    in_session = identified(plan.model_copy(update={"session_feedback": SessionFeedback(profile_version=1)}))
    assert in_session.plan_id != plan.plan_id and check_plan(in_session) == []
    edited = in_session.model_copy(update={"session_feedback": SessionFeedback(profile_version=2)})
    assert check_plan(edited) == [
        f"plan_id {in_session.plan_id!r} is not the hash of the plan's content, {identified(edited).plan_id!r}"
    ]


def test_an_edited_plan_id_is_named(plan):
    for other in ("hp-00000000000000000000", plan.plan_id[:-1], plan.plan_id.upper(), ""):
        found = check_plan(plan.model_copy(update={"plan_id": other}))
        assert found == [f"plan_id {other!r} is not the hash of the plan's content, {plan.plan_id!r}"]


def test_an_edit_that_keeps_the_old_id_is_named(plan):
    """Content changed, id not recomputed: the edit is found even where no other check sees it."""
    data = plan.model_dump(mode="json")
    data["solver"]["seed"] = 7
    found = check_plan(Plan.model_validate(data))
    assert len(found) == 1 and found[0].startswith(f"plan_id {plan.plan_id!r} is not the hash of the plan's content")


def test_a_number_json_cannot_carry_is_named_not_a_crash(plan):
    """`solver.time_limit_s` admits NaN; canonical JSON does not, so no hash is the plan's."""
    data = plan.model_dump(mode="json")
    data["solver"]["time_limit_s"] = float("nan")
    assert check_plan(Plan.model_validate(data)) == [
        "plan_id cannot be the hash of the plan's content: it holds NaN or infinity"
    ]
    measured = PROFILE.model_copy(update={"provenance": None, "grad_sync_exposed_fraction": float("inf")})
    found = check_plan(plan, measured, REQUEST)
    assert found[-1] == "request_hash cannot be the hash of the request and profile: one holds NaN or infinity"


@pytest.mark.parametrize("tolerance", [-0.1, 1.5, float("nan")])
def test_a_recorded_tolerance_is_a_share(plan, tolerance):
    with pytest.raises(ValueError, match="gap_tolerance"):
        edited(plan, lambda d: d["solver"].__setitem__("gap_tolerance", tolerance))


def test_request_hash_is_checked_against_the_request_and_its_profile(plan):
    assert check_plan(plan, PROFILE, REQUEST) == []
    edited_hash = "rq-00000000000000000000"
    tampered = edited(plan, lambda d: d.__setitem__("request_hash", edited_hash))
    assert check_plan(tampered, PROFILE, REQUEST) == [
        f"request_hash {edited_hash!r} is not the hash of the request and profile, {plan.request_hash!r}"
    ]
    # another request (another seed) or another profile: another hash
    reseeded = REQUEST.model_copy(update={"options": OPTIONS.model_copy(update={"seed": 1})})
    assert any(v.startswith("request_hash ") for v in check_plan(plan, PROFILE, reseeded))
    slower = PROFILE.model_copy(update={"grad_sync_exposed_fraction": 0.5})
    assert any(v.startswith("request_hash ") for v in check_plan(plan, slower, REQUEST))
    # without the profile it was planned with (the plan embeds only the schemes it uses), or
    # without the request, the hash cannot be recomputed and is not checked
    assert check_plan(tampered, request=REQUEST) == [] and check_plan(tampered, PROFILE) == []


def test_a_plan_of_another_request_is_named(plan):
    other = list(LENGTHS)
    other[3] += 1
    assert check_plan(plan, request=REQUEST.model_copy(update={"lengths": other})) == [
        f"sequence 3: the plan has length {LENGTHS[3]}, the request {other[3]}"
    ]
    other[5] += 1  # a second difference: the first one is named
    assert check_plan(plan, request=REQUEST.model_copy(update={"lengths": other})) == [
        f"sequence 3: the plan has length {LENGTHS[3]}, the request {other[3]}"
    ]
    assert check_plan(plan, request=REQUEST.model_copy(update={"lengths": LENGTHS[:-1]})) == [
        f"plan covers {len(LENGTHS)} sequences, the request has {len(LENGTHS) - 1}"
    ]
    # a request longer than the plan, and one whose sequence is shorter than the plan's
    assert check_plan(plan, request=REQUEST.model_copy(update={"lengths": [*LENGTHS, 5]})) == [
        f"plan covers {len(LENGTHS)} sequences, the request has {len(LENGTHS) + 1}"
    ]
    shorter = list(LENGTHS)
    shorter[3] -= 1
    assert check_plan(plan, request=REQUEST.model_copy(update={"lengths": shorter})) == [
        f"sequence 3: the plan has length {LENGTHS[3]}, the request {shorter[3]}"
    ]
    assert check_plan(plan, request=REQUEST.model_copy(update={"num_gpus": 32})) == [
        "num_gpus 16 is not the request's 32"
    ]
    assert check_plan(plan, request=REQUEST.model_copy(update={"previous_strategy": "4x<4,1,1>"})) == [
        "previous_strategy None is not the request's '4x<4,1,1>'"
    ]


def test_a_request_read_from_json_compares_lengths_by_value(plan):
    """The request's lengths are other int objects than the plan's (long ones past CPython's
    small-int cache): equal lengths are equal, whatever their identity."""
    parsed = PlanRequest.model_validate_json(REQUEST.model_dump_json())
    assert max(parsed.lengths) > 256 and check_plan(plan, PROFILE, parsed) == []


def test_a_request_read_from_json_compares_its_previous_strategy_by_value():
    """A plan made after `4x<4,1,1>`, checked against its request read back from JSON: the two
    strategy texts are equal strings, not the same object."""
    request = REQUEST.model_copy(update={"previous_strategy": "4x<4,1,1>"})
    switched = solved(request)
    parsed = PlanRequest.model_validate_json(request.model_dump_json())
    assert parsed.previous_strategy is not switched.previous_strategy
    assert check_plan(switched, PROFILE, parsed) == []


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # the plain string, hashed for plan_id
def test_a_status_set_without_validation_is_still_checked(plan):
    """`model_copy(update=...)` skips validation: a plain string status is compared by value."""
    found = check_plan(plan.model_copy(update={"status": "timeout_incumbent"}))
    assert found[0] == (
        "status timeout_incumbent with solver.cut_by_clock False: timeout_incumbent is the status of a plan "
        "the clock cut, and only of one"
    )
    opposite = "optimal" if plan.status == "feasible" else "feasible"
    found = check_plan(plan.model_copy(update={"status": opposite}))
    assert found[0].startswith(f"status {opposite} with gap {plan.gap}, ")


# --- slow ranks (issue 31 item 3): the factors a plan claims, and the request's ------------------

SLOW_PROFILE = synthetic_profile(max_gpus=2)
SLOW_LENGTHS = [700, 30, 420, 90, 610, 15, 260, 330, 45, 510, 120, 75]


def slow_request(factors: dict[int, float] | None) -> PlanRequest:
    options = SolverOptions(solver="greedy", time_limit_s=30, strategy_pool=["2x<1,1,1>"])
    return PlanRequest(lengths=SLOW_LENGTHS, num_gpus=2, gpus_per_node=2, options=options, rank_slowdowns=factors)


@pytest.fixture(scope="module")
def slow_plan() -> Plan:
    """Two `<1,1,1>` pipelines, rank 0 slow by 1.5 (the lowest rank, a factor between 1 and 2)."""
    made = solve(slow_request({0: 1.5, 1: 1.0}), SLOW_PROFILE)
    assert made.rank_slowdowns == {0: 1.5}
    assert [pipeline.slowdown for pipeline in made.pipelines] == [1.5, None]
    return made


def test_a_plan_with_a_slow_rank_passes_with_and_without_its_request(slow_plan):
    assert check_plan(slow_plan, SLOW_PROFILE) == []
    # the request's factor of 1 is no slowdown: the plan lists only the factors above 1
    assert check_plan(slow_plan, SLOW_PROFILE, slow_request({0: 1.5, 1: 1.0})) == []
    # read back from JSON: the factors compare by value, not as the same objects
    assert check_plan(Plan.model_validate_json(slow_plan.model_dump_json()), SLOW_PROFILE) == []
    # the highest rank may be slow too
    last = solve(slow_request({1: 1.5}), SLOW_PROFILE)
    assert [pipeline.slowdown for pipeline in last.pipelines] == [None, 1.5]
    assert check_plan(last, SLOW_PROFILE, slow_request({1: 1.5})) == []


@pytest.mark.parametrize(
    ("factors", "named"),
    [
        ({2: 1.5}, "rank_slowdowns: rank 2 is not a rank of the 2 GPUs"),
        ({3: 1.5}, "rank_slowdowns: rank 3 is not a rank of the 2 GPUs"),
        ({-1: 1.5}, "rank_slowdowns: rank -1 is not a rank of the 2 GPUs"),
        ({0: 1.0}, "rank_slowdowns[0] = 1.0: a plan lists only finite factors above 1"),
        ({0: 0.5}, "rank_slowdowns[0] = 0.5: a plan lists only finite factors above 1"),
    ],
)
def test_a_factor_a_plan_cannot_hold_is_named_alone(slow_plan, factors, named):
    """A rank outside the cluster or a factor not above 1: named, and the pipelines' factors are
    not compared with a list that is already wrong (the times, recomputed without it, differ)."""
    tampered = identified(slow_plan.model_copy(update={"rank_slowdowns": factors}))
    violations = check_plan(tampered, SLOW_PROFILE)
    assert named in violations, violations
    assert not any("from rank_slowdowns" in violation for violation in violations), violations


def test_a_pipeline_factor_that_is_not_its_ranks_is_named(slow_plan):
    first, second = slow_plan.pipelines
    moved = [first.model_copy(update={"slowdown": None}), second.model_copy(update={"slowdown": 1.5})]
    violations = check_plan(identified(slow_plan.model_copy(update={"pipelines": moved})), SLOW_PROFILE)
    assert "pipeline 0 <1,1,1>: slowdown None != 1.5 from rank_slowdowns" in violations, violations
    assert "pipeline 1 <1,1,1>: slowdown 1.5 != None from rank_slowdowns" in violations, violations


def test_a_plan_must_carry_exactly_the_requests_factors_above_one(slow_plan):
    for factors in ({0: 2.5}, {1: 1.5}, None, {0: 1.5, 1: 1.2}):
        violations = check_plan(slow_plan, SLOW_PROFILE, slow_request(factors))
        assert any(v.startswith("rank_slowdowns {0: 1.5} are not the request's factors above 1") for v in violations), (
            factors,
            violations,
        )


def test_a_previous_strategy_counts_its_gpus_as_tp_x_pp_x_cp(slow_plan):
    """`1x<1,2,1,2>` uses 2 GPUs (v chunks share a rank's GPU) and `1x<1,1,2>` 2 (CP ranks): a
    plan on 2 GPUs may switch from either; previous pipelines on 3 GPUs or on 1 are named with
    that count."""
    for previous in ("1x<1,2,1,2>", "1x<1,1,2>"):
        fits = check_plan(identified(slow_plan.model_copy(update={"previous_strategy": previous})), SLOW_PROFILE)
        assert not any("GPUs, the plan has" in violation for violation in fits), (previous, fits)
    for previous, used in (("1x<1,2,1,2> + 1x<1,1,1>", 3), ("1x<1,1,1>", 1)):
        other = identified(slow_plan.model_copy(update={"previous_strategy": previous}))
        assert any(f"uses {used} GPUs, the plan has 2" in v for v in check_plan(other, SLOW_PROFILE)), previous


def test_a_previous_strategy_past_the_small_int_cache_compares_its_gpus_by_value():
    """300 GPUs counted from the text and 300 in the plan are equal, though not the same object;
    299 are named."""
    options = SolverOptions(solver="greedy", time_limit_s=30, strategy_pool=["300x<1,1,1>"])
    request = PlanRequest(lengths=[100 + i for i in range(300)], num_gpus=300, gpus_per_node=4, options=options)
    wide = solve(request, SLOW_PROFILE)
    assert check_plan(identified(wide.model_copy(update={"previous_strategy": "300x<1,1,1>"})), SLOW_PROFILE) == []
    fewer = identified(wide.model_copy(update={"previous_strategy": "299x<1,1,1>"}))
    assert check_plan(fewer, SLOW_PROFILE) == ["previous_strategy: '299x<1,1,1>' uses 299 GPUs, the plan has 300"]
