"""Bubble floors: the tabulated LP optima, their validity against the exact 1F1B simulation, and
the bounds they tighten (never above a brute-force optimum)."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from hydraplan.planner.bubble_floor import (
    MAX_MICRO_BATCHES,
    most_work_s,
    pipeline_time_floor_s,
    solve_floor_lp,
    tabulated_floors,
)
from hydraplan.planner.check import check_plan
from hydraplan.planner.cost import ProfileCostModel, SchemeCoefficients
from hydraplan.planner.packing import balance_lpt, best_order, by_length_descending, pack_pipeline
from hydraplan.planner.schemas import CostProfile, PlanRequest, SchemeCost, SolverOptions
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.simulate import simulate_1f1b
from hydraplan.planner.solve import evaluate_strategy, solve
from hydraplan.planner.strategies import parse_strategy

THIRD = 1 / 3


@pytest.mark.parametrize(("stages", "count"), [(2, 1), (2, 2), (2, 7), (3, 5), (4, 16), (8, 3)])
def test_table_matches_the_lp_and_rounds_down(stages, count):
    floors = tabulated_floors(stages, THIRD)
    assert floors is not None and len(floors) == MAX_MICRO_BATCHES
    exact, shares = solve_floor_lp(stages, count, THIRD)
    assert shares.sum() == pytest.approx(1.0)
    assert simulate_1f1b(shares.tolist(), stages, THIRD) == pytest.approx(1 + exact, rel=1e-6)
    assert exact - 1e-5 <= floors[count - 1] <= exact


def test_one_micro_batch_floor_is_the_classic_bubble_and_uneven_sizes_beat_equal_ones():
    # m = 1: the micro-batch crosses every stage forwards and backwards, T = pp * t
    assert solve_floor_lp(4, 1, THIRD)[0] == pytest.approx(3.0, abs=1e-6)
    # equal micro-batches give exactly (pp - 1) / m; ramping sizes up and down does better
    for stages, count in ((2, 8), (4, 16)):
        equal = simulate_1f1b([1.0] * count, stages, THIRD) / count - 1
        assert equal == pytest.approx((stages - 1) / count)
        assert solve_floor_lp(stages, count, THIRD)[0] < 0.8 * equal


@pytest.mark.parametrize("stages", [2, 3, 4, 8])
def test_floors_hold_for_random_micro_batches(stages):
    floors = tabulated_floors(stages, THIRD)
    rng = np.random.default_rng(stages)
    for _ in range(300):
        count = int(rng.integers(1, 40))
        shape = rng.choice(["uniform", "lognormal", "ramp"])
        if shape == "uniform":
            times = rng.uniform(0.01, 1.0, count)
        elif shape == "lognormal":
            times = rng.lognormal(0.0, 1.5, count)
        else:
            times = np.minimum(np.geomspace(0.01, 5.0, count), np.geomspace(5.0, 0.05, count)) + rng.uniform(0, 0.1)
        makespan = simulate_1f1b(times.tolist(), stages, THIRD)
        assert makespan >= (1 + floors[count - 1]) * times.sum() * (1 - 1e-9)


@pytest.mark.parametrize("stages", [2, 3, 5, 8])
def test_the_largest_micro_batch_path_bounds_the_makespan(stages):
    """The path of the module docstring, for every k and forward shares on both sides of 1/2."""
    rng = np.random.default_rng(10 + stages)
    for _ in range(200):
        count = int(rng.integers(1, 30))
        share = float(rng.uniform(0.05, 0.95))
        times = rng.lognormal(0.0, 1.0, count)
        makespan = simulate_1f1b(times.tolist(), stages, share)
        total = times.sum()
        for k in range(count):
            path = (
                total
                + (stages - 1) * share * times[0]
                + (stages - 1) * (1 - share) * times[k]
                - share * times[k + 1 : k + stages].sum()
            )
            assert makespan >= path * (1 - 1e-9)
        assert makespan >= (total + (stages - 1) * (1 - 2 * share) * times.max()) * (1 - 1e-9)


def test_untabulated_schemes_still_get_the_proved_floor():
    coef = SchemeCoefficients(ParallelScheme(1, 7, 1), 1e-10, 1e-5, 1e-3, 0.3, 10_000, 1.0)
    assert tabulated_floors(7, 0.3) is None
    work = 1.0
    floor = float(pipeline_time_floor_s(coef, work))
    # about 2 sqrt(kappa (pp-1) W c) with kappa = 1 - 2f, far above the plain (pp-1) c
    assert floor - work > 0.9 * 2 * np.sqrt(0.4 * 6 * work * 1e-3)
    rng = np.random.default_rng(1)
    for count in (1, 5, 50, 500):
        works = rng.dirichlet(np.ones(count)) * work
        assert simulate_1f1b((works + coef.c).tolist(), 7, 0.3) >= floor * (1 - 1e-9)


def _scheme(pp: int, c: float = 2e-3) -> SchemeCost:
    return SchemeCost(tp=1, pp=pp, cp=1, a=1e-9, b=1e-5, c=c, capacity_tokens=4000)


def test_pipeline_floor_holds_for_any_packing_including_more_micro_batches_than_tabulated():
    profile = CostProfile(num_layers=8, schemes=[_scheme(4)])
    coef = ProfileCostModel(profile).coefficients(parse_strategy("1x<1,4,1>").schemes[0])
    rng = np.random.default_rng(0)
    for count in (1, 3, 20, MAX_MICRO_BATCHES, MAX_MICRO_BATCHES + 30):
        works = rng.uniform(0.0, 0.05, count)
        makespan = simulate_1f1b((works + coef.c).tolist(), 4, coef.fwd_fraction)
        assert makespan >= float(pipeline_time_floor_s(coef, works.sum())) * (1 - 1e-9)
    # G is the inverse of g
    for work in (0.01, 0.5, 3.0):
        assert float(most_work_s(coef, pipeline_time_floor_s(coef, work))) == pytest.approx(work)


def _best_pipeline_s(lengths: tuple[int, ...], scheme: SchemeCost) -> float:
    return _best_pipeline_cached(lengths, scheme.pp, scheme.a, scheme.b, scheme.c, scheme.capacity_tokens)


@functools.cache
def _best_pipeline_cached(lengths: tuple[int, ...], pp: int, a: float, b: float, c: float, capacity: int) -> float:
    """Exact best 1F1B time of one pipeline: every ordered partition into micro-batches."""
    best = float("inf")
    items = list(range(len(lengths)))
    for labels in itertools.product(range(len(items)), repeat=len(items)):
        used = sorted(set(labels))
        if used != list(range(len(used))):
            continue  # each ordered partition once: blocks numbered 0..k-1 in execution order
        times = []
        for block in used:
            members = [lengths[i] for i, label in zip(items, labels) if label == block]
            if sum(members) > capacity:
                break
            times.append(a * sum(x * x for x in members) + b * sum(members) + c)
        else:
            best = min(best, simulate_1f1b(times, pp, THIRD))
    return best


def _brute_force_s(lengths: list[int], schemes: list[SchemeCost]) -> float:
    best = float("inf")
    for owners in itertools.product(range(len(schemes)), repeat=len(lengths)):
        worst = 0.0
        for pipeline, scheme in enumerate(schemes):
            mine = tuple(sorted(length for length, owner in zip(lengths, owners) if owner == pipeline))
            worst = max(worst, _best_pipeline_s(mine, scheme) if mine else float("inf"))
        best = min(best, worst)
    return best


@pytest.mark.parametrize("case", range(4))
def test_bounds_with_bubble_floors_stay_below_the_brute_force_optimum(case):
    deep, shallow = _scheme(4, c=5e-3), _scheme(2, c=5e-3)
    profile = CostProfile(num_layers=8, schemes=[deep, shallow])
    rng = np.random.default_rng(case)
    lengths = rng.integers(100, 3000, size=5 + case % 2).tolist()
    strategy = ["1x<1,4,1> + 1x<1,2,1>", "3x<1,2,1>", "1x<1,4,1> + 2x<1,2,1>", "2x<1,2,1>"][case]
    parsed = parse_strategy(strategy)
    schemes = [deep if scheme.pp == 4 else shallow for scheme in parsed.pipeline_schemes()]
    optimum = _brute_force_s(lengths, schemes)
    request = PlanRequest(
        lengths=lengths, num_gpus=parsed.num_gpus, options=SolverOptions(solver="greedy", time_limit_s=5)
    )
    fixed = evaluate_strategy(request, profile, parsed)
    searched = solve(request, profile)
    for plan in (fixed, searched):
        assert check_plan(plan) == []
        assert plan.lower_bound_s <= optimum * (1 + 1e-9)
    assert fixed.step_time_s >= optimum * (1 - 1e-9)


def test_bubble_floors_raise_the_bound_of_deep_pipelines():
    """On many short sequences a pp=4 pipeline must trade micro-batch overheads against bubbles;
    the plain floor (pp-1) c misses that, the tabulated floors price it."""
    profile = CostProfile(num_layers=8, schemes=[_scheme(4, c=1e-3)])
    lengths = [200] * 400
    request = PlanRequest(lengths=lengths, num_gpus=8, options=SolverOptions(solver="greedy"))
    plan = evaluate_strategy(request, profile, parse_strategy("2x<1,4,1>"))
    coef = ProfileCostModel(profile).coefficients(parse_strategy("1x<1,4,1>").schemes[0])
    work_per_pipeline = float(coef.work_s(np.array(lengths)).sum()) / 2
    plain = work_per_pipeline + 3 * coef.c + coef.c * 200 * 200 / 4000  # (pp-1) c + capacity-forced micro-batches
    assert plan.lower_bound_s > plain * 1.02
    assert plan.lower_bound_s <= plan.step_time_s


def test_ramped_packing_beats_every_equal_packing_and_keeps_every_item():
    profile = CostProfile(num_layers=8, schemes=[_scheme(4, c=1e-3)])
    coef = ProfileCostModel(profile).coefficients(parse_strategy("1x<1,4,1>").schemes[0])
    rng = np.random.default_rng(3)
    lengths = rng.integers(100, 400, size=300)
    items = np.arange(len(lengths))
    packed = pack_pipeline(items, lengths, coef)
    placed = np.sort(np.concatenate(packed.micro_batches))
    assert np.array_equal(placed, items)
    assert all(lengths[batch].sum() <= coef.capacity_tokens for batch in packed.micro_batches)
    assert packed.time_s == pytest.approx(simulate_1f1b(list(packed.stage_times_s), 4, coef.fwd_fraction))
    ordered = by_length_descending(items, lengths).astype(np.int64)
    equal = [balance_lpt(lengths[ordered].astype(np.float64), count, coef) for count in range(1, 120)]
    best_equal = min(best_order([ordered[b] for b in bins], times, coef).time_s for bins, times in filter(None, equal))
    assert packed.time_s < 0.99 * best_equal
    assert packed.time_s >= float(pipeline_time_floor_s(coef, coef.work_s(lengths).sum()))


def test_the_pipeline_holding_the_longest_item_pays_its_bubble_in_the_bound():
    """One long sequence among many short ones on two pp=4 pipelines with tiny per-micro-batch
    overheads: the c-driven floors are negligible, the longest-item chain is short of the fluid
    share, and only the largest-micro-batch floor E prices the long sequence's bubble."""
    profile = CostProfile(num_layers=8, schemes=[_scheme(4, c=1e-5)])
    lengths = [3000] + [100] * 400
    request = PlanRequest(lengths=lengths, num_gpus=8, options=SolverOptions(solver="greedy"))
    plan = evaluate_strategy(request, profile, parse_strategy("2x<1,4,1>"))
    coef = ProfileCostModel(profile).coefficients(parse_strategy("1x<1,4,1>").schemes[0])
    work = float(coef.work_s(np.array(lengths)).sum())
    longest = float(coef.work_s(np.array([3000]))[0])
    extra = coef.c + 3 * ((1 - 2 * coef.fwd_fraction) * (coef.c + longest) + coef.fwd_fraction * coef.c)
    assert 4 * (longest + coef.c) < work / 2  # the chain bound alone is weaker
    assert plan.lower_bound_s >= (work + extra) / 2 * (1 - 1e-9)
    assert plan.lower_bound_s <= plan.step_time_s


