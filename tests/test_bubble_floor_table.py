"""The bubble-floor table and the floors built on it, pinned down exactly: regenerating the table
reproduces the committed one, every stage count the bundled models allow is in it, and the pipeline
floor equals a direct minimum over micro-batch counts wherever the two must agree.

`tests/test_bubble_floor.py` proves the floors valid (never above a simulated makespan); these tests
fail when a floor is valid but wrong (too low, a term dropped, a range mispriced), which validity
tests cannot see.
"""

from __future__ import annotations

import json
import runpy
import sys
from importlib import resources

import numpy as np
import pytest

from hydraplan.cost_models.catalog import load_models
from hydraplan.planner.bubble_floor import (
    MAX_CAPPED_MICRO_BATCHES,
    MAX_MICRO_BATCHES,
    MAX_PRICED_MICRO_BATCHES,
    SAFETY,
    TABLE_FILE,
    TABLE_SCHEMA,
    TABULATED_FWD_FRACTION,
    TABULATED_STAGE_COUNTS,
    build_table,
    largest_micro_batch_floor_s,
    most_work_s,
    parse_table,
    pipeline_time_floor_s,
    ramp_shape,
    solve_floor_lp,
    tabulated_floors,
)
from hydraplan.planner.cost import SchemeCoefficients
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.simulate import simulate_1f1b

THIRD = 1 / 3


def _committed() -> dict:
    return json.loads(resources.files("hydraplan.planner").joinpath("data", TABLE_FILE).read_text())


def _coef(pp: int, fwd_fraction: float = THIRD, c: float = 1e-3) -> SchemeCoefficients:
    return SchemeCoefficients(ParallelScheme(1, pp, 1), 0.0, 1.0, c, fwd_fraction, 10_000, 1.0)


def test_every_stage_count_the_bundled_models_allow_is_tabulated():
    committed = _committed()
    assert committed["schema"] == TABLE_SCHEMA and committed["max_micro_batches"] == MAX_MICRO_BATCHES
    assert [entry["pp"] for entry in committed["entries"]] == list(TABULATED_STAGE_COUNTS)
    for entry in committed["entries"]:
        assert entry["fwd_fraction"] == TABULATED_FWD_FRACTION
        assert len(entry["floors"]) == len(entry["shapes"]) == MAX_MICRO_BATCHES
        assert [len(shape) for shape in entry["shapes"]] == list(range(1, MAX_MICRO_BATCHES + 1))
    for model in load_models().values():
        for pp in range(2, model.num_layers + 1):
            if model.num_layers % pp == 0:
                assert tabulated_floors(pp, THIRD) is not None, (model.name, pp)


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")
def test_regenerating_the_table_reproduces_the_committed_one(tmp_path, capsys, monkeypatch):
    out = tmp_path / "floors.json"
    # as `python -m hydraplan.planner.bubble_floor` runs it
    monkeypatch.setattr(sys, "argv", ["bubble_floor", "--out", str(out), "--max-micro-batches", "3"])
    runpy.run_module("hydraplan.planner.bubble_floor", run_name="__main__")
    printed = capsys.readouterr().out
    assert str(out) in printed
    regenerated, committed = json.loads(out.read_text()), _committed()
    for entry in regenerated["entries"]:  # one progress line per entry, its first and last floor
        floors = entry["floors"]
        assert f"pp={entry['pp']} f=0.3333: rho_1={floors[0]:.4f} rho_M={floors[-1]:.4f}\n" in printed
    assert regenerated["schema"] == TABLE_SCHEMA and regenerated["max_micro_batches"] == 3
    for new, old in zip(regenerated["entries"], committed["entries"], strict=True):
        assert (new["pp"], new["fwd_fraction"]) == (old["pp"], old["fwd_fraction"])
        assert new["floors"] == pytest.approx(old["floors"][:3], abs=2e-7)
        for new_shape, old_shape in zip(new["shapes"], old["shapes"][:3], strict=True):
            assert new_shape == pytest.approx(old_shape, abs=2e-4)
            # shares are rounded to 4 decimals
            assert np.allclose(np.asarray(new_shape) * 1e4, np.round(np.asarray(new_shape) * 1e4), atol=1e-6)


