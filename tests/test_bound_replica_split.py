"""The replica-split set bound, the count bounds' grid, the fluid ideal counts and the simplex grid
(`planner.bounds`) pinned on tiny instances. Expected values are worked out here from the
docstrings' formulas (and, for the replica split, checked against the LP the bound is the dual
of, solved with HiGHS), never by calling the code under test twice."""

from __future__ import annotations

import highspy
import numpy as np
import pytest

from hydraplan.planner.bounds import BoundTables, SyncFloors, simplex_grid
from hydraplan.planner.cost import SchemeCoefficients
from hydraplan.planner.scheme import ParallelScheme


def coefficient(tp: int, pp: int, cp: int, c: float = 0.0) -> SchemeCoefficients:
    return SchemeCoefficients(ParallelScheme(tp, pp, cp), 1e-9, 1e-5, c, 1 / 3, 4_096, 1e9)


class LinearSync:
    """A cost model stand-in for `SyncFloors`: gradient sync of `sigma` per replica beyond the first
    (non-decreasing in the replicas, as the ring all-reduce is)."""

    def __init__(self, sigma: float) -> None:
        self.sigma = sigma

    def grad_sync_for_replicas_s(self, replicas: int, schemes) -> float:
        return self.sigma * (replicas - 1)


def tables_of(coefs, gpu_seconds, multiplicity, longest_s) -> BoundTables:
    """Tables given directly: per row (item length) and column (scheme) the GPU-seconds and the
    longest-item time the set bounds minimise (what the replica split and the ideal counts read)."""
    gpu_seconds = np.asarray(gpu_seconds, dtype=np.float64)
    gpus = np.array([coef.scheme.num_gpus for coef in coefs], dtype=np.float64)
    multiplicity = np.asarray(multiplicity, dtype=np.float64)
    return BoundTables(
        coefs=tuple(coefs),
        gpu_seconds=gpu_seconds,
        work_s=gpu_seconds / gpus[None, :],
        longest_s=np.asarray(longest_s, dtype=np.float64),
        multiplicity=multiplicity,
        lengths=np.arange(1.0, len(multiplicity) + 1),
        num_items=int(multiplicity.sum()),
    )


def fewer_replicas_lp_s(tables: BoundTables, columns, num_gpus: int, below: int) -> float:
    """The LP whose dual the replica split's `few` case is: min T over items split freely, y_s =
    n_s T the pipeline time on s, load_s <= y_s, sum g_s y_s <= N T and (fewer than `below`
    replicas) sum cp_s y_s <= (below - 1) T. Every mu >= 0 of the docstring is a dual point."""
    cost = tables.multiplicity[:, None] * tables.gpu_seconds[:, columns]  # GPU-seconds of each row
    gpus = [tables.coefs[c].scheme.num_gpus for c in columns]
    cps = [tables.coefs[c].scheme.cp for c in columns]
    rows, schemes = cost.shape
    model = highspy.Highs()
    model.setOptionValue("output_flag", False)
    inf = highspy.kHighsInf
    for _ in range(rows * schemes):  # x[i, s]: the share of row i on s
        model.addVar(0.0, 1.0)
    for _ in range(schemes):  # y_s
        model.addVar(0.0, inf)
    time_var = rows * schemes + schemes
    model.addVar(0.0, inf)
    model.changeColCost(time_var, 1.0)
    for i in range(rows):
        model.addRow(1.0, 1.0, schemes, np.arange(i * schemes, (i + 1) * schemes), np.ones(schemes))
    for s in range(schemes):  # a pipeline's time is its GPU-seconds over its GPUs
        indices = [i * schemes + s for i in range(rows)] + [rows * schemes + s]
        values = [float(cost[i, s]) / gpus[s] for i in range(rows)] + [-1.0]
        model.addRow(-inf, 0.0, len(indices), np.array(indices), np.array(values))
    y = [rows * schemes + s for s in range(schemes)]
    model.addRow(-inf, 0.0, schemes + 1, np.array([*y, time_var]), np.array([*map(float, gpus), -num_gpus]))
    model.addRow(-inf, 0.0, schemes + 1, np.array([*y, time_var]), np.array([*map(float, cps), -(below - 1.0)]))
    model.run()
    return float(model.getInfo().objective_function_value)


