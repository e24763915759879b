"""Set bounds: coarsened tables stay below the exact ones, the cutoff only drops sets at or above
it, and the memoised sync floors agree with the plain ones."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from synthetic import synthetic_profile, wikipedia_like_batch

from hydraplan.planner.bounds import BoundTables, SyncFloors, sync_lower_bound_s
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.search import runnable_schemes

COST = ProfileCostModel(synthetic_profile(max_gpus=32))
COEFS = runnable_schemes(COST, 32)
LENGTHS = np.array(wikipedia_like_batch(300_000, seed=2))


@pytest.fixture(scope="module")
def tables() -> BoundTables:
    return BoundTables.build(LENGTHS, COEFS)


def test_coarsened_rows_keep_every_token_and_never_straddle_a_capacity(tables):
    coarse = tables.coarsened(1.05)
    assert len(coarse.lengths) < len(tables.lengths) / 2
    # each row's items all fit or all miss each scheme: finite exactly where its longest fits
    capacities = np.array([coef.capacity_tokens for coef in COEFS])
    assert np.array_equal(np.isfinite(coarse.gpu_seconds), coarse.lengths[:, None] <= capacities[None, :])
    # per scheme, the coarse work is a floor under the exact work of the same items, and close
    for column in range(len(COEFS)):
        fits = np.isfinite(tables.work_s[:, column])
        exact = tables.multiplicity[fits] @ tables.work_s[fits, column]
        coarse_column = coarse.work_s[:, column]
        coarse_total = coarse_column[np.isfinite(coarse_column)].sum()
        assert 0.97 * exact <= coarse_total <= exact * (1 + 1e-12)


def test_coarsened_set_bounds_are_valid_and_close(tables):
    exact = dict(tables.all_set_bounds(2, 32))
    coarse = dict(tables.coarsened(1.02).all_set_bounds(2, 32))
    assert exact.keys() == coarse.keys()
    ratios = np.array([coarse[key] / exact[key] for key in exact])
    assert (ratios <= 1 + 1e-12).all()
    assert ratios.min() > 0.98


def test_cutoff_drops_exactly_the_sets_at_or_above_it(tables):
    every = dict(tables.all_set_bounds(3, 32))
    cutoff = float(np.median(list(every.values())))
    below = dict(tables.all_set_bounds(3, 32, cutoff))
    assert below == {key: value for key, value in every.items() if value < cutoff}
    assert 0 < len(below) < len(every)


def test_sync_floors_match_the_plain_floor_and_least_is_below_all():
    floors = SyncFloors(COST, COEFS, 32)
    least = floors.least()
    for columns in itertools.islice(itertools.combinations(range(len(COEFS)), 2), 200):
        value = floors(columns)
        assert value == pytest.approx(sync_lower_bound_s(COST, [COEFS[c] for c in columns], 32))
        assert least <= value + 1e-15


def test_sync_floors_of_extended_sets_match_one_by_one():
    floors = SyncFloors(COST, COEFS, 32)
    children = np.arange(3, len(COEFS))
    for prefix in [(), (0,), (1, 2)]:
        expected = [floors((*prefix, int(child))) for child in children]
        assert floors.extended(prefix, children) == pytest.approx(expected)


def test_sync_floors_of_many_blocks_at_once_match_one_by_one():
    """`extended_blocks` is `extended` of each (prefix, child) in one pass: the same values, with
    the empty prefix, prefixes whose widest shard wins and ones whose child's does."""
    floors = SyncFloors(COST, COEFS, 32)
    prefixes = [(), (0,), (1, 2), (len(COEFS) - 1,), (3, 5)]
    block_of = np.repeat(np.arange(len(prefixes)), len(COEFS) - 6)
    children = np.tile(np.arange(6, len(COEFS)), len(prefixes))
    expected = [floors((*prefixes[block], int(child))) for block, child in zip(block_of, children)]
    assert floors.extended_blocks(prefixes, block_of, children).tolist() == pytest.approx(expected)
    assert len(set(expected)) > 3  # the floors differ across these sets: a mix-up would show


