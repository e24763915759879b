"""The verifier's costlier bound kinds (`planner.verify_bound`), each against its definition and a
brute force: the LP bubble floors hold for every run and are the tabulated ones, the floors built
on them invert, the dual feasible functions keep sums at most 1, and the packing, replica-split
and set-packing bounds never prove a time at or above the brute-forced optimum (a claim raised
there fails), while they do prove what the fluid bounds cannot."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from importlib import resources

import numpy as np
import pytest
from test_exhaustive import random_instance
from test_verify_bound_parts import columns_of

from hydraplan.planner import reference
from hydraplan.planner import verify_bound as vb
from hydraplan.planner.schemas import PlanRequest, SolverOptions
from hydraplan.planner.solve import solve

ABOVE = 1 + 1e-9  # a claim this far above the optimum must not be proved


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_the_lp_bubble_floor_holds_for_every_run_and_is_the_tabulated_one(stages: int) -> None:
    """rho_m is below the exact 1F1B time of random runs (and of runs ramping up), at least the
    path floor, and equal (within the table's rounding) to the solver's table, derived apart."""
    rng = np.random.default_rng(stages)
    table = json.loads(resources.files("hydraplan.planner").joinpath("data", "bubble_floors.json").read_text())
    tabulated = next(e["floors"] for e in table["entries"] if e["pp"] == stages)
    for count in range(1, 7):
        rho = vb.least_bubble(stages, count, 1 / 3)
        assert rho >= (stages - 1) / 3 / count - 1e-6
        assert abs(rho - tabulated[count - 1]) <= 2e-7, (stages, count)
        runs = [rng.gamma(0.5, 1.0, size=count) + 1e-3 for _ in range(40)]
        runs.append(np.minimum(np.arange(1, count + 1), np.arange(count, 0, -1)).astype(float))
        for times in runs:
            exact = reference.pipeline_time_s(times.tolist(), stages, 1 / 3)
            assert exact >= (1 + rho) * times.sum() * (1 - 1e-12)
    with pytest.raises(ValueError, match="schedule"):
        vb.least_bubble(stages, 2, 1 / 3, schedule="interleaved")


def test_the_lp_floors_invert_and_stay_under_the_exact_pipeline_time() -> None:
    """G(T) inverts g(W) with the LP floors, capped or not; they are at least the path floors;
    and a pipeline's floor over at most its items' count is below its exact least time."""
    rng = np.random.default_rng(3)
    for case in range(4):
        profile, lengths, _ = random_instance(case)
        columns = columns_of(profile)
        for column in range(len(columns.schemes)):
            for cap in (None, 1, 3, 200):
                for time_s in (0.01, 0.05, 0.3):
                    most = float(vb._room_s(columns, column, time_s, cap, True))
                    assert most <= float(vb._room_s(columns, column, time_s, cap, False)) * (1 + 1e-12) + 1e-15
                    if most > 0:
                        reached = float(vb._pipeline_floor_of_work_s(columns, column, most, cap, True))
                        assert reached == pytest.approx(time_s, rel=1e-9)
            block = [float(x) for x in rng.choice(lengths, size=min(4, len(lengths)), replace=False)]
            if max(block) > columns.capacity[column]:
                continue
            exact = vb._least_pipeline_s(columns, column, block)
            work = sum(float(columns.a[column]) * x * x + float(columns.b[column]) * x for x in block)
            floor = float(vb._pipeline_floor_of_work_s(columns, column, work, len(block), True))
            assert floor <= exact * (1 + 1e-12)
            assert vb._pipeline_floor_s(columns, column, block) <= exact * (1 + 1e-12)


def test_the_dual_feasible_functions_keep_sums_at_most_one() -> None:
    rng = np.random.default_rng(5)
    for _ in range(300):
        parts = rng.dirichlet(np.full(int(rng.integers(1, 6)), 0.7)) * rng.uniform(0.5, 1.0)
        images = vb._dual_feasible_images(parts)
        assert (images.sum(axis=1) <= 1 + 1e-12).all(), parts
    grid = np.linspace(0, 1, 2001)
    images = vb._dual_feasible_images(grid)
    assert (np.diff(images, axis=1) >= -1e-12).all()  # non-decreasing: shrinking a size never overstates


def exact_pipeline_s(columns, lengths, combo, counts) -> float:
    """The least slowest-pipeline time of a strategy over every assignment (every block of at most
    six items timed exactly over its ordered packings): the brute-forced optimum."""
    assert len(lengths) <= vb.EXACT_BLOCK_ITEMS
    return vb._assignment_bound_s(columns, np.asarray(lengths, dtype=float), combo, counts)


def test_the_packing_proves_what_the_fluid_dual_cannot() -> None:
    """Three equal items on two one-stage pipelines: two must share one, so the pipelines need the
    time of two items. The packing bound (and the set packing, for the set of that scheme on two
    GPUs) proves just under it; not at it (a claim there fails)."""
    profile, _, _ = random_instance(0)
    columns = columns_of(profile)
    column = next(c for c in range(len(columns.schemes)) if columns.stages[c] == 1 and columns.gpus[c] == 1)
    length = float(columns.capacity[column]) / 2
    lengths = np.array([length] * 3)
    tables = vb._tables(lengths, columns)
    combo, counts = [column], np.array([[2.0]])
    optimum = exact_pipeline_s(columns, lengths, combo, [2])
    grid = vb._multiplier_grid(columns.gpus[combo], [])
    fluid = vb._strategy_bounds_s(profile, columns, tables, combo, counts, 2) - vb._sync_s(profile, columns, combo, 2)
    assert fluid[0] < 0.9 * optimum
    caps = [2]
    assert vb._packing_infeasible(columns, tables, combo, grid, counts[0] @ grid.T, optimum * 0.999, caps, True)
    assert not vb._packing_infeasible(columns, tables, combo, grid, counts[0] @ grid.T, optimum * ABOVE, caps, True)
    raised = vb._raised_strategy_bounds_s(columns, tables, combo, counts, fluid, grid, np.array([optimum * 0.999]))
    assert raised[0] == pytest.approx(optimum * 0.999)
    above = vb._raised_strategy_bounds_s(columns, tables, combo, counts, fluid, grid, np.array([optimum * ABOVE]))
    assert above[0] <= optimum * ABOVE
    # the set {s} on two GPUs: the same argument weighted by GPUs (set packing)
    sync = vb._sync_s(profile, columns, combo, vb._fewest_replicas(columns, combo, 2))
    tally: dict[str, int] = {}
    aim = optimum * 0.999 + sync
    assert vb._raised_set_bound_s(profile, columns, tables, combo, 2, None, aim, tally) == pytest.approx(aim)
    assert tally == {"set: set packing": 1}
    assert (
        vb._raised_set_bound_s(profile, columns, tables, combo, 2, None, (optimum + sync) * ABOVE)
        < (optimum + sync) * ABOVE
    )


def scaled_instance(case: int, scale: float):
    """`random_instance(case)` with every time multiplied by `scale` (stage-time coefficients, and
    the sync through the bandwidth): its optima scale exactly, and at scale 1000 times are seconds
    to tens of seconds, where a product of two times is no longer below their sum."""
    profile, lengths, num_gpus = random_instance(case)
    schemes = [e.model_copy(update={"a": e.a * scale, "b": e.b * scale, "c": e.c * scale}) for e in profile.schemes]
    bandwidth = profile.grad_sync_bandwidth_bytes_per_s / scale
    return (
        profile.model_copy(update={"schemes": schemes, "grad_sync_bandwidth_bytes_per_s": bandwidth}),
        lengths,
        num_gpus,
    )


@pytest.mark.parametrize(("case", "scale"), [*((case, 1.0) for case in range(6)), (0, 1000.0), (3, 1000.0)])
def test_the_costlier_bounds_never_prove_a_time_above_the_brute_forced_optimum(case: int, scale: float) -> None:
    """Every strategy of at most two schemes of a tiny instance: the strategy bounds raised at a
    claim just above the strategy's optimum (bubble dual with LP floors, packing, assignment) stay
    at or below it; and each set's raised bound (LP-priced area, replica split, set packing), with
    or without a pricing cap, stays at or below the best of its strategies. Also with times in
    seconds (`scaled_instance`)."""
    profile, lengths, num_gpus = scaled_instance(case, scale)
    lengths = lengths[: vb.EXACT_BLOCK_ITEMS]
    columns = columns_of(profile)
    tables = vb._tables(np.asarray(lengths, dtype=float), columns)
    for width in (1, 2):
        for combo in itertools.combinations(range(len(columns.schemes)), width):
            sizes = [int(columns.gpus[c]) for c in combo]
            vectors = vb._count_vectors(sizes, num_gpus, 1000) or []
            best = np.inf
            for counts in vectors:
                if sum(counts) > len(lengths):
                    continue
                optimum = exact_pipeline_s(columns, lengths, list(combo), list(counts))
                if not np.isfinite(optimum):
                    continue
                sync = vb._sync_s(profile, columns, combo, int(np.dot(counts, columns.cp[list(combo)])))
                best = min(best, optimum + sync)
                grid = vb._multiplier_grid(columns.gpus[list(combo)], [])
                row = np.array([counts], dtype=float)
                raised = vb._raised_strategy_bounds_s(
                    columns, tables, combo, row, np.zeros(1), grid, np.array([optimum * ABOVE])
                )
                assert raised[0] <= optimum * ABOVE, (case, combo, counts)
                total = vb._strategy_bounds_s(
                    profile, columns, tables, combo, row, num_gpus, target_s=(optimum + sync) * ABOVE
                )
                assert total[0] <= (optimum + sync) * ABOVE, (case, combo, counts)
            if not np.isfinite(best):
                continue
            for cap_s in (None, best * 1.5, best * 0.8):
                bound = vb._raised_set_bound_s(profile, columns, tables, combo, num_gpus, cap_s, best * ABOVE)
                assert bound <= best * ABOVE, (case, combo, cap_s)


def test_the_dual_feasible_functions_are_the_published_ones() -> None:
    """f_eps and u_k at known points (sizes shrunk by SIZE_SHRINK first: exact thresholds round
    down): u_2(0.3) = floor(0.9) / 2 = 0, u_2(0.7) = floor(2.1) / 2 = 1, u_3(0.55) = 2/3."""
    images = vb._dual_feasible_images(np.array([0.1, 0.3, 0.55, 0.7]))
    assert images.shape == (1 + len(vb.DFF_THRESHOLDS) + len(vb.DFF_STEPS), 4)
    assert images[0] == pytest.approx([0.1, 0.3, 0.55, 0.7])  # the identity
    f_third = images[1 + vb.DFF_THRESHOLDS.index(1 / 3)]
    assert f_third == pytest.approx([0.0, 0.0, 0.55, 1.0])
    u_2, u_3 = images[1 + len(vb.DFF_THRESHOLDS)], images[2 + len(vb.DFF_THRESHOLDS)]
    assert u_2 == pytest.approx([0.0, 0.0, 0.5, 1.0])
    assert u_3 == pytest.approx([0.0, 1 / 3, 2 / 3, 2 / 3])


@pytest.mark.parametrize(("case", "combo"), [(0, (0, 2)), (11, (0, 1)), (16, (0, 2)), (29, (0, 3))])
def test_the_replica_split_lifts_a_set_and_stays_under_its_optimum(case: int, combo: tuple[int, int]) -> None:
    """Sets whose cheap schemes carry many weight replicas: the split of the strategies by their
    replicas lifts the set's bound above area + the fewest replicas' sync, and not above the best
    of its strategies (brute-forced); at that lifted value the tally names the split."""
    profile, lengths, num_gpus = random_instance(case)
    lengths = lengths[: vb.EXACT_BLOCK_ITEMS]
    columns = columns_of(profile)
    tables = vb._tables(np.asarray(lengths, dtype=float), columns)
    sync = vb._sync_s(profile, columns, combo, vb._fewest_replicas(columns, combo, num_gpus))
    cheap = vb._set_bounds_s(tables, columns, np.array([combo]), num_gpus, None)[0, 0] + sync
    raised = vb._raised_set_bound_s(profile, columns, tables, combo, num_gpus, None, math.inf)
    best = math.inf
    for counts in vb._count_vectors([int(columns.gpus[c]) for c in combo], num_gpus, 1000):
        if sum(counts) <= len(lengths):
            replicas = int(np.dot(counts, columns.cp[list(combo)]))
            best = min(
                best,
                exact_pipeline_s(columns, lengths, list(combo), list(counts))
                + vb._sync_s(profile, columns, combo, replicas),
            )
    assert cheap * 1.01 < raised <= best * ABOVE, (cheap, raised, best)
    tally: dict[str, int] = {}
    vb._raised_set_bound_s(profile, columns, tables, combo, num_gpus, None, raised, tally)
    assert tally == {"set: replica split": 1}


def test_the_replica_split_stays_under_a_set_whose_best_strategy_has_more_replicas() -> None:
    """A set whose fastest strategy carries more weight replicas than the fewest its GPUs allow
    (here its only strategy): the split's first threshold (fewest + 1) must keep its "this many or
    more replicas" side, or the bound of strategies with at most the fewest replicas (here none, and
    above the optimum) would be claimed."""
    case, combo = 31, (0, 3)
    profile, lengths, num_gpus = random_instance(case)
    lengths = lengths[: vb.EXACT_BLOCK_ITEMS]
    columns = columns_of(profile)
    tables = vb._tables(np.asarray(lengths, dtype=float), columns)
    fewest = vb._fewest_replicas(columns, combo, num_gpus)
    timed = []
    for counts in vb._count_vectors([int(columns.gpus[c]) for c in combo], num_gpus, 1000):
        if sum(counts) <= len(lengths):
            replicas = int(np.dot(counts, columns.cp[list(combo)]))
            step = exact_pipeline_s(columns, lengths, list(combo), list(counts))
            timed.append((step + vb._sync_s(profile, columns, combo, replicas), replicas))
    best, replicas = min(timed)
    assert replicas >= fewest + 1  # what makes the case: the optimum is on the first threshold's "more" side
    assert vb._raised_set_bound_s(profile, columns, tables, combo, num_gpus, None, math.inf) <= best * ABOVE


def test_the_replica_split_keeps_the_many_replicas_side_of_every_threshold() -> None:
    """Seven GPUs, `<1,1,1>` and a `<3,1,1>` that is no faster (three times the GPU cost), 60 equal
    items: the set's strategies are `4x<1,1,1> + 1x<3,1,1>` (5 weight replicas) and `1x<1,1,1> +
    2x<3,1,1>` (3, the fewest). The first is faster; the split's bound over strategies with fewer
    replicas than a threshold (4 or 5) lies above it, so each threshold must keep its "this many or
    more" side: the set's bound stays under a plan of the fast strategy (a feasible time)."""
    base, _, _ = random_instance(0)
    single = next(e for e in base.schemes if (e.tp, e.pp, e.cp) == (1, 1, 1))
    profile = base.model_copy(update={"schemes": [single, single.model_copy(update={"tp": 3})]})
    lengths, num_gpus, combo = [600] * 60, 7, (0, 1)
    columns = columns_of(profile)
    tables = vb._tables(np.asarray(lengths, dtype=float), columns)
    assert vb._fewest_replicas(columns, combo, num_gpus) == 3
    options = SolverOptions(strategy_pool=["4x<1,1,1> + 1x<3,1,1>"], time_limit_s=30)
    plan = solve(PlanRequest(lengths=lengths, num_gpus=num_gpus, gpus_per_node=8, options=options), profile)
    raised = vb._raised_set_bound_s(profile, columns, tables, combo, num_gpus, None, math.inf)
    assert raised <= plan.objective_s
    cheap = vb._set_bounds_s(tables, columns, np.array([combo]), num_gpus, None)[0, 0]
    assert raised > cheap + vb._sync_s(profile, columns, combo, 3)  # the split lifts the set's bound


def test_the_assignment_bound_takes_an_item_exactly_at_a_capacity() -> None:
    """An item of exactly a scheme's capacity fits it: the search must try that pipeline (the
    only one it fits), not claim no assignment."""
    profile, _, _ = random_instance(0)
    columns = columns_of(profile)
    column = next(c for c in range(len(columns.schemes)) if columns.stages[c] == 1)
    items = np.array([float(columns.capacity[column]), 100.0])
    bound = vb._assignment_bound_s(columns, items, [column], [2])
    expected = max(vb._least_pipeline_s(columns, column, [items[0]]), vb._least_pipeline_s(columns, column, [100.0]))
    assert bound == pytest.approx(expected, rel=1e-12)


def test_the_floor_over_many_micro_batches_is_no_higher_than_its_definition() -> None:
    """Counts above LP_MICRO_BATCHES are priced in ranges: at every work W, g(W) stays at most the
    definitional floor minimised over the count, `min_m max((1 + kappa / m)(W + m c),
    W + (m + pp - 1) c)` (each range and the last piece price below every count they cover), and at
    least `W + pp c`. Swept over works whose best count runs from 2 to 100,000 micro-batches, and
    where the two terms cross just past LP_MICRO_BATCHES, on deep pipelines too (a range's
    `W + (a + pp - 1) c` term is what binds there)."""
    profile, _, _ = random_instance(0)
    columns = columns_of(profile)
    column = next(c for c in range(len(columns.schemes)) if columns.stages[c] > 1)
    counts = np.arange(1.0, 150001.0)
    for stages, fwd in itertools.product((3, 4, 8), (1 / 3, 0.1, 0.499)):  # 0.499: a path floor near 0
        deep = dataclasses.replace(
            columns,
            stages=np.full(len(columns.schemes), float(stages)),
            fwd=np.full(len(columns.schemes), fwd),
        )
        c, kappa = float(deep.c[column]), vb._path_kappa(deep, column)
        # works where the path term is least at `best_count`, and where it crosses the fill-and-drain
        # term `W + (m + pp - 1) c` at m = 60..70 (the first ranges past LP_MICRO_BATCHES)
        least = [count * count * c / kappa for count in np.unique(np.geomspace(2, 100000, 80).astype(int))]
        crossing = [m * (stages - 1 - kappa) * c / kappa for m in range(60, 71)] if stages - 1 > kappa else []
        for work in [*least, *crossing]:
            definition = np.maximum((1 + kappa / counts) * (work + counts * c), work + (counts + stages - 1) * c).min()
            floor = float(vb._pipeline_floor_of_work_s(deep, column, work))
            assert work + stages * c <= floor <= definition * (1 + 1e-12), (stages, fwd, work)


@pytest.mark.parametrize("num_items", [65, 100, 300])
def test_a_block_of_many_items_is_floored_under_its_one_item_micro_batches(num_items: int) -> None:
    """A pipeline holding more items than LP_MICRO_BATCHES (a large block of the assignment bound),
    each item a whole micro-batch (its length is the capacity): the floor stays at most the exact
    1F1B time of that only packing, the counts above LP_MICRO_BATCHES priced by the path floor
    k / m alone (the LP's rho_m for m <= 64 is no floor for more micro-batches)."""
    profile, _, _ = random_instance(0)
    columns = columns_of(profile)
    column = next(c for c in range(len(columns.schemes)) if columns.stages[c] > 1)
    for stages, fwd in itertools.product((2, 4, 8), (0.1, 1 / 3)):
        deep = dataclasses.replace(
            columns,
            stages=np.full(len(columns.schemes), float(stages)),
            fwd=np.full(len(columns.schemes), fwd),
        )
        length = float(deep.capacity[column])
        item_s = float(deep.a[column]) * length * length + float(deep.b[column]) * length + float(deep.c[column])
        exact = reference.pipeline_time_s([item_s] * num_items, stages, fwd)
        floor = vb._pipeline_floor_s(deep, column, [length] * num_items)
        assert num_items * item_s + (stages - 1) * float(deep.c[column]) <= floor <= exact * (1 + 1e-12), (stages, fwd)


@pytest.mark.parametrize("num_items", [4, 8, 12])
def test_an_interleaved_block_is_floored_under_its_one_item_micro_batches(num_items: int) -> None:
    """An interleaved pipeline (v = 2) holding a block the assignment bound does not time exactly:
    each item a whole micro-batch (its length is the capacity), a multiple of pp of them, so that
    packing is the only one; its fill-and-drain floor over the counts that are multiples of pp
    stays at most the exact interleaved 1F1B time of that packing, and at least its work."""
    profile, _, _ = random_instance(0)
    columns = columns_of(profile)
    column = next(c for c in range(len(columns.schemes)) if columns.stages[c] > 1)
    for stages, fwd in itertools.product((2, 4), (0.1, 1 / 3)):
        interleaved = dataclasses.replace(
            columns,
            stages=np.full(len(columns.schemes), float(stages)),
            fwd=np.full(len(columns.schemes), fwd),
            chunks=np.full(len(columns.schemes), 2.0),
        )
        length = float(interleaved.capacity[column])
        item_s = (
            float(interleaved.a[column]) * length * length
            + float(interleaved.b[column]) * length
            + float(interleaved.c[column])
        )
        exact = reference.interleaved_pipeline_time_s([item_s] * num_items, stages, 2, fwd, stages)
        floor = vb._pipeline_floor_s(interleaved, column, [length] * num_items)
        assert num_items * item_s <= floor <= exact * (1 + 1e-12), (stages, fwd)