# --- the replica split -------------------------------------------------------------------------
#
# One length (8 items) and two schemes on N = 8 GPUs: A = <1,1,1> (1 GPU, one replica per GPU,
# GPU-seconds 1 an item) and B = <2,3,1> (6 GPUs, a sixth of a replica per GPU, dearer). Every
# strategy of {A, B} has at least F = cp_A + cp_B = 2 replicas (N / 6 < 2), at most M = N cp_A / g_A
# = 8, so the thresholds tried are F + 1 = 3 and round(2 * 1.5^k) = 4, 7, (10 ->) 8, ...
#
# With R = 3 (strategies of 2 replicas) the bound is max over mu of 8 min(1 + mu, P_B (1 + mu / 6))
# / (8 + 2 mu): on A's branch it grows with mu (8 cp_A / g_A > R - 1 = 2), on B's it falls (8 / 6 <
# 2), so its maximum is where the branches cross, mu* = (P_B - 1) / (1 - P_B / 6). Choosing P_B puts
# mu* at a grid weight w N; the LP optimum is then reached on the grid, 8 (1 + mu*) / (8 + 2 mu*).
# The sync (3 per replica beyond the first) is dear enough that the `many` case (area 1 + sync(3) =
# 7) never binds at R = 3, and larger R only lower the `few` case (its denominator grows): the
# bound is that optimum plus sync(F) = 3, above the plain area + sync(F) = 1 + 3.
SMALL_A = coefficient(1, 1, 1)
WIDE_B = coefficient(2, 3, 1)


@pytest.mark.parametrize("weight", [0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0])
def test_the_replica_split_reaches_the_lp_optimum_at_each_grid_weight(weight):
    crossing = weight * 8
    dear = (1 + crossing) / (1 + crossing / 6)  # P_B: the branches meet at mu*
    tables = tables_of([SMALL_A, WIDE_B], [[1.0, dear]], [8], [[0.1, 0.1]])
    floors = SyncFloors(LinearSync(3.0), tables.coefs, 8)
    assert floors.fewest_replicas((0, 1)) == 2 and floors((0, 1)) == pytest.approx(3.0)
    optimum = 8 * (1 + crossing) / (8 + 2 * crossing)
    assert fewer_replicas_lp_s(tables, [0, 1], 8, 3) == pytest.approx(optimum, rel=1e-7)
    assert optimum > 1.0 + 0.05  # above the area (8 items of 1 GPU-second over 8 GPUs)
    bound = tables.replica_split_bounds_s([(0, 1)], 8, floors)
    assert bound.shape == (1,)
    assert bound[0] == pytest.approx(optimum + 3.0, rel=1e-9)


def test_the_replica_split_never_passes_the_lp_of_fewer_replicas_plus_the_sync():
    """Between grid weights the bound is the best grid point: below the LP optimum, and above
    the plain set bound (area 1 + sync 3). With mu* = 0.6 N, between the weights 0.5 and 1,
    8 (1 + mu) / (8 + 2 mu) at mu = 0.5 N and 8 P_B (1 + mu / 6) / (8 + 2 mu) at mu = N."""
    crossing = 0.6 * 8
    dear = (1 + crossing) / (1 + crossing / 6)
    tables = tables_of([SMALL_A, WIDE_B], [[1.0, dear]], [8], [[0.1, 0.1]])
    floors = SyncFloors(LinearSync(3.0), tables.coefs, 8)
    bound = tables.replica_split_bounds_s([(0, 1)], 8, floors)[0]
    best = max(8 * (1 + 4) / (8 + 2 * 4), 8 * dear * (1 + 8 / 6) / (8 + 2 * 8))
    assert bound == pytest.approx(best + 3.0, rel=1e-9)
    assert bound < fewer_replicas_lp_s(tables, [0, 1], 8, 3) + 3.0


