"""`BoundTables.packing_bounds` and its `_ItemSizes` helper pinned on tiny instances: the values the
bisection must reach (worked out here from the docstrings: the item sizes `x = w / min(G_s(T),
T - E_s(w))`, the dual feasible functions and `PACKING_BISECTIONS` halvings of [probe, cutoff]), and
validity against an exhaustive search over the assignments of 3-6 items to the pipelines."""

from __future__ import annotations

import dataclasses
import itertools
import math
import types

import numpy as np
import pytest

import hydraplan.planner.bounds as bounds_module
import hydraplan.planner.solve as solve_module
from hydraplan.api.datasets import sample_batch
from hydraplan.cost_models.analytic import build_profile
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.planner.bounds import PACKING_PROOF_SLACK, BoundTables, _ItemSizes
from hydraplan.planner.bubble_floor import largest_micro_batch_floor_s, most_work_s, pipeline_time_floor_s
from hydraplan.planner.certificate import build_certificate
from hydraplan.planner.cost import ProfileCostModel, SchemeCoefficients
from hydraplan.planner.schemas import PlanRequest, SolverOptions
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.search import Bounded, runnable_schemes
from hydraplan.planner.solve import placeable_profile
from hydraplan.planner.strategies import Strategy
from hydraplan.planner.verify_bound import verify_bound


def scheme(tp: int, pp: int, b: float, c: float) -> SchemeCoefficients:
    """Linear work (`a = 0`): an item of l tokens carries `b l` seconds per stage."""
    return SchemeCoefficients(ParallelScheme(tp, pp, 1), a=0.0, b=b, c=c, fwd_fraction=1 / 3,
                              capacity_tokens=1_000_000, grad_bytes_per_gpu=1e9)  # fmt: skip


# pp 1: a pipeline of work W over m micro-batches takes W + m c, so G(T) = T - c and E(w) = c
ONE = scheme(1, 1, b=1e-5, c=1e-3)
ONE_TWIN = scheme(2, 1, b=1e-5, c=1e-3)  # the same costs on another scheme
DEEP2 = scheme(1, 2, b=1e-4, c=1e-4)
DEEP4 = scheme(1, 4, b=1e-4, c=5e-3)


def halvings(start: float, cutoff: float, threshold: float, steps: int = 12) -> float:
    """What `packing_bounds` returns for a row whose T is infeasible exactly below `threshold`:
    a probe 0.2% above the start (left alone if feasible), then `steps` halvings of [probe, cutoff],
    keeping the lower end proved infeasible, claimed PACKING_PROOF_SLACK below it."""
    low, high = start, cutoff
    probe = min(low * 1.002, high)
    if probe >= threshold:
        return start
    low = probe
    for _ in range(steps):
        mid = (low + high) / 2
        low, high = (mid, high) if mid < threshold else (low, mid)
    return max(start, low * (1 - PACKING_PROOF_SLACK))


def packed(coefs, lengths, counts, start, cutoff, **options) -> np.ndarray:
    tables = BoundTables.build(np.asarray(lengths), coefs)
    return tables.packing_bounds(
        list(range(len(coefs))),
        np.asarray(counts),
        np.asarray(start, dtype=np.float64),
        np.asarray(cutoff, dtype=np.float64),
        **options,
    )[0]


def pipeline_floor_s(coef: SchemeCoefficients, works: list[float]) -> float:
    """The least time of one pipeline holding these items (one micro-batch at most per item):
    the bubble floor over at most len(works) micro-batches and the largest micro-batch floor."""
    total = sum(works)
    return max(
        float(pipeline_time_floor_s(coef, total, len(works))),
        total + float(largest_micro_batch_floor_s(coef, max(works))),
    )


def exhaustive_s(coefs, lengths, counts) -> float:
    """Least over every assignment of the items to the pipelines (each holding one at least) of
    the slowest pipeline's floor: no plan of these pipelines beats it."""
    pipelines = [column for column, count in enumerate(counts) for _ in range(count)]
    best = math.inf
    for owner in itertools.product(range(len(pipelines)), repeat=len(lengths)):
        if len(set(owner)) < len(pipelines):
            continue
        slowest = max(
            pipeline_floor_s(coefs[column], [coefs[column].b * x for x, o in zip(lengths, owner) if o == p])
            for p, column in enumerate(pipelines)
        )
        best = min(best, slowest)
    return best