@pytest.mark.parametrize(("stages", "count"), [(2, 5), (3, 4), (6, 2)])
def test_a_tabulated_floor_is_the_lp_optimum_less_the_safety_rounded_down_to_1e_7(stages, count):
    table = build_table([stages], [THIRD], count)
    (entry,) = table["entries"]
    exact, shares = solve_floor_lp(stages, count, THIRD)
    floor = entry["floors"][-1]
    assert exact - SAFETY - 1e-7 < floor <= exact - SAFETY
    assert floor * 1e7 == pytest.approx(round(floor * 1e7), abs=1e-6)
    shape = entry["shapes"][-1]
    assert len(shape) == count and shape == pytest.approx(shares.tolist(), abs=5e-5)
    # the rounded shape still attains the floor (to the rounding)
    assert simulate_1f1b(shape, stages, THIRD) / sum(shape) == pytest.approx(1 + exact, rel=1e-3)


def test_ramp_shapes_exist_exactly_for_tabulated_counts():
    for count in (1, 7, MAX_MICRO_BATCHES):
        shape = ramp_shape(4, THIRD, count)
        assert shape is not None and len(shape) == count and shape.sum() == pytest.approx(1.0, abs=1e-3)
    assert ramp_shape(4, THIRD, 0) is None and ramp_shape(4, THIRD, MAX_MICRO_BATCHES + 1) is None
    assert ramp_shape(11, THIRD, 3) is None and ramp_shape(4, 0.3, 3) is None  # 11 stages: untabulated
    # uneven: with 16 micro-batches on 4 stages the sizes ramp up and taper off
    shape = ramp_shape(4, THIRD, 16)
    assert shape[0] < shape.max() and shape[-1] < shape.max()


def _direct_floor_s(coef: SchemeCoefficients, work: float, most: int) -> float:
    """min over m = 1..most of (1 + r_m)(W + m c), r_m the larger of the path floor kappa/m and the
    tabulated least bubble (none beyond the table): the bound the pieces approximate from below."""
    pp, f = coef.scheme.pp, coef.fwd_fraction
    floors = np.asarray(tabulated_floors(pp, f) or (), dtype=np.float64)
    counts = np.arange(1, most + 1, dtype=np.float64)
    relative = (pp - 1) * max(0.0, 1.0 - 2.0 * f) / counts
    table = np.zeros_like(counts)
    table[: min(len(floors), most)] = floors[:most]
    return float(np.min((1.0 + np.maximum(relative, table)) * (work + counts * coef.c)))


@pytest.mark.parametrize(("pp", "fwd_fraction"), [(4, THIRD), (8, THIRD), (7, 0.3), (5, 0.45)])
def test_the_pipeline_floor_is_the_direct_minimum_over_micro_batch_counts(pp, fwd_fraction):
    coef = _coef(pp, fwd_fraction)
    # capped at k <= M micro-batches: every count is priced exactly
    # (a cap one past the table is one more count, priced by a range of one count: exact too)
    for cap in (1, 2, 5, 17, MAX_MICRO_BATCHES, MAX_MICRO_BATCHES + 1):
        for work in (1e-4, 3e-3, 0.05, 2.0, 300.0):
            floor = float(pipeline_time_floor_s(coef, work, max_micro_batches=cap))
            assert floor == pytest.approx(_direct_floor_s(coef, work, cap), rel=1e-12), (cap, work)
    # uncapped, small work: the best count lies in the table, so again exact
    for work in (1e-4, 3e-3, 0.02):
        floor = float(pipeline_time_floor_s(coef, work))
        assert floor == pytest.approx(_direct_floor_s(coef, work, MAX_MICRO_BATCHES), rel=1e-12), work
    # uncapped, large work: counts past the table are priced in ranges, below the direct minimum
    # over every count but within the range width of it
    for work in (1.0, 10.0, 300.0):
        floor = float(pipeline_time_floor_s(coef, work))
        direct = _direct_floor_s(coef, work, 1 << 16)
        assert direct * (1 - 0.02) <= floor <= direct * (1 + 1e-12), work


