"""The verifier's parts against their definitions (`planner.verify_bound`): its placement rule is
the planner's, its bubble floors invert and stay under the exact 1F1B time, its sync floors are the
reference sync, and plans whose items do not fit every scheme or whose profile holds a dominated
scheme verify within the brute-forced optimum."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from test_exhaustive import MAX_SCHEMES, exhaustive_optimum_s, random_instance

from hydraplan.planner import reference
from hydraplan.planner import verify_bound as vb
from hydraplan.planner.schemas import BoundCertificate, PlanRequest, SolverOptions
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.solve import solve
from hydraplan.planner.strategies import unplaceable_reason


def columns_of(profile) -> vb._Columns:
    schemes = [f"<{e.tp},{e.pp},{e.cp}>" for e in profile.schemes]
    certificate = BoundCertificate(space="fixed", max_schemes=1, schemes=schemes)
    plan_like = type("P", (), {"num_gpus": 64, "gpus_per_node": 64})()
    columns, violations = vb._columns(certificate, profile, plan_like)
    assert violations == []
    return columns


@pytest.mark.parametrize(("num_gpus", "per_node"), [(16, 8), (24, 8), (12, 4), (8, 8), (48, 6)])
def test_the_placement_rule_is_the_planners(num_gpus: int, per_node: int) -> None:
    for tp, pp, cp in itertools.product((1, 2, 3, 4, 6, 8, 16), (1, 2, 3), (1, 2, 4)):
        if tp * pp * cp > num_gpus:
            continue
        planner = unplaceable_reason(ParallelScheme(tp, pp, cp), num_gpus, per_node) is None
        assert vb._placeable((tp, pp, cp), num_gpus, per_node) == planner, (tp, pp, cp, num_gpus, per_node)


def test_the_bubble_floor_inverts_and_stays_under_the_exact_time() -> None:
    """G(T) is the inverse of g(W) = W + h(W); and a pipeline's floor over its micro-batch counts
    is at most its exact least 1F1B time over every ordered packing."""
    rng = np.random.default_rng(7)
    for case in range(6):
        profile, lengths, _ = random_instance(case)
        columns = columns_of(profile)
        for time_s in (0.01, 0.05, 0.3):
            most = vb._most_work_s(columns, time_s)
            reached = most + vb._bubble_overhead_s(columns, most)
            floor_only = vb._bubble_overhead_s(columns, 0.0) > time_s  # no work fits: G = 0
            assert np.allclose(np.where(floor_only, time_s, reached), time_s, rtol=1e-9)
        for column in range(len(columns.schemes)):
            block = [float(x) for x in rng.choice(lengths, size=min(4, len(lengths)), replace=False)]
            exact = vb._least_pipeline_s(columns, column, block)
            assert vb._pipeline_floor_s(columns, column, block) <= exact * (1 + 1e-12)


@pytest.mark.parametrize("fixed_sync_s", [None, 2.5])
def test_the_sync_floors_are_the_reference_sync(fixed_sync_s) -> None:
    profile, _, _ = random_instance(3)
    if fixed_sync_s is not None:
        profile = profile.model_copy(update={"grad_sync_s": fixed_sync_s})
    columns = columns_of(profile)
    for first, second in itertools.combinations(range(len(columns.schemes)), 2):
        pipelines = [columns.schemes[first]] * 2 + [columns.schemes[second]]
        replicas = sum(cp for _, _, cp in pipelines)
        expected = reference.grad_sync_s(profile, pipelines)
        assert vb._sync_s(profile, columns, [first, second], replicas) == pytest.approx(expected, rel=1e-12)


def test_a_plan_whose_items_do_not_fit_every_scheme_verifies_within_the_optimum() -> None:
    """The longest sequences fit only the context-parallel scheme: the assignment bound must skip
    the pipelines they cannot go to, not stop at them."""
    profile, _, _ = random_instance(0)
    narrow = [e.model_copy(update={"capacity_tokens": 2000}) if e.cp == 1 else e for e in profile.schemes]
    profile = profile.model_copy(update={"schemes": narrow})
    lengths, num_gpus = [2300, 2100, 900, 400, 300], 4
    assert any(e.cp > 1 for e in profile.schemes)
    request = PlanRequest(lengths=lengths, num_gpus=num_gpus, options=SolverOptions(max_schemes=MAX_SCHEMES))
    plan = solve(request, profile)
    verification = vb.verify_bound(plan, profile, request)
    assert verification.verified_bound_s <= exhaustive_optimum_s(profile, lengths, num_gpus) * (1 + 1e-9)


def test_a_dominated_scheme_may_be_left_out_of_the_certificate() -> None:
    """The planner drops a scheme another of the same GPUs beats in every term; the verifier
    accepts its absence only because it finds the dominating one."""
    profile, lengths, num_gpus = random_instance(0)
    better = next(e for e in profile.schemes if e.tp * e.pp * e.cp == 2 and e.pp == 1 and e.cp == 1)
    worse = better.model_copy(update={"tp": 1, "pp": 1, "cp": 2, "a": better.a * 2, "b": better.b * 2})
    worse = worse.model_copy(update={"tp": 1, "pp": 2, "cp": 1})
    profile = profile.model_copy(
        update={"schemes": [*[e for e in profile.schemes if (e.tp, e.pp, e.cp) != (1, 2, 1)], worse]}
    )
    request = PlanRequest(lengths=lengths, num_gpus=num_gpus, options=SolverOptions(max_schemes=MAX_SCHEMES))
    plan = solve(request, profile)
    assert "<1,2,1>" not in plan.bound_certificate.schemes
    assert not any(
        v.startswith("bound certificate: scheme") for v in vb.verify_bound(plan, profile, request).violations
    )


def test_the_assignment_bound_skips_a_pipeline_an_item_does_not_fit() -> None:
    """Two pipelines, the longest item fitting only the second: the bound is that assignment's,
    not infinite (which a search that stopped at the first pipeline would claim)."""
    profile, _, _ = random_instance(0)
    narrow = [
        e.model_copy(update={"capacity_tokens": 1000}) if index == 0 else e for index, e in enumerate(profile.schemes)
    ]
    columns = columns_of(profile.model_copy(update={"schemes": narrow}))
    wide = next(column for column in range(1, len(columns.schemes)) if columns.capacity[column] >= 2000)
    items = np.array([1800.0, 500.0])
    bound = vb._assignment_bound_s(columns, items, [0, wide], [1, 1])
    expected = max(vb._least_pipeline_s(columns, 0, [500.0]), vb._least_pipeline_s(columns, wide, [1800.0]))
    assert bound == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_the_verifiers_own_multipliers_hold_every_point_the_solver_tries(size: int) -> None:
    """A strategy without a witness is bounded on the verifier's own grid: it holds every point of
    the solver's default fluid-dual grid (the 1/12 simplex up to three schemes; corners, centre and
    pairwise midpoints above), so no bound the solver proved there needs a witness to verify."""
    from hydraplan.planner.bounds import simplex_grid

    gpus = np.arange(1.0, size + 1.0)
    own = {tuple(np.round(row, 12)) for row in vb._multiplier_grid(gpus, [])}
    solver = {tuple(np.round(row, 12)) for row in simplex_grid(size, 12)}
    assert solver <= own, sorted(solver - own)[:3]


def certificate_violations(profile, listed: list[str], num_gpus: int) -> list[str]:
    """What the verifier says of a searched certificate listing these schemes, on one node."""
    certificate = BoundCertificate(space="search", max_schemes=1, schemes=listed)
    plan_like = type("P", (), {"num_gpus": num_gpus, "gpus_per_node": 8})()
    return vb._columns(certificate, profile, plan_like)[1]


def test_a_left_out_scheme_is_dominated_only_by_one_of_its_own_size() -> None:
    """`<2,1,1>` made worse than `<1,1,1>` in every term: left out of a certificate that lists
    `<1,1,1>`, it is still not covered (a pipeline of two GPUs is no pipeline of one: a strategy
    may need it to fill the cluster), so the check names it."""
    profile, _, num_gpus = random_instance(0)
    single = next(e for e in profile.schemes if (e.tp, e.pp, e.cp) == (1, 1, 1))
    worse = single.model_copy(
        update={
            "tp": 2,
            "a": 2 * single.a,
            "b": 2 * single.b,
            "c": 2 * single.c,
            "grad_bytes_per_gpu": 4 * single.grad_bytes_per_gpu,
        }
    )
    others = [e for e in profile.schemes if (e.tp, e.pp, e.cp) != (2, 1, 1)]
    profile = profile.model_copy(update={"schemes": [*others, worse]})
    entries = reference.scheme_entries(profile)
    assert all(x <= y for x, y in zip(vb._terms(profile, (1, 1, 1), entries), vb._terms(profile, (2, 1, 1), entries)))
    listed = [f"<{e.tp},{e.pp},{e.cp}>" for e in others]
    assert certificate_violations(profile, listed, num_gpus) == [
        "bound certificate: scheme <2,1,1> is left out of its schemes and no listed scheme dominates it"
    ]


def test_a_left_out_scheme_with_more_capacity_is_not_dominated() -> None:
    """`<1,1,2>` no faster than `<2,1,1>` in any cost term but holding twice its tokens: a strategy
    may need it for a long sequence, so leaving it out of a certificate that lists `<2,1,1>` is
    named (capacity counts against domination, negated in the terms)."""
    profile, _, num_gpus = random_instance(0)
    pair = next(e for e in profile.schemes if (e.tp, e.pp, e.cp) == (2, 1, 1))
    roomy = pair.model_copy(update={"tp": 1, "cp": 2, "capacity_tokens": 2 * pair.capacity_tokens})
    profile = profile.model_copy(update={"schemes": [*profile.schemes, roomy]})
    entries = reference.scheme_entries(profile)
    listed_terms, roomy_terms = vb._terms(profile, (2, 1, 1), entries), vb._terms(profile, (1, 1, 2), entries)
    assert all(x <= y for x, y in zip(listed_terms[:7], roomy_terms[:7])) and roomy_terms[7] < listed_terms[7]
    listed = [f"<{e.tp},{e.pp},{e.cp}>" for e in profile.schemes if e is not roomy]
    assert certificate_violations(profile, listed, num_gpus) == [
        "bound certificate: scheme <1,1,2> is left out of its schemes and no listed scheme dominates it"
    ]


def test_an_interleaved_pipeline_of_few_items_is_timed_by_the_interleaved_schedule() -> None:
    """Four items, each over half a micro-batch's capacity (one per micro-batch), on `<.,2,.,2>`:
    the exact least time is the interleaved 1F1B time of the best order (plain 1F1B's is longer, so
    timing it as 1F1B would prove more than any plan runs)."""
    profile, _, _ = random_instance(0)
    columns = columns_of(profile)
    column = next(c for c in range(len(columns.schemes)) if columns.stages[c] == 1)
    count = len(columns.schemes)
    deep = dataclasses.replace(
        columns, stages=np.full(count, 2.0), fwd=np.full(count, 1 / 3), chunks=np.full(count, 2.0)
    )
    capacity = float(deep.capacity[column])
    lengths = [capacity * share for share in (0.55, 0.7, 0.85, 1.0)]
    a, b, c = (float(deep.a[column]), float(deep.b[column]), float(deep.c[column]))
    times = [a * x * x + b * x + c for x in lengths]
    interleaved = min(
        reference.interleaved_pipeline_time_s(list(order), 2, 2, 1 / 3, 2) for order in itertools.permutations(times)
    )
    plain = min(reference.pipeline_time_s(list(order), 2, 1 / 3) for order in itertools.permutations(times))
    assert interleaved < plain
    assert vb._least_pipeline_s(deep, column, lengths) == pytest.approx(interleaved, rel=1e-12)


def test_a_cap_past_the_lp_counts_ends_the_path_floor_ranges_there() -> None:
    """A pipeline of at most `cap` micro-batches (cap past LP_MICRO_BATCHES): its floor prices only
    the counts up to the cap, each at least as high as it was, so it lies between the uncapped floor
    and the path floor at the cap itself; its room never exceeds the uncapped room. A cap past
    MOST_MICRO_BATCHES prices like none."""
    profile, _, _ = random_instance(0)
    columns = columns_of(profile)
    deep = next(k for k in range(len(columns.schemes)) if columns.stages[k] > 1)
    pp, c, kappa = int(columns.stages[deep]), float(columns.c[deep]), vb._path_kappa(columns, deep)
    for cap in (vb.LP_MICRO_BATCHES + 1, 100, 1000):
        for work in (1e-3, 0.05, 2.0):
            free = float(vb._pipeline_floor_of_work_s(columns, deep, work))
            capped = float(vb._pipeline_floor_of_work_s(columns, deep, work, cap))
            at_cap = max((1 + kappa / cap) * (work + cap * c), work + (cap + pp - 1) * c)
            assert free <= capped * (1 + 1e-12) and capped <= at_cap * (1 + 1e-12)
        time_s = 0.3
        assert vb._room_s(columns, deep, time_s, cap) <= vb._room_s(columns, deep, time_s) * (1 + 1e-12)
    # where the least floor is at more micro-batches than the cap, the cap raises it
    raised = [
        work
        for work in (0.05, 2.0, 50.0, 1e3)
        if float(vb._pipeline_floor_of_work_s(columns, deep, work, vb.LP_MICRO_BATCHES + 1))
        > float(vb._pipeline_floor_of_work_s(columns, deep, work)) * (1 + 1e-9)
    ]
    assert raised
    huge = vb.MOST_MICRO_BATCHES + 1
    assert float(vb._pipeline_floor_of_work_s(columns, deep, 0.05, huge)) == float(
        vb._pipeline_floor_of_work_s(columns, deep, 0.05)
    )
