"""`BoundTables.set_packing_bounds_s` and its dual feasible functions pinned by hand on tiny
instances (the one tightness pin of `tests/test_bound_values.py` aside): which function holds the
bound, the grid of step times it is tried on, the incumbent, the sync floors, the stop request and
the table size it is limited to. Expected values are worked out here from the docstrings: the
optimum by brute force over the assignments of the items, the grid from its documented step and
size, the images from the definitions of f_eps and u_k."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from hydraplan.planner.bounds import BoundTables, dual_feasible_images
from hydraplan.planner.cost import SchemeCoefficients
from hydraplan.planner.scheme import ParallelScheme

C = 0.01  # per micro-batch overhead; pp 1: a pipeline of work W ends at W + c, no bubble


def scheme(tp: int, b: float = 1e-4, c: float = C, capacity: int = 10_000) -> SchemeCoefficients:
    return SchemeCoefficients(ParallelScheme(tp, 1), a=0.0, b=b, c=c, fwd_fraction=1 / 3,
                              capacity_tokens=capacity, grad_bytes_per_gpu=1e9)  # fmt: skip


ONE, TWO = scheme(1), scheme(2)  # one GPU a pipeline; two GPUs a pipeline (g = 2)
# works 0.22, 0.38 and 0.40 s: on two pipelines the best split is {0.40}, {0.22, 0.38}
THREE = np.array([2_200, 3_800, 4_000])


class Syncs:
    """A sync floor per set, given by hand (the bound adds it to the pipelines' time)."""

    def __init__(self, by_set: dict[tuple[int, ...], float]) -> None:
        self.by_set = by_set

    def __call__(self, columns) -> float:
        return self.by_set[tuple(columns)]


def best_split_s(works: list[float], pipelines: int) -> float:
    """Brute force: the least time of the slowest of `pipelines` pipelines of pp 1 (W + c each)."""
    best = math.inf
    for owner in itertools.product(range(pipelines), repeat=len(works)):
        loads = [sum(w for w, o in zip(works, owner) if o == p) for p in range(pipelines)]
        best = min(best, max(load + C for load in loads if load > 0))
    return best


def grid(low: float, high: float) -> list[float]:
    """The documented grid of step times: geometric from `low` (left out) up to `high` (included),
    consecutive points at most SET_PACKING_STEP = 0.3% apart (ceil(log r / log 1.003) steps, plus
    one), at most SET_PACKING_POINTS = 64 points."""
    steps = min(64, math.ceil(math.log(high / low) / math.log1p(0.003)) + 1)
    return [low * (high / low) ** (j / steps) for j in range(1, steps + 1)]


def largest_below(points: list[float], threshold: float) -> float:
    below = [t for t in points if t < threshold]
    # the pin below needs no point within float noise of the threshold
    assert all(abs(t - threshold) > 1e-6 for t in points)
    return max(below)


# On two pipelines of TWO (4 GPUs), the pipelines need T - c >= 0.60 (T >= 0.61): with room
# s = T - c < 0.60 the sizes are 0.40/s > 2/3, 0.38/s and 0.22/s in [1/3, 2/3], so under f_1/3
# their images sum to 1 + 0.60/s > 2 pipelines. No other function sees that far: f_0.3 counts
# 0.40/s as 1 only below s = 0.40/0.7 = 0.571 (else the images are the sizes, 1.0/s < 2);
# f_0.4, f_0.45, f_0.5 count 0.40/s and 0.38/s as 1 but 0.22/s < 0.4 as 0 (2, not over 2) for
# s > 0.55; u_2 gives 1/2 + 1/2 + 1, u_3 2/3 + 2/3 + 1/3, u_4 3/4 + 3/4 + 1/4 on s in
# [0.571, 0.60); f_0.2, f_0.25 and the identity give 1.0/s < 2. So without f_1/3 the bound stays
# at 0.571 + c.
T_STAR = 0.61
OTHERS = 0.40 / 0.7 + C


def test_f_one_third_alone_reaches_the_optimum_on_the_documented_grid():
    assert best_split_s([0.22, 0.38, 0.40], 2) == pytest.approx(T_STAR)
    tables = BoundTables.build(THREE, [TWO])
    sync = 0.05
    floors = Syncs({(0,): sync})
    # start 0.45, a valid bound (the area bound is about 0.5); T* is under twice the start
    low, high = 0.45, 0.70
    raised = tables.set_packing_bounds_s([(0,)], 4, floors, np.array([low + sync]), cap_s=high + sync)
    # 0.70 / 0.45 needs 148 steps of 0.3%: the grid has its 64 points, the bound the last below T*
    expected = largest_below(grid(low, high), T_STAR) + sync
    assert expected > OTHERS + sync + 0.02
    assert raised[0] == pytest.approx(expected, rel=1e-12)
    assert raised[0] <= T_STAR + sync  # valid: the split {0.40}, {0.22, 0.38} ends at T*


def test_on_a_short_grid_the_bound_is_its_last_point_below_the_optimum():
    # 0.64 / 0.59 takes ceil(27.2) + 1 = 29 steps, fewer than 64: the points are under 0.3% apart
    tables = BoundTables.build(THREE, [TWO])
    sync = 0.03
    low, high = 0.59, 0.64
    raised = tables.set_packing_bounds_s([(0,)], 4, Syncs({(0,): sync}), np.array([low + sync]), cap_s=high + sync)
    points = grid(low, high)
    assert len(points) == 29 and (high / low) ** (1 / 29) < 1.003
    assert raised[0] == pytest.approx(largest_below(points, T_STAR) + sync, rel=1e-12)


def test_a_set_that_cannot_beat_the_incumbent_is_raised_to_it_exactly():
    # the incumbent 0.60 + sync (another set's plan) is below this set's optimum 0.61 + sync: every
    # grid point up to the last, cap - sync itself, is violated, and the bound is the incumbent
    tables = BoundTables.build(THREE, [TWO])
    sync = 0.05
    cap = 0.60 + sync
    raised = tables.set_packing_bounds_s([(0,)], 4, Syncs({(0,): sync}), np.array([0.45 + sync]), cap_s=cap)
    assert raised[0] == pytest.approx(cap, rel=1e-12)


def test_each_set_keeps_its_own_sync_floor_and_a_set_at_its_optimum_stays():
    # columns: 0 = ONE (four pipelines on 4 GPUs), 1 = TWO (two pipelines). The set (1,) is the
    # three-item instance above (its own sync 0.02, the least); the set (0,) runs every item alone
    # and ends at 0.40 + c, its start: nothing raises it (an item of size 1 at most per pipeline:
    # images at most 3 under every function, on 4 GPUs), whatever the grid above it.
    assert best_split_s([0.22, 0.38, 0.40], 4) == pytest.approx(0.41)
    tables = BoundTables.build(THREE, [ONE, TWO])
    syncs = {(1,): 0.02, (0,): 0.05}
    start = np.array([0.45 + 0.02, 0.41 + 0.05])
    cap = 0.70 + 0.02
    raised = tables.set_packing_bounds_s([(1,), (0,)], 4, Syncs(syncs), start, cap_s=cap)
    # the grid runs from the least start less its sync (0.41) to the cap less the least sync
    expected = largest_below(grid(0.41, 0.70), T_STAR) + 0.02
    assert raised[0] == pytest.approx(expected, rel=1e-12)
    assert raised[1] == start[1]


def test_a_stop_request_keeps_the_first_chunk_of_grid_points():
    # asked between chunks of SET_PACKING_CHUNK_POINTS = 8 points: stopping at the first question
    # leaves the first 8 points tried, all below T* (so all violated): the bound is the 8th point
    tables = BoundTables.build(THREE, [TWO])
    sync = 0.05
    low, high = 0.45, 0.70
    asked = []

    def stop() -> bool:
        asked.append(True)
        return True

    raised = tables.set_packing_bounds_s(
        [(0,)], 4, Syncs({(0,): sync}), np.array([low + sync]), cap_s=high + sync, should_stop=stop
    )
    points = grid(low, high)
    assert points[7] < T_STAR
    assert raised[0] == pytest.approx(points[7] + sync, rel=1e-12)
    assert len(asked) == 1


# 16 items of work 1/16 s on one pipeline of two GPUs (2 GPUs in all), c = 1/128: binary
# fractions, so the pipeline ending at exactly 1 + c holds them all without rounding
EXACT = scheme(2, b=2.0**-14, c=2.0**-7, capacity=20_000)


def test_the_identity_holds_small_items_and_a_tight_incumbent_is_not_proved_infeasible():
    # the items are small (1/16 under a fifth of the room 0.49 at the start), so only the identity
    # prices them: 2 GPUs * 16 * (1/16) / (T - c) > 2 GPUs until T = 1 + c, the optimum (one
    # pipeline, one micro-batch). The incumbent is that optimum: at its T the GPUs used are
    # exactly 2, not more, so the top of the grid is not violated and the bound is the point
    # below it, one grid step (0.5 * 2.0156^(63/64)) under the incumbent
    tables = BoundTables.build(np.full(16, 1_024), [EXACT])
    optimum = 1.0 + 2.0**-7
    raised = tables.set_packing_bounds_s([(0,)], 2, Syncs({(0,): 0.0}), np.array([0.5]), cap_s=optimum)
    below = 0.5 * (optimum / 0.5) ** (63 / 64)
    assert raised[0] < optimum
    assert raised[0] == pytest.approx(below, rel=1e-12)


# 3 large items and many tiny ones (works of 1e-6 s a token): the tiny ones are under a third of
# the room and f_1/3 prices them 0, so the bound is the three-item one, 0.61 (the tiny ones go
# with the 0.40 item: 0.48 + c). The set-packing bound runs on tables of up to 400 lengths only.
FINE = scheme(1, b=1e-6, capacity=1_000_000)


def many_lengths(count: int) -> np.ndarray:
    return np.concatenate([np.arange(1, count - 2), [220_000, 380_000, 400_000]])


def test_the_bound_runs_on_400_lengths_and_leaves_401_as_they_are():
    sync = 0.05
    start = np.array([0.45 + sync])
    for count, raises in ((400, True), (401, False)):
        tables = BoundTables.build(many_lengths(count), [FINE])
        assert len(tables.lengths) == count
        raised = tables.set_packing_bounds_s([(0,)], 2, Syncs({(0,): sync}), start, cap_s=0.70 + sync)
        if raises:
            assert 0.60 + sync < raised[0] <= T_STAR + sync
        else:
            assert raised[0] == start[0]


@pytest.mark.parametrize(
    ("start", "cap"),
    [(0.05, 0.70), (0.03, 0.70), (0.45, math.inf)],
    ids=["start at the sync floor", "start below the sync floor", "no incumbent"],
)
def test_nothing_to_raise_leaves_the_start(start, cap):
    # a start at or below the sync floor leaves no positive pipeline time to grid from, and an
    # infinite incumbent no top of the grid: the starts stand as they are
    tables = BoundTables.build(THREE, [TWO])
    raised = tables.set_packing_bounds_s([(0,)], 4, Syncs({(0,): 0.05}), np.array([start]), cap_s=cap)
    assert raised.tolist() == [start]


def f_eps(x: float, eps: float) -> float:
    return 1.0 if x > 1 - eps else (x if x >= eps else 0.0)


def u_k(x: float, k: int) -> float:
    scaled = (k + 1) * x
    return x if scaled == round(scaled) else math.floor(scaled) / k


# the functions in the order of `dual_feasible_images` (DFF_THRESHOLDS, then DFF_STEPS)
FUNCTIONS = [lambda x, e=e: f_eps(x, e) for e in (0.2, 0.25, 0.3, 1 / 3, 0.4, 0.45, 0.5)]
FUNCTIONS += [lambda x, k=k: u_k(x, k) for k in (2, 3, 4)]


def test_dual_feasible_images_stay_below_the_functions_under_rounding_and_close_to_them():
    # a computed size may be off by float noise, so an image must not exceed the function at any
    # size within FLOAT_SLACK = 1e-9 (up to that distance: f_eps is the size itself on its middle
    # part), and it is no weaker than the function a little further below. The sizes: the
    # breakpoints of every function (eps, 1 - eps, j / (k + 1)) and points between them
    breaks = [0.2, 0.25, 0.3, 1 / 3, 0.4, 0.45, 0.5, 0.55, 0.6, 2 / 3, 0.7, 0.75, 0.8]
    breaks += [j / (k + 1) for k in (2, 3, 4) for j in range(k + 2)]
    sizes = np.array(sorted({0.0, 1.0, 0.1, 0.35, 0.62, 0.9, 0.97, *breaks}))
    images = dual_feasible_images(sizes)
    assert images.shape == (10, len(sizes))
    near, far = 0.5e-9, 3e-9
    for row, f in enumerate(FUNCTIONS):
        for x, image in zip(sizes.tolist(), images[row].tolist()):
            around = [f(min(1.0, max(0.0, x + d))) + abs(d) for d in (-near, 0.0, near)]
            assert image <= min(around) + 1e-15, (row, x)
            assert image >= f(max(0.0, x - far)) - far, (row, x)