def test_a_one_stage_pipeline_floor_is_its_work_plus_one_overhead():
    coef = _coef(1, c=0.25)
    assert float(pipeline_time_floor_s(coef, 3.0)) == pytest.approx(3.25)
    assert float(pipeline_time_floor_s(coef, 3.0, max_micro_batches=4)) == pytest.approx(3.25)


def test_the_largest_micro_batch_floor_is_the_path_bound_and_holds():
    # pp = 4, f = 1/4, c = 1, an item of work 2: c + (pp-1)(1-2f)(c + item) + (pp-1) f c
    #   = 1 + 3 * 0.5 * 3 + 3 * 0.25 * 1 = 6.25
    assert largest_micro_batch_floor_s(_coef(4, 0.25, c=1.0), 2.0) == pytest.approx(6.25)
    # forward at least half: the path's largest-micro-batch term vanishes, 1 + 3 * 0.6 * 1
    assert largest_micro_batch_floor_s(_coef(4, 0.6, c=1.0), 2.0) == pytest.approx(2.8)
    assert largest_micro_batch_floor_s(_coef(1, 0.25, c=1.0), 2.0) == pytest.approx(1.0)
    rng = np.random.default_rng(3)
    for _ in range(200):
        pp, f, c = int(rng.integers(2, 7)), float(rng.uniform(0.1, 0.7)), float(rng.uniform(0.0, 0.3))
        count = int(rng.integers(1, 12))
        items = [rng.lognormal(0.0, 1.0, int(rng.integers(1, 4))) for _ in range(count)]
        makespan = simulate_1f1b([c + float(works.sum()) for works in items], pp, f)
        work = sum(float(works.sum()) for works in items)
        largest = max(float(works.max()) for works in items)
        assert makespan - work >= largest_micro_batch_floor_s(_coef(pp, f, c), largest) * (1 - 1e-9) - 1e-12


def test_counts_past_every_range_are_priced_by_their_overheads_alone():
    """Work so large that more micro-batches than any range covers pay: the last piece, `W + (m + pp - 1)
    c` at the first count past the ranges (m = MAX_PRICED_MICRO_BATCHES + 1), is the floor."""
    coef = _coef(4, c=1e-3)
    work = 1e8
    expected = work + (MAX_PRICED_MICRO_BATCHES + 1 + 4 - 1) * coef.c
    assert float(pipeline_time_floor_s(coef, work)) == pytest.approx(expected, abs=1e-7)
    assert float(most_work_s(coef, expected)) == pytest.approx(work, abs=1e-7)


def test_caps_above_the_capped_limit_are_ignored_and_caps_at_it_are_kept():
    coef = _coef(4, c=1e-3)
    work = 300.0  # the best count is ~550 micro-batches: a cap of 128 binds
    uncapped = float(pipeline_time_floor_s(coef, work))
    assert float(pipeline_time_floor_s(coef, work, MAX_CAPPED_MICRO_BATCHES + 1)) == uncapped
    assert float(pipeline_time_floor_s(coef, work, MAX_CAPPED_MICRO_BATCHES)) > uncapped * (1 + 1e-4)


def test_floors_of_many_work_values_at_once_equal_the_floors_one_by_one():
    coef = _coef(5, c=2e-3)
    works = np.array([1e-3, 0.05, 1.0, 40.0])
    for cap in (None, 3):
        together = pipeline_time_floor_s(coef, works, cap)
        assert together.shape == works.shape
        assert together.tolist() == [float(pipeline_time_floor_s(coef, work, cap)) for work in works]
        inverse = most_work_s(coef, together, cap)
        assert inverse.shape == works.shape and inverse == pytest.approx(works, rel=1e-9)


def test_a_table_of_another_schema_is_refused():
    committed = _committed()
    assert len(parse_table(json.dumps(committed))) == len(TABULATED_STAGE_COUNTS)
    for schema in ("hydraplan.bubble-floors/0", "hydraplan.bubble-floors/2", None):
        with pytest.raises(ValueError, match="expected 'hydraplan.bubble-floors/1'"):
            parse_table(json.dumps(dict(committed, schema=schema)))