def test_three_items_on_two_pipelines_reach_the_optimum_by_twelve_halvings():
    # some pipeline carries two of three equal items: T >= 2w + c. Below it every size
    # w / (T - c) is over 1/2, which f_1/2 maps to 1: 3 > 2 pipelines. At or above it no function
    # sums past 2 (sizes <= 1/2), so T is infeasible exactly below 2w + c. The fluid bound sees
    # only 1.5 w + c. The cutoff is chosen so that 11 or 13 halvings would end elsewhere.
    w, c = 0.03, 1e-3
    optimum, start, cutoff = 2 * w + c, 1.5 * w + c, 0.0816
    expected = halvings(start, cutoff, optimum)
    assert halvings(start, cutoff, optimum, 11) != expected != halvings(start, cutoff, optimum, 13)
    assert optimum - (cutoff - start) / 4096 < expected < optimum
    got = packed([ONE], [3_000] * 3, [[2]], [start], [cutoff])
    assert got[0] == pytest.approx(expected, rel=1e-12, abs=0)
    assert got[0] <= exhaustive_s([ONE], [3_000] * 3, [2])


def test_a_scheme_without_pipelines_and_a_second_row_change_nothing():
    # the instance above with a twin scheme of no pipelines: at lambda = (1/2, 1/2) the twin
    # prices every item as scheme 0 does, and at weight on it alone nothing is available (nor
    # used), which proves nothing; with a second row (one pipeline: 3w + c, where the sizes
    # w / (T - c) sum to 1) in the same call, each row is bisected on its own
    w, c = 0.03, 1e-3
    start, cutoff = np.array([1.5 * w + c, 2 * w + c]), np.array([0.0816, 0.15])
    got = packed([ONE, ONE_TWIN], [3_000] * 3, [[2, 0], [1, 0]], start, cutoff)
    assert got[0] == pytest.approx(halvings(start[0], cutoff[0], 2 * w + c), rel=1e-12, abs=0)
    assert got[1] == pytest.approx(halvings(start[1], cutoff[1], 3 * w + c), rel=1e-12, abs=0)
    assert got[1] <= exhaustive_s([ONE, ONE_TWIN], [3_000] * 3, [1, 0])


def test_the_even_split_of_two_twin_schemes_is_found_on_and_off_the_grid():
    # 13 equal items on 6 + 6 pipelines of twin schemes: some pipeline holds two, T >= 2w + c.
    # Only lambda near (1/2, 1/2) sees it: 13 items of image 1 at weight 1/2 use 6.5 > 6; at weights
    # (1/2 - d, 1/2 + d) the lighter weight prices each item, 13 (1/2 - d) <= 6 once d >= 1/26. The
    # default grid (multiples of 1/12) holds 1/2; a grid of multiples of 1/13 holds no point that
    # close (13 * 6/13 = 6 proves nothing), and the patches around its best point (spaced 1/24, ...)
    # reach one. The witness is that point.
    w, c = 0.03, 1e-3
    start, cutoff = 1.2 * w + c, 0.0816
    got = packed([ONE, ONE_TWIN], [3_000] * 13, [[6, 6]], [start], [cutoff])
    assert got[0] == pytest.approx(halvings(start, cutoff, 2 * w + c), rel=1e-12, abs=0)
    tables = BoundTables.build(np.full(13, 3_000), [ONE, ONE_TWIN])
    rows, starts, cutoffs = np.array([[6, 6]]), np.array([start]), np.array([cutoff])
    off_grid, witnesses, functions = tables.packing_bounds([0, 1], rows, starts, cutoffs, resolution=13)
    assert off_grid[0] == got[0]
    assert abs(witnesses[0][0] - 0.5) < 1 / 26 and witnesses[0].sum() == pytest.approx(1.0, abs=1e-12)
    assert 13 * witnesses[0].min() > 6  # it proves the bound on its own
    assert (functions[0] == -1).all()  # with every function alike
    # a row the bound does not raise has no witness
    none, unraised, _ = tables.packing_bounds([0, 1], np.array([[7, 7]]), np.array([start]), np.array([cutoff]))
    assert none[0] == start and np.isnan(unraised[0]).all()


