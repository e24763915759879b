"""The least-bubble floors of interleaved 1F1B (`planner.bubble_floor`, item 4; the verifier's
`least_bubble(..., schedule="interleaved")`): valid on random and very uneven runs of the simulator
and of the reference, reached by the LP's own shares, tabulated as the verifier re-solves them,
priced into pieces no lower than the fill-and-drain floor and no higher than a real run, and
raising a batch's bound that the independent verifier then proves."""

from __future__ import annotations

import numpy as np
import pytest

from hydraplan.cost_models.catalog import load_models
from hydraplan.planner import bubble_floor, reference
from hydraplan.planner import verify_bound as vb
from hydraplan.planner.baselines import recipe_chunks
from hydraplan.planner.bubble_floor import (
    TABULATED_FWD_FRACTION,
    TABULATED_INTERLEAVED,
    interleaved_overhead_s,
    most_work_s,
    pipeline_pieces,
    pipeline_time_floor_s,
    solve_interleaved_floor_lp,
    tabulated_interleaved_floors,
)
from hydraplan.planner.check import check_plan
from hydraplan.planner.cost import SchemeCoefficients
from hydraplan.planner.schemas import CostProfile, PlanRequest, SchemeCost, SolverOptions
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.simulate import simulate_interleaved_1f1b
from hydraplan.planner.solve import solve
from hydraplan.planner.verify_bound import verify_bound

THIRD = TABULATED_FWD_FRACTION
# (pp, v, m): shallow and deep, few chunks and many, one group and several
CASES = [(2, 2, 2), (2, 6, 4), (3, 5, 6), (4, 2, 8), (4, 5, 12), (8, 2, 16), (10, 2, 20)]


def _runs(rng: np.random.Generator, count: int) -> list[np.ndarray]:
    """Random stage times: mild, heavy-tailed, one giant among dust, zeros, a ramp and equal ones."""
    runs = [rng.uniform(0.5, 1.5, size=count) for _ in range(10)]
    runs += [rng.lognormal(0.0, 2.0, size=count) for _ in range(10)]
    for place in range(count):
        giant = np.full(count, 1e-3)
        giant[place] = 100.0
        runs.append(giant)
    zeros = rng.uniform(0.0, 1.0, size=count)
    zeros[rng.uniform(size=count) < 0.5] = 0.0
    zeros[0] += 0.1
    runs += [zeros, np.arange(1.0, count + 1.0), np.ones(count)]
    return runs


@pytest.mark.parametrize(("stages", "chunks", "count"), CASES)
def test_every_run_takes_at_least_the_tabulated_least_bubble(stages: int, chunks: int, count: int) -> None:
    """(a) `T >= (1 + rho_m) S` for random and very uneven runs, timed by the simulator and by the
    reference's interleaved schedule, with the table's and the verifier's rho_m."""
    rho = tabulated_interleaved_floors(stages, chunks, THIRD)[count]
    rho_verifier = vb.least_bubble(stages, count, THIRD, vb.SCHEDULE_INTERLEAVED, chunks)
    assert rho > 0.0 and rho_verifier > 0.0
    rng = np.random.default_rng(100 * stages + chunks)
    for times in _runs(rng, count):
        total = float(times.sum())
        simulated = simulate_interleaved_1f1b(times.tolist(), stages, chunks, THIRD)
        referenced = reference.interleaved_pipeline_time_s(times.tolist(), stages, chunks, THIRD, stages)
        assert simulated == pytest.approx(referenced, rel=1e-12)
        for floor in (rho, rho_verifier):
            assert simulated >= (1 + floor) * total * (1 - 1e-9), (times, floor)
            assert referenced >= (1 + floor) * total * (1 - 1e-9), (times, floor)


@pytest.mark.parametrize(("stages", "chunks", "count"), CASES)
def test_the_lp_shares_run_through_the_simulator_reach_the_floor(stages: int, chunks: int, count: int) -> None:
    """(b) tightness: the optimum's shares, simulated, take (1 + rho_m) of their sum."""
    rho, shares = solve_interleaved_floor_lp(stages, chunks, count, THIRD)
    assert shares.sum() == pytest.approx(1.0) and (shares >= 0).all()
    simulated = simulate_interleaved_1f1b(shares.tolist(), stages, chunks, THIRD)
    assert simulated == pytest.approx(1 + rho, rel=1e-6)
    # and the uneven optimum beats equal micro-batches whenever more than one group runs
    equal = simulate_interleaved_1f1b([1 / count] * count, stages, chunks, THIRD)
    assert simulated <= equal * (1 + 1e-9)
    if count > stages:
        assert simulated < equal * (1 - 1e-4)