def test_the_replica_split_uses_the_first_scheme_for_a_single_scheme_set_and_many_sets_at_once():
    """A set of one scheme repeats it (no minimum changes); each set of a batch gets its own bound.
    For {A} alone on 8 GPUs every strategy has exactly 8 replicas: F = M = 8, no threshold above F
    is tried, and the bound is the plain area (8 / 8) + sync(8) = 1 + 7 * 3."""
    crossing = 1.0 * 8
    dear = (1 + crossing) / (1 + crossing / 6)
    tables = tables_of([SMALL_A, WIDE_B], [[1.0, dear]], [8], [[0.1, 0.1]])
    floors = SyncFloors(LinearSync(3.0), tables.coefs, 8)
    bounds = tables.replica_split_bounds_s([(0,), (0, 1), (1,)], 8, floors)
    # {B} alone: one pipeline of 6 GPUs at most, 8 P_B / 8 and sync(ceil(8 / 6) = 2)
    assert bounds.tolist() == pytest.approx([1.0 + 21.0, 8 * 9 / 24 + 3.0, dear + 3.0], rel=1e-9)


# One length (256 items) and two schemes on N = 256 GPUs: A = <2,1,1> (GPU-seconds 2 an item, half
# a replica per GPU) and B = <8,16,1> (128 GPUs, dear). F = 2 replicas, M = 256 / 2 = 128: the
# thresholds are 3, 4, 7, 10, 15, 23, 34, 51, 77, 115 (round(2 * 1.5^k), k = 1..10) and 173 capped
# at 128. The area is 256 * 2 / 256 = 2. A stays the cheaper branch at every mu (B's price grows
# faster), so the `few` case at R <= 128 is at least its value at the largest weight mu = 5 N,
# 512 (1 + 640) / (256 + 1280 (R - 1)) >= 2.0157 at R = 128. With a sync of 1e-4 per replica the
# `many` case area + sync(R) binds at every threshold, and the bound is area + sync(M): the top
# threshold must be the most replicas any strategy can have, M = 128 (all GPUs on A). A threshold
# past M sees only the area in the `few` case (R - 1 >= N cp_A / g_A: its best mu is 0).
NARROW_A = coefficient(2, 1, 1)
DEEP_B = coefficient(8, 16, 1)


def test_the_replica_split_tries_up_to_the_most_replicas_where_the_sync_binds():
    tables = tables_of([NARROW_A, DEEP_B], [[2.0, 200.0]], [256], [[0.1, 0.1]])
    floors = SyncFloors(LinearSync(1e-4), tables.coefs, 256)
    assert floors.fewest_replicas((0, 1)) == 2
    least_few = 512 * (1 + 640) / (256 + 1280 * 127)
    assert least_few - 2.0 > 1e-4 * (128 - 2)  # the `few` case stays above `many` up to R = 128
    bound = tables.replica_split_bounds_s([(0, 1)], 256, floors)[0]
    assert bound == pytest.approx(2.0 + 1e-4 * 127, rel=1e-9)
    # and it is a bound: strategies of >= 128 replicas sync at least that much over the area, and
    # the LP of strategies with fewer (plus their least sync) is higher still
    assert fewer_replicas_lp_s(tables, [0, 1], 256, 128) + 1e-4 >= bound


# --- the count bounds' grid --------------------------------------------------------------------


def test_the_count_bound_grid_holds_the_gpu_share_point():
    """The dual fluid bound of `count_bounds` takes the best lambda on the 1/12 simplex grid and on
    the GPU shares g_s / sum g. One length whose GPU-seconds are the same on both schemes (7 items
    of 1, on a 1-GPU and a 6-GPU scheme, pp 1: no floors): the numerator 7 min(lambda_A u_A,
    lambda_B u_B), u = (1, 1/6), kinks where lambda_A / lambda_B = 1/6, the GPU shares (1/7, 6/7);
    the ratio grows towards the kink from both sides, whatever the counts (the numerator grows,
    or falls slower than the denominator). There it is 7 / (n_A + 6 n_B): the area on the GPUs
    the row uses. 1/7 is no multiple of 1/12, so no other grid point reaches it: for the first row
    lambda = (1/12, 11/12) gives 7 (1/12) / (7/12 + 11/12) = 0.39 and (2/12, 10/12) gives
    7 (10/72) / (14/12 + 10/12) = 0.49, against 7/13 = 0.54."""
    coefs = [coefficient(1, 1, 1), coefficient(6, 1, 1)]
    tables = tables_of(coefs, [[1.0, 1.0]], [7], [[0.01, 0.01]])
    # two strategies of 13 GPUs (the rows of one call share the GPUs, as count vectors do)
    fluid, bound = tables.count_bounds([0, 1], np.array([[7, 1], [1, 2]]))
    assert fluid.tolist() == pytest.approx([7 / 13, 7 / 13], rel=1e-12)
    assert bound.tolist() == pytest.approx([7 / 13, 7 / 13], rel=1e-12)  # the area: 7 over 13 GPUs