def test_should_stop_ends_the_bisection_and_one_scheme_asks_it_only_while_bisecting():
    w, c = 0.03, 1e-3
    optimum, start, cutoff = 2 * w + c, 1.5 * w + c, 0.0816
    calls = []

    def after_two_halvings() -> bool:
        calls.append(1)
        return len(calls) >= 3

    got = packed([ONE], [3_000] * 3, [[2]], [start], [cutoff], should_stop=after_two_halvings)
    assert got[0] == pytest.approx(halvings(start, cutoff, optimum, 2), rel=1e-12, abs=0)
    assert len(calls) == 3  # told to stop, it asks no more
    # a start already at the optimum: the probe just above it is feasible, nothing to bisect
    calls.clear()
    got = packed([ONE], [3_000] * 3, [[2]], [optimum], [cutoff], should_stop=after_two_halvings)
    assert got[0] == optimum and not calls


def test_each_patch_of_the_probe_asks_should_stop_first():
    # the twins' instance at a start already at its optimum: no multipliers prove the probe, so the
    # patches around the best one are searched, each after asking should_stop (a patch is a step);
    # told to stop, none is searched, and the start stands either way
    w, c = 0.03, 1e-3
    optimum, cutoff = 2 * w + c, 0.0816
    calls = []

    def never() -> bool:
        calls.append(1)
        return False

    got = packed([ONE, ONE_TWIN], [3_000] * 13, [[6, 6]], [optimum], [cutoff], should_stop=never)
    assert got[0] == optimum and 1 <= len(calls) <= len(bounds_module.PATCH_RESOLUTIONS)
    calls.clear()

    def at_once() -> bool:
        calls.append(1)
        return True

    got = packed([ONE, ONE_TWIN], [3_000] * 13, [[6, 6]], [optimum], [cutoff], should_stop=at_once)
    assert got[0] == optimum and len(calls) == 1


def test_one_item_that_fits_no_pipeline_below_its_own_time_is_priced_out():
    # one item on one pipeline: below w + c it fits no pipeline (priced 1e30, infeasible); from
    # there its size is at most 1
    w, c = 0.03, 1e-3
    start, cutoff = 0.5 * (w + c), 2 * (w + c)
    got = packed([ONE], [3_000], [[1]], [start], [cutoff])
    assert got[0] == pytest.approx(halvings(start, cutoff, w + c), rel=1e-12, abs=0)


@pytest.mark.parametrize("coef, count", [(ONE, 1), (DEEP2, 2)])
def test_a_pipeline_filled_exactly_is_not_proved_infeasible(coef, count):
    # `count` equal items on one pipeline that they fill exactly at the optimum (pp 1: w + c; pp 2,
    # two items: the bubble floor of two micro-batches, above the largest micro-batch floor). A
    # cutoff a hair above it is feasible, float noise or not: the bound must stay at its start
    w = coef.b * 3_000
    optimum = pipeline_floor_s(coef, [w] * count)
    assert optimum == pytest.approx(float(pipeline_time_floor_s(coef, count * w, count)), rel=1e-12)
    start, cutoff = optimum * (1 - 1e-4), optimum * (1 + 1e-10)
    got = packed([coef], [3_000] * count, [[1]], [start], [cutoff])
    assert got[0] == start
    # n such fillings on n pipelines: every pipeline is full, the images sum to n exactly
    n = 3
    got = packed([coef], [3_000] * count * n, [[n]], [start], [cutoff])
    assert got[0] == start


def test_the_exact_bisection_also_holds_at_another_resolution():
    # the three items over one pipeline of each twin: at lambda = (9/19, 10/19) of a 19-step grid
    # the lighter weight prices them, 3 * 9/19 > 9/19 + 10/19, so 2w + c is reached there too
    w, c = 0.03, 1e-3
    start, cutoff = 1.5 * w + c, 0.0816
    got = packed([ONE, ONE_TWIN], [3_000] * 3, [[1, 1]], [start], [cutoff], resolution=19)
    assert got[0] == pytest.approx(halvings(start, cutoff, 2 * w + c), rel=1e-12, abs=0)