def test_the_table_covers_every_recipe_pair_of_the_catalog() -> None:
    """Every (pp, v) `recipe_chunks` gives the catalog models is tabulated (at m = pp, 2 pp, ...)."""
    pairs = set()
    for name, model in load_models().items():
        for pp in range(2, model.num_layers + 1):
            chunks = recipe_chunks(name, model.num_layers, pp)
            if model.num_layers % pp == 0 and chunks > 1:
                pairs.add((pp, chunks))
    assert pairs and pairs <= set(TABULATED_INTERLEAVED)
    for pp, chunks in TABULATED_INTERLEAVED:
        floors = tabulated_interleaved_floors(pp, chunks, THIRD)
        assert sorted(floors) == list(range(pp, bubble_floor.MAX_MICRO_BATCHES + 1, pp))
        values = [floors[count] for count in sorted(floors)]
        assert all(later <= earlier for earlier, later in zip(values, values[1:]))  # more groups, less bubble
        # one group: the fill-and-drain floor's (pp-1) / (pp v), as the module docstring states
        assert floors[pp] == pytest.approx((pp - 1) / (pp * chunks), abs=2e-6)


def test_regenerating_the_interleaved_table_reproduces_the_committed_one(tmp_path, capsys) -> None:
    """`python -m hydraplan.planner.bubble_floor --only interleaved` (here up to 4 micro-batches)
    writes the committed floors, one progress line per entry, and leaves the 1F1B table alone."""
    out = tmp_path / "interleaved.json"
    bubble_floor.main(["--only", "interleaved", "--max-micro-batches", "4", "--interleaved-out", str(out)])
    assert str(out) in capsys.readouterr().out
    regenerated = bubble_floor.parse_interleaved_table(out.read_text())
    assert sorted(regenerated) == sorted((pp, v, round(THIRD, 9)) for pp, v in TABULATED_INTERLEAVED if pp <= 4)
    for (pp, v, _), floors in regenerated.items():
        committed = tabulated_interleaved_floors(pp, v, THIRD)
        assert floors == pytest.approx({count: committed[count] for count in floors}, abs=2e-7)
    assert not (tmp_path / bubble_floor.TABLE_FILE).exists()
    with pytest.raises(ValueError, match="schema"):
        bubble_floor.parse_interleaved_table('{"schema": "hydraplan.bubble-floors/1", "entries": []}')


# the table's counts re-solved by the verifier (a sample: every pair at m = pp and 2 pp, a few deeper)
TABLE_SAMPLE = [(pp, v, pp * k) for pp, v in TABULATED_INTERLEAVED for k in (1, 2)] + [
    (2, 6, 64),
    (4, 5, 40),
    (10, 2, 60),
]


@pytest.mark.parametrize(("stages", "chunks", "count"), TABLE_SAMPLE)
def test_the_table_equals_the_verifiers_lp_within_the_rounding(stages: int, chunks: int, count: int) -> None:
    """(c) the solver's table (LP over `simulate`'s order, less SAFETY, rounded down to 1e-7) and
    the verifier's own LP (over `reference`'s order, less LP_SAFETY) agree."""
    tabulated = tabulated_interleaved_floors(stages, chunks, THIRD)[count]
    resolved = vb.least_bubble(stages, count, THIRD, vb.SCHEDULE_INTERLEAVED, chunks)
    assert abs(resolved - tabulated) <= 2e-7, (stages, chunks, count, resolved, tabulated)


def _coefficients(stages: int, chunks: int, c: float) -> SchemeCoefficients:
    return SchemeCoefficients(
        ParallelScheme(1, stages, 1, chunks),
        a=1e-9,
        b=1e-5,
        c=c,
        capacity_tokens=8192,
        fwd_fraction=THIRD,
        grad_bytes_per_gpu=1e8,
    )