# --- the fluid ideal counts --------------------------------------------------------------------


def test_ideal_counts_by_hand():
    """Each item on its cheapest scheme (GPU-seconds), pipelines of equal time T: n_s g_s T = G_s
    (the GPU-seconds it gets) and sum g_s n_s = N, so n_s = N G_s / (sum G) / g_s."""
    coefs = [coefficient(2, 1, 1), coefficient(1, 1, 1), coefficient(4, 1, 1)]  # 2, 1 and 4 GPUs
    # rows x schemes; columns [2, 1] are asked for: (4 GPUs, 1 GPU)
    gpu_seconds = [[9.0, 3.0, 1.0], [9.0, 2.0, 5.0], [9.0, 2.0, 7.0]]
    tables = tables_of(coefs, gpu_seconds, [2, 3, 1], np.ones((3, 3)))
    # row 0 (2 items) goes to the 4-GPU scheme at 1, rows 1 (3 items) and 2 (1 item) to the
    # 1-GPU scheme at 2: G = (2, 8), sum 10; on N = 20 GPUs: n = (20 * 2 / 10 / 4, 20 * 8 / 10 / 1)
    counts = tables.ideal_counts([2, 1], 20)
    assert counts == pytest.approx([1.0, 16.0], rel=1e-12)
    # the counts fill the GPUs, and their pipelines take the same time, sum G / N = 0.5
    assert 4 * counts[0] + 1 * counts[1] == pytest.approx(20)
    assert [2 / (counts[0] * 4), 8 / (counts[1] * 1)] == pytest.approx([0.5, 0.5])


def test_ideal_counts_give_nothing_to_a_scheme_no_item_prefers():
    coefs = [coefficient(1, 1, 1), coefficient(2, 1, 1)]
    tables = tables_of(coefs, [[1.0, 3.0], [2.0, 5.0]], [4, 1], np.ones((2, 2)))
    # every item on the 1-GPU scheme: G = (4 + 2, 0); on 12 GPUs, 12 pipelines of it
    assert tables.ideal_counts([0, 1], 12) == pytest.approx([12.0, 0.0], rel=1e-12)


# --- the simplex grid --------------------------------------------------------------------------


def test_the_simplex_grid_holds_every_point_of_a_fine_resolution():
    """Every point with coordinates in multiples of 1/resolution: r + 1 of them in two dimensions,
    for a resolution past the small integers Python caches (an identity test would find none)."""
    grid = simplex_grid(2, 300)
    assert grid.shape == (301, 2)
    assert sorted(grid[:, 0].tolist()) == pytest.approx([k / 300 for k in range(301)])
    np.testing.assert_allclose(grid.sum(axis=1), 1.0)
    three = simplex_grid(3, 4)
    assert len(three) == 15  # (r + 1)(r + 2) / 2 points of the triangle
    assert {tuple(np.rint(point * 4).astype(int)) for point in three} == {
        (i, j, 4 - i - j) for i in range(5) for j in range(5 - i)
    }


@pytest.mark.parametrize("dimension", [1, 2, 3, 5])
def test_every_cached_simplex_grid_is_read_only(dimension):
    # the grids are cached and shared by every caller: a write into one would change later bounds
    grid = simplex_grid(dimension, 12)
    assert np.isclose(grid.sum(axis=1), 1.0).all()
    with pytest.raises(ValueError):
        grid[0, 0] = 0.5