def test_many_large_items_on_a_fine_grid_are_priced_a_row_at_a_time():
    # 160 distinct large lengths on three twin schemes, each on its own pipeline, over a grid of
    # 861 points: more than PACKING_CHUNK_ELEMENTS images per row of counts, so the rows go one per
    # chunk. The longest item fits no pipeline below its own w + c: the probe 0.2% above a start
    # 0.2% below that is infeasible, and stopping there (one costly pass) leaves the probe (claimed
    # PACKING_PROOF_SLACK below it)
    lengths = np.arange(3_000, 3_160)
    third = scheme(4, 1, b=1e-5, c=1e-3)
    longest = 1e-5 * 3_159 + 1e-3
    start, cutoff = 0.998 * longest, 2.0 * longest
    got = packed(
        [ONE, ONE_TWIN, third], lengths, [[54, 53, 53]], [start], [cutoff], resolution=40, should_stop=lambda: True
    )
    assert got[0] == pytest.approx(start * 1.002 * (1 - PACKING_PROOF_SLACK), rel=1e-12, abs=0)
    assert got[0] < longest


def largest_floor_s(coef: SchemeCoefficients, w: float) -> float:
    """E_s(w) of `planner.bubble_floor`, by hand: c + kappa (c + w) + (pp - 1) f c with
    kappa = (pp - 1) max(0, 1 - 2f)."""
    stages, f = coef.scheme.pp, coef.fwd_fraction
    return coef.c + (stages - 1) * max(0.0, 1 - 2 * f) * (coef.c + w) + (stages - 1) * f * coef.c


def test_item_sizes_by_hand():
    # ten items of 10 tokens and one of 3,000 on a two-stage scheme; per row (T, room G): an
    # item fits if w + E(w) <= T and w <= G, and then has size w / min(G, T - E(w)), else 1e30
    tables = BoundTables.build(np.array([3_000] + [10] * 10), [DEEP2])
    sizes = _ItemSizes(tables, [0], 0.2)
    small, large = 1e-4 * 10, 1e-4 * 3_000
    needs = [w + largest_floor_s(DEEP2, w) for w in (small, large)]
    np.testing.assert_allclose(sizes.all_needs[:, 0], needs, rtol=1e-12)
    times = np.array([0.45, 0.39, 0.45])
    rooms = np.array([[0.4], [0.35], [0.29]])
    # 0.45: the large item leaves T - E = 0.3498 beside it, less than the room 0.4;
    # 0.39 < w + E(w) = 0.40017: it fits no micro-batch; room 0.29 < w: it fits no pipeline
    expected_large = [large / (0.45 - largest_floor_s(DEEP2, large)), 1e30, 1e30]
    expected_small = [small / 0.4, small / 0.35, small / 0.29]
    every = sizes.sizes(times, rooms, every=True)  # rows x items (short first) x schemes
    np.testing.assert_allclose(every[:, :, 0], np.transpose([expected_small, expected_large]), rtol=1e-12)
    # only the large item is large: 1e-3 < BIG_ITEM_SHARE * G(0.2)
    assert sizes.big.tolist() == [False, True] and sizes.multiplicity.tolist() == [1]
    np.testing.assert_allclose(sizes.sizes(times, rooms)[:, 0, 0], expected_large, rtol=1e-12)
    # images: the size 0.8576 is over 1 - eps for every eps, and u_k(x) = floor((k+1) x) / k is 1
    # for k = 2, 3, 4; an item that cannot go stays 1e30 under every function
    images = sizes.images(times, rooms)  # functions x rows x items x schemes
    assert images.shape == (10, 3, 1, 1)
    np.testing.assert_allclose(images[:, 0, 0, 0], 1.0, rtol=0, atol=1e-8)
    assert (images[:, 1:, 0, 0] == 1e30).all()


def test_items_at_the_big_share_are_kept_and_smaller_ones_left_out():
    # pp 1 without overhead: G(T) = T, so at the least time 1.25 an item is large from 0.2 * 1.25
    bare = scheme(1, 1, b=1e-4, c=0.0)
    tables = BoundTables.build(np.array([2_000, 2_500, 3_000]), [bare])
    assert 0.2 * 1.25 == 1e-4 * 2_500  # the middle item sits exactly at the share
    sizes = _ItemSizes(tables, [0], 1.25)
    assert sizes.big.tolist() == [False, True, True]
    assert sizes.useful