def test_replica_coupled_set_bounds_stay_below_every_plan_of_the_set_and_help_somewhere():
    from hydraplan.planner.schemas import PlanRequest, SolverOptions
    from hydraplan.planner.solve import evaluate_strategy
    from hydraplan.planner.strategies import Strategy, count_vectors

    profile = synthetic_profile(max_gpus=16)
    cost = ProfileCostModel(profile)
    coefs = runnable_schemes(cost, 16)
    lengths = np.array(wikipedia_like_batch(60_000, seed=4))
    tables = BoundTables.build(lengths, coefs)
    floors = SyncFloors(cost, coefs, 16)
    sets = [columns for columns, _ in tables.all_set_bounds(2, 16)]
    rng = np.random.default_rng(0)
    picked = [sets[i] for i in rng.choice(len(sets), size=60, replace=False)]
    plain = np.array([dict(tables.all_set_bounds(2, 16))[columns] + floors(columns) for columns in picked])
    coupled = tables.replica_split_bounds_s(picked, 16, floors)
    assert (coupled >= plain - 1e-12).all()
    assert (coupled > plain * 1.001).any()
    request = PlanRequest(lengths=lengths.tolist(), num_gpus=16, options=SolverOptions(solver="greedy"))
    checked = 0
    for columns, bound in zip(picked, coupled.tolist()):
        schemes = [coefs[column].scheme for column in columns]
        for counts in itertools.islice(count_vectors(schemes, 16), 6):
            strategy = Strategy.of(list(zip(schemes, counts)))
            try:
                plan = evaluate_strategy(request, profile, strategy)
            except ValueError:
                continue  # some sequence fits none of the strategy's pipelines
            assert bound <= plan.step_time_s * (1 + 1e-9), (strategy, bound, plan.step_time_s)
            checked += 1
    assert checked >= 20


def test_dual_feasible_images_of_one_pipelines_items_sum_to_at_most_one():
    """Sizes that fit one pipeline (sum <= 1) keep images that do, including sizes at every
    function's breakpoints, where rounding could otherwise push an image up."""
    from hydraplan.planner.bounds import dual_feasible_images

    breakpoints = [1 / 2, 1 / 3, 1 / 4, 1 / 5, 2 / 3, 3 / 4, 0.3, 0.4, 0.45, 0.55, 0.6, 0.7, 0.8, 0.1]
    groups = [list(c) for k in range(1, 5) for c in itertools.combinations_with_replacement(breakpoints, k)]
    rng = np.random.default_rng(0)
    groups += [list(rng.dirichlet(np.ones(k)) * rng.uniform(0.6, 1.0)) for k in rng.integers(1, 7, size=3000)]
    fitting = [sizes for sizes in groups if sum(sizes) <= 1 + 1e-12]
    assert len(fitting) > 2000
    for sizes in fitting:
        images = dual_feasible_images(np.array(sizes))
        assert (images.sum(axis=1) <= 1 + 1e-9).all(), sizes
    # they do price large items up: two items of 0.6 cannot share a pipeline
    assert dual_feasible_images(np.array([0.6])).max() == 1.0


