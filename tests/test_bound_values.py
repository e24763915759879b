"""The bound code's values pinned by hand on tiny instances: validity tests (a bound below every
plan) cannot see a change that only weakens a bound; these see it. Each expected value is worked
out here from the formulas in `planner.bounds`' docstrings, not by calling the code twice."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hydraplan.planner.bounds import BoundTables, least_of_last, weighted_min
from hydraplan.planner.bubble_floor import pipeline_time_floor_s
from hydraplan.planner.cost import SchemeCoefficients
from hydraplan.planner.scheme import ParallelScheme

# two schemes: one GPU with a short capacity, and a two-stage pipeline of two GPUs per stage
SMALL = SchemeCoefficients(ParallelScheme(1, 1, 1), a=1e-8, b=1e-4, c=0.01, fwd_fraction=1 / 3,
                           capacity_tokens=1_000, grad_bytes_per_gpu=1e9)  # fmt: skip
DEEP = SchemeCoefficients(ParallelScheme(2, 2, 1), a=2e-9, b=3e-5, c=0.02, fwd_fraction=1 / 3,
                          capacity_tokens=4_000, grad_bytes_per_gpu=1e9)  # fmt: skip
LENGTHS = np.array([300, 300, 800, 2_500])


def work(coef: SchemeCoefficients, length: float) -> float:
    return coef.a * length * length + coef.b * length


def test_tables_by_hand():
    tables = BoundTables.build(LENGTHS, [SMALL, DEEP])
    assert tables.lengths.tolist() == [300, 800, 2_500]
    assert tables.multiplicity.tolist() == [2, 1, 1]
    assert tables.num_items == 4
    for row, length in enumerate([300, 800, 2_500]):
        for column, (coef, gpus) in enumerate([(SMALL, 1), (DEEP, 4)]):
            if length > coef.capacity_tokens:
                for table in (tables.gpu_seconds, tables.work_s, tables.longest_s):
                    assert math.isinf(table[row, column])
                continue
            w = work(coef, length)
            # g (w + c l / cap): the item's share of the micro-batch overheads, on every GPU
            assert tables.gpu_seconds[row, column] == pytest.approx(gpus * (w + coef.c * length / coef.capacity_tokens))
            assert tables.work_s[row, column] == pytest.approx(w)
            # its micro-batch crosses every stage forwards and backwards
            assert tables.longest_s[row, column] == pytest.approx(coef.scheme.pp * (w + coef.c))


def test_pipeline_time_bound_and_longest_fitting_by_hand():
    tables = BoundTables.build(LENGTHS, [SMALL, DEEP])
    # on 6 GPUs: every item on its cheapest scheme (GPU-seconds), over the GPUs; or the longest item
    cheapest = [min(1 * (work(SMALL, x) + SMALL.c * x / 1_000), 4 * (work(DEEP, x) + DEEP.c * x / 4_000))
                for x in (300, 300, 800)] + [4 * (work(DEEP, 2_500) + DEEP.c * 2_500 / 4_000)]  # fmt: skip
    area = sum(cheapest) / 6
    longest = 2 * (work(DEEP, 2_500) + DEEP.c)  # only DEEP holds 2,500 tokens
    assert tables.pipeline_time_bound_s([0, 1], 6) == pytest.approx(max(area, longest))
    assert math.isinf(tables.pipeline_time_bound_s([0], 6))  # SMALL cannot hold 2,500 tokens
    only_deep = sum(4 * (work(DEEP, x) + DEEP.c * x / 4_000) for x in LENGTHS) / 8
    assert tables.pipeline_time_bound_s([1], 8) == pytest.approx(max(only_deep, longest))
    assert tables.longest_fitting(0) == 800
    assert tables.longest_fitting(1) == 2_500
    assert BoundTables.build(np.array([5_000]), [SMALL, DEEP]).longest_fitting(1) == 0.0


def test_coarsened_rows_by_hand():
    lengths = np.array([100, 101, 102, 110, 990, 1_000, 1_010])
    tables = BoundTables.build(lengths, [SMALL, DEEP])
    coarse = tables.coarsened(1.02)
    # rows within 2% of their first length, and never across SMALL's capacity of 1,000 tokens
    assert coarse.lengths.tolist() == [102, 110, 1_000, 1_010]
    assert coarse.multiplicity.tolist() == [1, 1, 1, 1]
    assert coarse.num_items == 7
    # each row's work priced from its shortest length, on all its tokens: (a low + b) * tokens
    tokens, low = 100 + 101 + 102, 100
    assert coarse.work_s[0, 0] == pytest.approx((SMALL.a * low + SMALL.b) * tokens)
    assert coarse.work_s[2, 0] == pytest.approx((SMALL.a * 990 + SMALL.b) * (990 + 1_000))
    # fit and the longest-item bound by the row's longest length
    assert math.isinf(coarse.work_s[3, 0]) and math.isfinite(coarse.work_s[2, 0])
    assert coarse.longest_s[2, 1] == pytest.approx(2 * (work(DEEP, 1_000) + DEEP.c))


def test_bubble_priced_tables_by_hand():
    tables = BoundTables.build(LENGTHS, [SMALL, DEEP])
    cap_s = 0.5
    priced = tables.bubble_priced(cap_s)
    # SMALL (pp 1) has no bubble: its capacity pricing stays
    np.testing.assert_array_equal(priced.gpu_seconds[:, 0], tables.gpu_seconds[:, 0])
    # DEEP: g w (1 + h(T_cap) / T_cap), where that is the larger total over its fitting items
    overhead = float(pipeline_time_floor_s(DEEP, cap_s, 4)) - cap_s
    assert overhead > 0
    bubbled = 4 * tables.work_s[:, 1] * (1 + overhead / cap_s)
    capacity_priced = tables.gpu_seconds[:, 1]
    expected = bubbled if tables.multiplicity @ bubbled > tables.multiplicity @ capacity_priced else capacity_priced
    np.testing.assert_allclose(priced.gpu_seconds[:, 1], expected)
    assert tables.bubble_priced(math.inf) is tables
    assert tables.bubble_priced(0.0) is tables


def test_the_fluid_bound_of_two_schemes_by_hand():
    lengths = np.array([300, 800, 2_500, 2_500, 2_500])
    tables = BoundTables.build(lengths, [SMALL, DEEP])
    counts = np.array([[2, 1]])
    fluid, bound = tables.count_bounds([0, 1], counts)
    # the default grid: multiples of 1/12 on the simplex, and the GPU shares (1/5, 4/5)
    grid = [(k / 12, 1 - k / 12) for k in range(13)] + [(0.2, 0.8)]
    per_pipeline = {(x, s): tables.gpu_seconds[row, s] / [1, 4][s] for row, x in enumerate([300, 800, 2_500])
                    for s in (0, 1)}  # fmt: skip
    floors = [0.0, (2 - 1) * DEEP.c]
    n = [2, 1]

    def dual(lam):
        # an item may go free to a scheme of zero weight, never to one it does not fit otherwise
        def price(x, s):
            return 0.0 if lam[s] == 0 else lam[s] * per_pipeline[(x, s)]

        total = sum(min(price(x, 0), price(x, 1)) for x in lengths.tolist())
        return (total + sum(lam[s] * n[s] * floors[s] for s in (0, 1))) / sum(lam[s] * n[s] for s in (0, 1))

    expected = max(dual(lam) for lam in grid)
    assert fluid[0] == pytest.approx(expected)
    assert bound[0] >= max(expected, tables.pipeline_time_bound_s([0, 1], 6)) * (1 - 1e-12)


def test_the_area_bound_by_hand_where_it_holds_the_bound():
    lengths = np.full(40, 900)
    tables = BoundTables.build(lengths, [SMALL, DEEP])
    cheapest = min(work(SMALL, 900) + SMALL.c * 0.9, 4 * (work(DEEP, 900) + DEEP.c * 900 / 4_000))
    longest = min(work(SMALL, 900) + SMALL.c, 2 * (work(DEEP, 900) + DEEP.c))
    area = 40 * cheapest / 5
    assert area > longest
    assert tables.pipeline_time_bound_s([0, 1], 5) == pytest.approx(area)


def test_short_axis_minima_match_numpy():
    rng = np.random.default_rng(0)
    values = rng.random((5, 4, 3))
    np.testing.assert_array_equal(least_of_last(values), values.min(axis=-1))
    weights = rng.random((7, 3))
    np.testing.assert_array_equal(weighted_min(values, weights), (values[..., None, :] * weights).min(axis=-1))
    per_set = rng.random((4, 6, 3))  # weights per entry of the second axis, as the replica split uses
    np.testing.assert_array_equal(weighted_min(values, per_set), (values[:, :, None, :] * per_set[None]).min(axis=-1))


def test_the_set_packing_bound_reaches_the_optimum_where_three_items_share_two_pipelines():
    # three equal items, one GPU per pipeline, two GPUs: some pipeline carries two of them, so no
    # plan beats 2w + c (both in one micro-batch; pp 1 has no bubble). An item over half a
    # pipeline's room counts 1 under f_1/2, so the bound must climb to about that time: a change
    # that only weakens the set-packing bound leaves it at the fluid value 1.5 w + c
    from hydraplan.planner.bounds import SyncFloors
    from hydraplan.planner.cost import ProfileCostModel
    from hydraplan.planner.schemas import CostProfile, SchemeCost

    one = SchemeCost(tp=1, pp=1, cp=1, a=0.0, b=1e-4, c=0.01, capacity_tokens=10_000, grad_bytes_per_gpu=2e10)
    profile = CostProfile(
        source="user", model="pin", gpu="pin", num_layers=2, schemes=[one], grad_sync_bandwidth_bytes_per_s=1e12
    )
    cost = ProfileCostModel(profile)
    coef = cost.coefficients(cost.schemes()[0])
    tables = BoundTables.build(np.array([3_000, 3_000, 3_000]), [coef])
    floors = SyncFloors(cost, [coef], 2)
    w = 1e-4 * 3_000
    sync = floors((0,))
    fluid = tables.pipeline_time_bound_s([0], 2)
    assert fluid < 2 * w  # the area and longest-item bounds see only 1.5 w (+ overheads)
    optimum = 2 * w + coef.c + sync
    assert sync > 0.02 * optimum  # the sync floor is added back: a sign slip there must show
    # an incumbent 5% above the optimum, as the search has one: the grid of step times is then fine
    raised = tables.set_packing_bounds_s([(0,)], 2, floors, np.array([fluid + sync]), cap_s=1.05 * optimum)
    assert 0.99 * optimum <= raised[0] <= optimum * (1 + 1e-9)