def test_the_identity_prices_every_item_up_to_400_lengths():
    # 400 distinct short lengths, none large: only the identity can raise the bound, to the area
    # W / n + c of two pipelines (pp 1: sizes w / (T - c) summing to at most n)
    lengths = np.arange(1, 401)
    tables = BoundTables.build(lengths, [ONE])
    sizes = _ItemSizes(tables, [0], 0.2)
    assert sizes.identity and not sizes.big.any() and sizes.useful
    total = 1e-5 * lengths.sum()
    start, cutoff = 0.3, 0.8
    got = tables.packing_bounds([0], np.array([[2]]), np.array([start]), np.array([cutoff]))[0]
    assert got[0] == pytest.approx(halvings(start, cutoff, total / 2 + 1e-3), rel=1e-12, abs=0)
    # one more length: the identity is off, and with no large item nothing is left to price
    wider = BoundTables.build(np.arange(1, 402), [ONE])
    assert not _ItemSizes(wider, [0], 0.2).identity and not _ItemSizes(wider, [0], 0.2).useful
    assert wider.packing_bounds([0], np.array([[2]]), np.array([start]), np.array([cutoff]))[0][0] == start


def test_item_sizes_need_one_row_per_item():
    tables = BoundTables.build(np.full(300, 1_000), [ONE])
    assert _ItemSizes(tables, [0], 0.1).all_multiplicity.tolist() == [300]  # 300 items, counted right
    for wrong in (299, 301):
        with pytest.raises(ValueError, match="one row per item"):
            _ItemSizes(dataclasses.replace(tables, num_items=wrong), [0], 0.1)


def test_item_count_caps_by_hand():
    """`rooms`: G_s(T) over at most k micro-batches, k the cap given, lowered (never raised) to
    the number of lightest items that fit that room, for up to ITEM_CAP_ROUNDS rounds."""
    time = np.array([1.0])

    def room(coef, lengths, most_items):
        tables = BoundTables.build(np.asarray(lengths), [coef])
        return _ItemSizes(tables, [0], 0.1).rooms(time, np.array([most_items]))[0, 0]

    def most(coef, cap=None):
        return float(most_work_s(coef, 1.0, cap))

    # pp 1: T - c whatever the cap
    assert room(ONE, [3_000] * 4, 3) == pytest.approx(1.0 - 1e-3, rel=1e-12)
    # four stages, items of 0.205: five micro-batches leave room for three (0.615 <= G_5 < 0.82),
    # three for two (0.41 <= G_3 < 0.615), two for one (G_2 < 0.41): three rounds end at G_1
    w = 0.205
    assert 3 * w <= most(DEEP4, 5) < 4 * w and 2 * w <= most(DEEP4, 3) < 3 * w and most(DEEP4, 2) < 2 * w
    assert room(DEEP4, [2_050] * 6, 5) == pytest.approx(most(DEEP4, 1), rel=1e-12)
    # a cap of one stays one, though all six short items would fit
    assert room(DEEP4, [10] * 6, 1) == pytest.approx(most(DEEP4, 1), rel=1e-12)
    # 200 items of 0.00772 s: 128 fit the uncapped room (G_inf < 129 w) and still fit G_128, which
    # is smaller: the cap comes down to 128 (caps above 128 price like none)
    fine = scheme(1, 4, b=7.72e-5, c=1e-5)
    w = 7.72e-5 * 100
    assert 128 * w <= most(fine, 128) < most(fine) < 129 * w
    assert room(fine, [100] * 200, 200) == pytest.approx(most(fine, 128), rel=1e-12)
    # six stages, no overhead, items of 0.13: 8 micro-batches leave room for 5, 5 for 4, 4 for 3
    # and 3 for 2. Three rounds (ITEM_CAP_ROUNDS) stop at G_3; a fourth would go on to G_2
    six = scheme(1, 6, b=1e-4, c=0.0)
    w = 0.13
    for cap, fitting in [(8, 5), (5, 4), (4, 3), (3, 2)]:
        assert fitting * w <= most(six, cap) < (fitting + 1) * w
    assert room(six, [1_300] * 9, 8) == pytest.approx(most(six, 3), rel=1e-12)