def test_dual_feasible_images_by_hand():
    """Each function's value at sizes away from its breakpoints: f_eps (Fekete & Schepers) keeps x
    in [eps, 1 - eps], maps larger sizes to 1 and smaller ones to 0; u_k maps x to x where (k+1)x
    is an integer and to floor((k+1)x)/k elsewhere."""
    from hydraplan.planner.bounds import DFF_STEPS, DFF_THRESHOLDS, dual_feasible_images

    sizes = np.array([0.15, 0.35, 0.52, 0.7, 0.9])
    images = dual_feasible_images(sizes)
    assert images.shape == (len(DFF_THRESHOLDS) + len(DFF_STEPS), len(sizes))
    by_eps = dict(zip(DFF_THRESHOLDS, images))
    assert by_eps[0.2].tolist() == [0.0, 0.35, 0.52, 0.7, 1.0]
    assert by_eps[0.4].tolist() == [0.0, 0.0, 0.52, 1.0, 1.0]
    assert by_eps[0.5].tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]
    by_k = dict(zip(DFF_STEPS, images[len(DFF_THRESHOLDS) :]))
    assert by_k[2].tolist() == pytest.approx([0.0, 0.5, 0.5, 1.0, 1.0])  # floor(3x) / 2
    assert by_k[3].tolist() == pytest.approx([0.0, 1 / 3, 2 / 3, 2 / 3, 1.0])  # floor(4x) / 3
    assert by_k[4].tolist() == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])  # floor(5x) / 4
    # where (k+1)x is an integer, u_k(x) is x (less the float slack), not j/k
    assert dual_feasible_images(np.array([0.5]))[len(DFF_THRESHOLDS) + 2] == pytest.approx(0.5, abs=1e-8)


def test_the_big_item_share_is_where_every_function_starts_to_count():
    """Below BIG_ITEM_SHARE every function maps a size to 0 (so smaller items can be left out of
    the packing bound), and just above it one of them does not."""
    from hydraplan.planner.bounds import BIG_ITEM_SHARE, NUM_DFFS, dual_feasible_images

    below = dual_feasible_images(np.array([BIG_ITEM_SHARE * 0.999, BIG_ITEM_SHARE / 2]))
    assert below.shape[0] == NUM_DFFS and (below == 0).all()
    assert dual_feasible_images(np.array([BIG_ITEM_SHARE * 1.001])).max() > 0


def test_simplex_grids_by_hand():
    from hydraplan.planner.bounds import simplex_grid

    assert simplex_grid(1, 5).tolist() == [[1.0]]
    assert sorted(simplex_grid(2, 4).tolist()) == [[0, 1], [0.25, 0.75], [0.5, 0.5], [0.75, 0.25], [1, 0]]
    assert len(simplex_grid(3, 2)) == 6  # (2,0,0) x3 and (1,1,0) x3, over 2
    high = simplex_grid(4, 9)  # corners, centre, pairwise midpoints
    assert len(high) == 4 + 1 + 6 and np.allclose(high.sum(axis=1), 1.0)
    assert [0.25] * 4 in high.tolist() and [0.5, 0.5, 0, 0] in high.tolist()
    assert not simplex_grid(3, 2).flags.writeable


def test_the_fluid_bound_of_one_scheme_by_hand():
    """With one scheme the dual fluid bound is the even split of every item's GPU-seconds over the
    pipelines, per pipeline: (sum of a l^2 + b l + c l / capacity over the items + n (pp - 1) c) / n
    for n pipelines of pp stages (each pipeline's bubble floor counted once)."""
    from hydraplan.planner.cost import SchemeCoefficients
    from hydraplan.planner.scheme import ParallelScheme

    lengths = np.array([100, 250, 250, 900, 1600])
    for tp, pp, n in [(1, 1, 4), (2, 2, 2), (1, 4, 1)]:
        coef = SchemeCoefficients(ParallelScheme(tp, pp, 1), 2e-9, 3e-6, 1e-3, 1 / 3, 2048, 1e9)
        fluid, bound = BoundTables.build(lengths, [coef]).count_bounds([0], np.array([[n]]))
        work = sum(coef.a * length**2 + coef.b * length + coef.c * length / coef.capacity_tokens for length in lengths)
        assert fluid[0] == pytest.approx((work + n * (pp - 1) * coef.c) / n, rel=1e-12)
        assert bound[0] >= fluid[0]


def test_packing_bounds_refuse_coarsened_tables(tables):
    """Coarsened rows merge items, which the packing bound would treat as one indivisible item."""
    coarse = tables.coarsened()
    assert len(coarse.lengths) < len(tables.lengths)
    with pytest.raises(ValueError, match="coarsened"):
        coarse.packing_bounds([0], np.array([[1]]), np.array([1.0]), np.array([2.0]))