@pytest.mark.parametrize(("stages", "chunks"), [(2, 6), (4, 5), (8, 2)])
def test_the_pieces_lie_between_the_fill_and_drain_floor_and_a_real_run(stages: int, chunks: int) -> None:
    """(d) g(W) is at least today's `W + (pp + (pp-1)/v) c`, above it for large W, and at most the
    simulated time of runs of the same work (equal items, and items shaped by the LP's optimum);
    G inverts g; a cap admits only its multiples of pp, and below pp keeps the fill-and-drain piece."""
    c = 0.01
    coef = _coefficients(stages, chunks, c)
    today = interleaved_overhead_s(coef)
    works = np.geomspace(1e-4, 100.0, 60)
    floors = pipeline_time_floor_s(coef, works)
    assert (floors >= works + today - 1e-12).all()
    assert floors[-1] > (works[-1] + today) * 1.001  # the LP prices a large pipeline's bubble
    assert most_work_s(coef, floors) == pytest.approx(works, rel=1e-9)
    counts = range(stages, 4 * stages + 1, stages)
    spreads = [np.full(count, 1.0 / count) for count in counts]
    spreads += [solve_interleaved_floor_lp(stages, chunks, count, THIRD)[1] for count in counts]
    for work, floor in zip(works[::5].tolist(), floors[::5].tolist()):
        # micro-batch i: items of work W u_i, plus c
        best = min(simulate_interleaved_1f1b((c + work * spread).tolist(), stages, chunks, THIRD) for spread in spreads)
        assert floor <= best * (1 + 1e-9), (work, floor, best)
    alpha, beta = pipeline_pieces(coef, stages - 1)
    assert (alpha, beta) == (pytest.approx([1.0]), pytest.approx([today]))
    rho = tabulated_interleaved_floors(stages, chunks, THIRD)
    alpha, beta = pipeline_pieces(coef, 2 * stages + 1)  # m = pp or 2 pp only: no tail
    assert alpha.tolist() == pytest.approx([1 + rho[stages], 1 + rho[2 * stages]])
    assert beta.tolist() == pytest.approx([(1 + rho[stages]) * stages * c, (1 + rho[2 * stages]) * 2 * stages * c])
    capped = pipeline_time_floor_s(coef, works, 2 * stages + 1)
    assert (capped >= floors - 1e-12).all()  # fewer micro-batches allowed: no lower
    untabulated = _coefficients(stages, 7, c)  # v = 7 is in no table
    assert pipeline_time_floor_s(untabulated, works) == pytest.approx(works + interleaved_overhead_s(untabulated))


def _interleaved_only_profile() -> CostProfile:
    """`<1,2,1>` and `<1,2,1,2>` (tabulated at f = 1/3) for one pipeline on 2 GPUs, the plain one
    eight times slower (its set's bound stays above), the interleaved one with a small c: its bubble,
    not its overheads, is what the LP prices."""
    plain = SchemeCost(
        tp=1,
        pp=2,
        cp=1,
        a=4e-9,
        b=4e-5,
        c=2e-4,
        fwd_fraction=THIRD,
        capacity_tokens=4000,
        grad_bytes_per_gpu=1e8,
    )
    interleaved = plain.model_copy(update={"v": 2, "a": 5e-10, "b": 5e-6, "c": 5e-5})
    return CostProfile(num_layers=12, schemes=[plain, interleaved], grad_sync_bandwidth_bytes_per_s=5e10)


def test_a_batch_with_an_interleaved_set_gets_a_higher_bound_that_the_verifier_proves(monkeypatch) -> None:
    """(e) the same batch, bounded with the interleaved table and without it (today's fill-and-drain
    floor alone): the table raises the bound well past it, below the plan's time, and
    `verify_bound` proves the raised bound with its own LP."""
    profile = _interleaved_only_profile()
    lengths = [3000, 2900, 2800, 2700, 2600, 2500]
    request = PlanRequest(
        lengths=lengths, num_gpus=2, gpus_per_node=8, options=SolverOptions(time_limit_s=5, max_schemes=1)
    )
    plan = solve(request, profile)
    assert check_plan(plan, profile, request) == []
    verification = verify_bound(plan, profile, request)
    assert verification.ok, verification.violations
    assert verification.verified_bound_s >= plan.lower_bound_s * (1 - 1e-6)
    assert plan.lower_bound_s <= plan.objective_s * (1 + 1e-9)
    bubble_floor._pieces.cache_clear()
    monkeypatch.setattr(bubble_floor, "_interleaved_table", lambda: {})
    try:
        before = solve(request, profile)
    finally:
        bubble_floor._pieces.cache_clear()
    assert plan.strategy == before.strategy
    assert plan.lower_bound_s > before.lower_bound_s * 1.01, (plan.lower_bound_s, before.lower_bound_s)