def test_capped_pipeline_floor_holds_within_the_cap_and_is_never_lower():
    """A pipeline holding k items runs at most k micro-batches: the floor over m <= k is valid
    for every such packing and at least the uncapped one (much higher for few large items)."""
    profile = CostProfile(num_layers=8, schemes=[_scheme(4)])
    coef = ProfileCostModel(profile).coefficients(parse_strategy("1x<1,4,1>").schemes[0])
    rng = np.random.default_rng(1)
    for cap in (1, 2, 3, 5, 8, 70):
        for count in sorted({1, max(1, cap // 2), cap}):
            works = rng.uniform(0.0, 0.5, count)
            makespan = simulate_1f1b((works + coef.c).tolist(), 4, coef.fwd_fraction)
            assert makespan >= float(pipeline_time_floor_s(coef, works.sum(), cap)) * (1 - 1e-9)
        for work in (0.01, 0.5, 3.0):
            capped = float(pipeline_time_floor_s(coef, work, cap))
            assert capped >= float(pipeline_time_floor_s(coef, work)) * (1 - 1e-12)
            assert float(most_work_s(coef, capped, cap)) == pytest.approx(work)
    # three micro-batches of pp=4 idle at least rho_3 of the work: far above the free-count floor
    assert float(pipeline_time_floor_s(coef, 3.0, 3)) > float(pipeline_time_floor_s(coef, 3.0)) * 1.5


def _packing_instance(case: int) -> tuple[list[int], str, CostProfile]:
    """A few items of up to a whole capacity, a strategy and the profile."""
    profile = CostProfile(num_layers=8, schemes=[_scheme(4, c=5e-3), _scheme(2, c=5e-3)])
    lengths = np.random.default_rng(10 + case).integers(2000, 4000, size=3 + case % 3).tolist()
    return lengths, ["1x<1,4,1> + 1x<1,2,1>", "3x<1,2,1>", "1x<1,4,1> + 2x<1,2,1>", "2x<1,2,1>"][case], profile


def _packing_case(case: int) -> tuple[float, float, float]:
    """(fluid bound, packing bound, exact optimum) of `_packing_instance(case)`."""
    from hydraplan.planner.bounds import BoundTables

    lengths, text, profile = _packing_instance(case)
    deep, shallow = profile.schemes
    cost = ProfileCostModel(profile)
    strategy = parse_strategy(text)
    schemes = [deep if scheme.pp == 4 else shallow for scheme in strategy.pipeline_schemes()]
    optimum = _brute_force_s(lengths, schemes)
    coefs = [cost.coefficients(scheme) for scheme in strategy.schemes]
    tables = BoundTables.build(np.array(lengths), coefs)
    counts = np.array([[count for _, count in strategy.counts]])
    _, start = tables.count_bounds(list(range(len(coefs))), counts)
    raised = tables.packing_bounds(list(range(len(coefs))), counts, start, np.array([optimum * 3]))[0]
    return float(start[0]), float(raised[0]), optimum


@pytest.mark.parametrize("case", range(4))
def test_packing_bounds_stay_below_the_brute_force_optimum(case):
    """The packing bound (item-count caps, dual feasible functions) never passes the optimum,
    alone or as the search applies it (a pool of that one strategy)."""
    fluid, packing, optimum = _packing_case(case)
    assert fluid <= packing <= optimum * (1 + 1e-9)
    lengths, strategy, profile = _packing_instance(case)
    options = SolverOptions(solver="lp", time_limit_s=5, strategy_pool=[strategy])
    plan = solve(PlanRequest(lengths=lengths, num_gpus=parse_strategy(strategy).num_gpus, options=options), profile)
    assert check_plan(plan) == []
    assert plan.lower_bound_s <= optimum * (1 + 1e-9) <= plan.step_time_s * (1 + 2e-9)


def test_packing_bounds_raise_the_bound_of_few_large_items():
    gains = [packing / fluid for fluid, packing, _ in map(_packing_case, range(4))]
    assert sorted(gains)[1] > 1.05, gains  # three of the four (in the other the fluid bound is exact)


@pytest.mark.parametrize("case", range(4))
def test_few_items_bound_stays_below_the_brute_force_optimum_and_gives_a_plan(case):
    """The assignment bound of `planner.few_items` never passes the exact optimum, and its
    assignment places every item once with no pipeline idle (the search keeps the larger of it
    and the fluid bound)."""
    from hydraplan.planner.few_items import few_items_bound

    lengths, text, profile = _packing_instance(case)
    _, _, optimum = _packing_case(case)
    cost = ProfileCostModel(profile)
    pipelines = [cost.coefficients(scheme) for scheme in parse_strategy(text).pipeline_schemes()]
    result = few_items_bound(pipelines, np.array(lengths), optimum * 3)
    assert result is not None and result.assignment is not None
    assert result.bound_s <= optimum * (1 + 1e-9)
    assert sorted(int(i) for items in result.assignment for i in items) == list(range(len(lengths)))
    assert all(len(items) for items in result.assignment)
    # below the cutoff nothing is claimed beyond it, and an idle pipeline is no plan
    assert few_items_bound(pipelines, np.array(lengths), result.bound_s * 0.5).bound_s == result.bound_s * 0.5
    assert few_items_bound(pipelines * 3, np.array(lengths[:2]), 9.0).bound_s == 9.0


def test_few_items_bound_closes_most_of_the_gap_the_fluid_bound_leaves():
    from hydraplan.planner.few_items import few_items_bound

    gains = []
    for case in range(4):
        lengths, text, profile = _packing_instance(case)
        fluid, _, optimum = _packing_case(case)
        cost = ProfileCostModel(profile)
        pipelines = [cost.coefficients(scheme) for scheme in parse_strategy(text).pipeline_schemes()]
        bound = few_items_bound(pipelines, np.array(lengths), optimum * 3).bound_s
        gains.append((bound - fluid) / max(optimum - fluid, 1e-12))
    assert sorted(gains)[1] > 0.5, gains  # three of four: more than half the gap closed


def test_few_items_assignments_never_leave_a_pipeline_idle():
    """Four pipelines and five items, one too long for three of them: every pipeline gets an item
    in the assignment, and the bound agrees with a brute force over the valid assignments."""
    from hydraplan.planner.few_items import few_items_bound

    shallow = SchemeCost(tp=1, pp=2, cp=1, a=1e-9, b=1e-5, c=5e-3, capacity_tokens=4000)
    wide = SchemeCost(tp=2, pp=2, cp=1, a=5e-10, b=5e-6, c=5e-3, capacity_tokens=9000)
    profile = CostProfile(num_layers=8, schemes=[shallow, wide])
    cost = ProfileCostModel(profile)
    pipelines = [cost.coefficients(s) for s in parse_strategy("3x<1,2,1> + 1x<2,2,1>").pipeline_schemes()]
    lengths = np.array([8000, 300, 200, 150, 100])
    result = few_items_bound(pipelines, lengths, 10.0)
    assert result is not None and result.assignment is not None
    assert all(len(items) for items in result.assignment)
    holder = next(p for p, coef in enumerate(pipelines) if coef.scheme.tp == 2)
    assert 0 in result.assignment[holder].tolist()  # the long item fits only the wide pipeline
    optimum = _brute_force_s(lengths.tolist(), [wide if coef.scheme.tp == 2 else shallow for coef in pipelines])
    assert result.bound_s <= optimum * (1 + 1e-9)


# -- interleaved 1F1B (v > 1): the fill-and-drain floor ---------------------------------------------


def _interleaved_coef(stages: int, chunks: int, c: float = 1.0, fwd: float = THIRD) -> SchemeCoefficients:
    scheme = ParallelScheme(1, stages, 1, chunks)
    return SchemeCoefficients(scheme, a=0.0, b=1.0, c=c, fwd_fraction=fwd, capacity_tokens=10**9, grad_bytes_per_gpu=0)


@pytest.mark.parametrize(("stages", "chunks"), [(2, 2), (3, 2), (4, 2), (4, 3), (8, 4)])
def test_the_interleaved_floor_holds_for_random_micro_batches(stages: int, chunks: int) -> None:
    """Megatron-Core's order over random uneven micro-batches (a multiple of pp of them): the exact
    time is at least `S + (pp-1) t_min / v` (the fill-and-drain path) and at least g(W), the floor
    the bounds use."""
    from hydraplan.planner.simulate import simulate_interleaved_1f1b

    rng = np.random.default_rng(stages * 10 + chunks)
    for fwd in (THIRD, 0.5, 0.2):
        coef = _interleaved_coef(stages, chunks, c=float(rng.uniform(0.1, 2.0)), fwd=fwd)
        for _ in range(20):
            count = stages * int(rng.integers(1, 4))
            work = rng.exponential(1.0, count) * rng.choice([0.1, 1.0, 10.0])
            times = work + coef.c
            exact = simulate_interleaved_1f1b(times.tolist(), stages, chunks, fwd)
            assert exact >= times.sum() + (stages - 1) * times.min() / chunks - 1e-9
            assert exact >= float(pipeline_time_floor_s(coef, work.sum())) - 1e-9
            assert float(most_work_s(coef, exact)) >= work.sum() - 1e-9


def test_the_interleaved_floor_is_the_closed_form_bubble_when_micro_batches_are_equal() -> None:
    """Equal micro-batches of overhead only (no work): the Megatron order runs pp of them in
    `pp c + (pp-1) c / v`, the floor exactly, and the floor's bubble is 1F1B's shrunk v times."""
    from hydraplan.planner.simulate import simulate_interleaved_1f1b

    for stages, chunks in ((2, 2), (4, 2), (4, 4)):
        coef = _interleaved_coef(stages, chunks, c=1.0)
        exact = simulate_interleaved_1f1b([1.0] * stages, stages, chunks, THIRD)
        assert float(pipeline_time_floor_s(coef, 0.0)) == pytest.approx(exact, rel=1e-12)
        assert exact == pytest.approx(stages + (stages - 1) / chunks, rel=1e-12)