def long_documents_on_8_gpus():
    """14 documents of 3,000-9,000 tokens and 10 short ones on 8 GPUs: items large against the
    pipelines, so the packing arguments bite (and more than 12 items: no few-items path)."""
    profile = synthetic_profile(max_gpus=8)
    cost = ProfileCostModel(profile)
    coefs = runnable_schemes(cost, 8)
    rng = np.random.default_rng(7)
    lengths = np.concatenate([rng.integers(3000, 9000, size=14), rng.integers(100, 800, size=10)])
    return profile, cost, coefs, lengths, BoundTables.build(lengths, coefs)


def test_packing_bounds_stay_below_every_plan_and_raise_the_fluid_bound_where_items_are_large():
    """Few, long documents against the pipelines' capacity: the packing argument lifts the count
    bounds of many strategies, and stays at most the slowest pipeline of a plan of each."""
    from hydraplan.planner.schemas import PlanRequest, SolverOptions
    from hydraplan.planner.solve import evaluate_strategy
    from hydraplan.planner.strategies import Strategy, count_vectors

    profile, cost, coefs, lengths, tables = long_documents_on_8_gpus()
    request = PlanRequest(lengths=lengths.tolist(), num_gpus=8, options=SolverOptions(solver="greedy"))
    raised = checked = 0
    for columns in itertools.combinations(range(len(coefs)), 2):
        schemes = [coefs[column].scheme for column in columns]
        for counts in itertools.islice(count_vectors(schemes, 8), 3):
            try:
                plan = evaluate_strategy(request, profile, Strategy.of(list(zip(schemes, counts))))
            except ValueError:
                continue  # some document fits none of the strategy's pipelines
            slowest = max(pipeline.time_s for pipeline in plan.pipelines)
            row = np.array([counts])
            _, start = tables.count_bounds(columns, row)
            packed = tables.packing_bounds(columns, row, start, np.array([2 * slowest]))[0]
            assert start[0] <= packed[0] <= slowest * (1 + 1e-9), (plan.strategy, start[0], packed[0], slowest)
            raised += packed[0] > start[0] * 1.001
            checked += 1
            if checked >= 40:
                break
        if checked >= 40:
            break
    assert checked >= 20 and raised >= 3, (checked, raised)


def test_set_packing_bounds_stay_below_every_plan_of_the_set_and_raise_some():
    """The GPU-weighted packing argument over scheme sets: each raised set bound is at most the
    step time of a plan of every strategy of the set tried, and it lifts some sets."""
    from hydraplan.planner.schemas import PlanRequest, SolverOptions
    from hydraplan.planner.solve import evaluate_strategy
    from hydraplan.planner.strategies import Strategy, count_vectors

    profile, cost, coefs, lengths, tables = long_documents_on_8_gpus()
    floors = SyncFloors(cost, coefs, 8)
    sets, plain = zip(*tables.all_set_bounds(2, 8))
    start = np.array(plain) + np.array([floors(columns) for columns in sets])
    raised = tables.set_packing_bounds_s(list(sets), 8, floors, start, cap_s=100.0)
    assert (raised >= start).all() and (raised > start * 1.001).sum() >= 3
    request = PlanRequest(lengths=lengths.tolist(), num_gpus=8, options=SolverOptions(solver="greedy"))
    checked = 0
    for columns, bound in zip(sets, raised.tolist()):
        schemes = [coefs[column].scheme for column in columns]
        for counts in itertools.islice(count_vectors(schemes, 8), 3):
            try:
                plan = evaluate_strategy(request, profile, Strategy.of(list(zip(schemes, counts))))
            except ValueError:
                continue  # some document fits none of the strategy's pipelines
            assert bound <= plan.step_time_s * (1 + 1e-9), (plan.strategy, bound, plan.step_time_s)
            checked += 1
    assert checked >= 20, checked