INSTANCES = [
    ([ONE], [1_000, 2_000, 3_000, 3_000], [[1], [2], [3], [4]]),
    ([DEEP2], [500, 1_500, 2_500, 2_500, 3_000], [[1], [2], [3], [5]]),
    ([ONE, DEEP2], [800, 1_600, 2_400, 3_000], [[1, 1], [2, 0], [0, 2], [2, 1], [0, 4]]),
    ([DEEP4], [300, 1_200, 1_800, 2_400, 2_400, 3_000], [[1], [2], [3], [6]]),
]


@pytest.mark.parametrize("coefs, lengths, rows", INSTANCES)
def test_packing_bounds_stay_below_every_assignment_of_the_items(coefs, lengths, rows):
    # some rows have a scheme without pipelines, some as many pipelines as items (each holding
    # one, whose images are all 1: used exactly equals available)
    optimum = np.array([exhaustive_s(coefs, lengths, row) for row in rows])
    got = packed(coefs, lengths, rows, 0.5 * optimum, 2.0 * optimum)
    assert (got >= 0.5 * optimum).all()
    assert (got <= optimum * (1 + 1e-9)).all(), (got, optimum)


@pytest.fixture(scope="module")
def deep_pipelines_batch():
    """A 32B / 64 A100 lognormal batch (the quality benchmark's seed 0), whose bound strategies of
    few deep pipelines held before their packing multipliers were searched off the grid."""
    profile = build_profile(get_model("llama-32b"), get_gpu("a100-80gb"), 64, 8)
    lengths = sample_batch("lognormal", 200_000, 0, 32 * 1024)
    # the LP backend: no MILP polish, whose wall-time cap could make two runs differ on a busy machine
    options = SolverOptions(solver="lp", time_limit_s=2.0, seed=0, oversize="split")
    return profile, PlanRequest(lengths=lengths, num_gpus=64, gpus_per_node=8, options=options)


def clockless_solve(monkeypatch, profile, request):
    """`solve` with the clock standing still: the work limits alone end it, whatever the load."""
    monkeypatch.setattr(solve_module, "time", types.SimpleNamespace(perf_counter=lambda: 0.0))
    plan = solve_module.solve(request, profile)
    monkeypatch.undo()
    assert not plan.solver.cut_by_clock
    return plan


def test_off_grid_packing_multipliers_raise_a_plans_bound_and_the_certificate_carries_them(
    monkeypatch, deep_pipelines_batch
):
    profile, request = deep_pipelines_batch
    plan = clockless_solve(monkeypatch, profile, request)
    monkeypatch.setattr(bounds_module, "PATCH_RESOLUTIONS", ())
    on_grid = clockless_solve(monkeypatch, profile, request)
    assert plan.objective_s == on_grid.objective_s  # the same plan, with a higher bound
    assert plan.lower_bound_s > on_grid.lower_bound_s * 1.005
    witnesses = [w.multipliers for e in plan.bound_certificate.expanded for w in e.strategies]
    off_grid = [m for m in witnesses if not np.allclose(np.asarray(m) * 12, np.round(np.asarray(m) * 12), atol=1e-6)]
    assert off_grid, witnesses
    assert verify_bound(plan, profile, request).ok


def test_every_strategy_the_packing_bound_raised_carries_its_multipliers_in_column_order():
    # a set of the twin schemes, expanded: one strategy near the global bound (a fluid witness) and
    # one far above it whose bound the packing raised (its multipliers, listed in the set's column
    # order, whatever its own order); a third, far above and not raised, carries none
    tables = BoundTables.build(np.full(13, 3_000), [ONE, ONE_TWIN])
    near = Bounded(1.0, 1.0, 1.0, Strategy.of({ONE.scheme: 6, ONE_TWIN.scheme: 6}))
    strategy = Strategy.of({ONE.scheme: 1, ONE_TWIN.scheme: 11})
    weights = tuple(0.3 if scheme == ONE.scheme else 0.7 for scheme, _ in strategy.counts)  # its own order
    raised = Bounded(2.0, 2.0, 2.0, strategy, witness=weights)
    plain = Bounded(2.0, 2.0, 2.0, Strategy.of({ONE.scheme: 2, ONE_TWIN.scheme: 10}))
    frontier = types.SimpleNamespace(
        tables=tables,
        expanded=[((0, 1), False, 1.0)],
        strategies=[near, raised, plain],
        column_of={ONE.scheme: 0, ONE_TWIN.scheme: 1},
        set_pricing=None,
    )
    certificate = build_certificate(frontier, "search", 2, lower_bound_s=1.0)
    witnesses = {tuple(w.counts): w.multipliers for w in certificate.expanded[0].strategies}
    assert set(witnesses) == {(6, 6), (1, 11)}
    assert witnesses[1, 11] == [0.3, 0.7]


def test_the_refined_duals_stay_under_every_assignment_and_their_witness_proves_them():
    # tiny instances of one deep and one shallow scheme: the refined duals never pass the least
    # slowest-pipeline floor over every assignment, and the witness, joined to the grid of 12,
    # gives the same bound
    rng = np.random.default_rng(3)
    for _ in range(20):
        lengths = rng.integers(500, 4_000, size=int(rng.integers(3, 6))).tolist()
        coefs = [DEEP4, ONE] if rng.random() < 0.5 else [DEEP2, ONE]
        counts = np.array([[1, int(rng.integers(1, 3))]])
        tables = BoundTables.build(np.asarray(lengths), coefs)
        _, start = tables.count_bounds([0, 1], counts)
        refined, witnesses = tables.refined_dual_bounds([0, 1], counts, start)
        assert start[0] <= refined[0] <= exhaustive_s(coefs, lengths, counts[0]) * (1 + 1e-9)
        if refined[0] > start[0]:
            assert tables.count_bounds([0, 1], counts, extra=witnesses)[1][0] == pytest.approx(refined[0], rel=1e-12)
        else:
            assert np.isnan(witnesses).all()
        stopped, none = tables.refined_dual_bounds([0, 1], counts, start, should_stop=lambda: True)
        assert stopped[0] == start[0] and np.isnan(none).all()  # a step per row: told to stop, none


def test_the_refined_duals_raise_a_deep_pipelines_strategy_off_the_grid(deep_pipelines_batch):
    # `1x<4,5,2> + 1x<2,12,1>` of the 32B lognormal batch: the fluid dual's best multipliers lie off
    # the grid of 12, and the bubble-floor dual at them is 2.6% higher
    profile, request = deep_pipelines_batch
    cost = ProfileCostModel(placeable_profile(profile, 64, 8))
    coefs = runnable_schemes(cost, 64, set())
    column = {(c.scheme.tp, c.scheme.pp, c.scheme.cp, c.scheme.v): k for k, c in enumerate(coefs)}
    columns = [column[4, 5, 2, 1], column[2, 12, 1, 1]]
    tables = BoundTables.build(np.asarray(request.lengths), coefs)
    counts = np.array([[1, 1]])
    _, on_grid = tables.count_bounds(columns, counts)
    refined, witnesses = tables.refined_dual_bounds(columns, counts, on_grid)
    assert refined[0] > on_grid[0] * 1.02
    assert not np.allclose(witnesses[0] * 12, np.round(witnesses[0] * 12))


@pytest.mark.parametrize(("budget_s", "refined"), [(2.0, False), (4.0, True)])
def test_the_search_refines_the_duals_from_a_4_s_budget_on(monkeypatch, deep_pipelines_batch, budget_s, refined):
    # the tightening's refined duals and every-step patches need twice the default's steps: a 4 s
    # budget has them, the 2 s default does not
    profile, request = deep_pipelines_batch
    calls = []
    real = bounds_module.BoundTables.refined_dual_bounds

    def spy(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    request = request.model_copy(update={"options": request.options.model_copy(update={"time_limit_s": budget_s})})
    monkeypatch.setattr(bounds_module.BoundTables, "refined_dual_bounds", spy)
    monkeypatch.setattr(solve_module, "time", types.SimpleNamespace(perf_counter=lambda: 0.0))
    plan = solve_module.solve(request, profile)
    assert bool(calls) == refined
    assert verify_bound(plan, profile, request).ok
