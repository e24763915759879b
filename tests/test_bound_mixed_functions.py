"""The packing bound with a dual feasible function per scheme (`BoundTables.packing_bounds`'
`mixed_functions`): its value on a hand instance, its validity against every assignment, the
certificate's witness that carries the functions, and the verifier that needs them."""

from __future__ import annotations

import types
import typing

import numpy as np
import pytest
from test_bound_packing import ONE, exhaustive_s, halvings, packed, scheme

import hydraplan.planner.solve as solve_module
from hydraplan.api.datasets import sample_batch
from hydraplan.cost_models.analytic import build_profile
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.planner import bounds as bounds_module
from hydraplan.planner import verify_bound as vb
from hydraplan.planner.bounds import DFF_NAMES, MIXED_DFFS, BoundTables
from hydraplan.planner.schemas import DualFeasibleFunction, PlanRequest, SolverOptions, StrategyWitness
from hydraplan.planner.verify_bound import verify_bound

# twice ONE's speed: an item of work w on ONE carries w / 2 here
FAST = scheme(2, 1, b=0.5e-5, c=1e-3)
DEEP3 = scheme(1, 3, b=0.7e-4, c=2e-4)


def test_one_large_item_per_pipeline_here_and_three_there_takes_a_function_per_scheme():
    # six items of w on two ONE pipelines and one FAST: below 2w + c every size on ONE, w / (T - c),
    # is over 1/2 (one item per pipeline) and every size on FAST over 1/4 (three per pipeline):
    # 6 > 2 + 3. f_eps(1/2) on ONE and u_k(3) on FAST, at lambda = (1/4, 3/4), see it: each item
    # costs 1/4, the pipelines hold 5/4. No function alike on both does: f_eps(1/2) maps the FAST
    # sizes to 0, u_k(3) the ONE sizes to 2/3. The optimum is 2w + c (two pipelines of one item and
    # four on FAST, or two, one and three); the fluid bound sees 1.5w + c.
    w, c = 0.03, 1e-3
    optimum, start, cutoff = 2 * w + c, 1.55 * w + c, 2.5 * w + c
    assert exhaustive_s([ONE, FAST], [3_000] * 6, [2, 1]) == pytest.approx(optimum, rel=1e-12)
    alike = packed([ONE, FAST], [3_000] * 6, [[2, 1]], [start], [cutoff])
    assert alike[0] == start  # nothing proved
    tables = BoundTables.build(np.full(6, 3_000), [ONE, FAST])
    got, witnesses, functions = tables.packing_bounds(
        [0, 1], np.array([[2, 1]]), np.array([start]), np.array([cutoff]), mixed_functions=True
    )
    assert got[0] == pytest.approx(halvings(start, cutoff, optimum), rel=1e-12, abs=0)
    assert [DFF_NAMES[f] for f in functions[0]] == ["f_eps(1/2)", "u_k(3)"]
    assert witnesses[0] == pytest.approx([0.25, 0.75], abs=1e-12)


def test_a_row_the_functions_alike_prove_keeps_them():
    # three items on two ONE pipelines: f_eps(1/2) alike proves it (see test_bound_packing); its
    # witness names no functions
    w, c = 0.03, 1e-3
    tables = BoundTables.build(np.full(3, 3_000), [ONE])
    got, _, functions = tables.packing_bounds(
        [0], np.array([[2]]), np.array([1.5 * w + c]), np.array([0.0816]), mixed_functions=True
    )
    assert got[0] > 1.5 * w + c and (functions[0] == -1).all()


def test_mixed_packing_bounds_stay_below_every_assignment_of_the_items():
    # random tiny instances of two or three schemes: no bound passes the least slowest-pipeline
    # floor over every assignment, and the mixes prove more than the functions alike on some
    rng = np.random.default_rng(1)
    raised_by_mix = 0
    for _ in range(60):
        coefs = [[ONE, FAST], [ONE, DEEP3], [ONE, FAST, DEEP3]][int(rng.integers(3))]
        lengths = rng.integers(2_000, 4_000, size=int(rng.integers(len(coefs) + 2, 7))).tolist()
        counts = rng.integers(1, 3, size=len(coefs))
        if counts.sum() > len(lengths):
            continue
        optimum = exhaustive_s(coefs, lengths, counts.tolist())
        tables = BoundTables.build(np.asarray(lengths), coefs)
        columns = list(range(len(coefs)))
        _, start = tables.count_bounds(columns, counts[None])
        got, _, functions = tables.packing_bounds(
            columns, counts[None], start, np.array([2 * optimum]), mixed_functions=True
        )
        assert got[0] <= optimum * (1 + 1e-9), (coefs, lengths, counts, got, optimum)
        alike = tables.packing_bounds(columns, counts[None], start, np.array([2 * optimum]))[0]
        raised_by_mix += bool(functions[0][0] >= 0 and got[0] > alike[0] * (1 + 1e-9))
    assert raised_by_mix >= 3


def test_the_function_names_agree_between_solver_schema_and_verifier():
    assert set(DFF_NAMES) == set(typing.get_args(DualFeasibleFunction))
    assert vb.DFF_NAMES[1:] == DFF_NAMES  # the verifier's stack: the identity, then the solver's order
    assert all(name in DFF_NAMES for name in (DFF_NAMES[f] for f in MIXED_DFFS))
    assert bounds_module._function_mixes(4).shape == (0, 4)  # beyond three schemes: alike only


def test_a_witness_names_one_known_function_per_multiplier():
    StrategyWitness(counts=[1, 2], bound_s=1.0, multipliers=[0.5, 0.5], functions=["u_k(3)", "f_eps(1/2)"])
    with pytest.raises(ValueError, match="2 functions for 3 multipliers"):
        StrategyWitness(counts=[1, 2, 3], bound_s=1.0, multipliers=[0.2, 0.3, 0.5], functions=["u_k(3)", "u_k(2)"])
    with pytest.raises(ValueError, match="u_k"):
        StrategyWitness(counts=[1, 2], bound_s=1.0, multipliers=[0.5, 0.5], functions=["u_k(5)", "u_k(2)"])


@pytest.fixture(scope="module")
def long_items_pool():
    """An 8B / 64 H100 LongAlign batch (43 items, 17 of 32K tokens) planned with one strategy:
    13 <2,1,2> pipelines hold one 32K item each, the <2,1,4> three, the two <2,1,1> none."""
    profile = build_profile(get_model("llama3-8b"), get_gpu("h100-sxm-80gb"), 64, 8)
    lengths = sample_batch("longalign", 1_000_000, 0, 32 * 1024)
    pool = ["1x<2,1,4> + 13x<2,1,2> + 2x<2,1,1>"]
    options = SolverOptions(solver="lp", time_limit_s=4.0, seed=0, oversize="split", strategy_pool=pool)
    return profile, PlanRequest(lengths=lengths, num_gpus=64, gpus_per_node=8, options=options)


def clockless(monkeypatch, profile, request):
    monkeypatch.setattr(solve_module, "time", types.SimpleNamespace(perf_counter=lambda: 0.0))
    plan = solve_module.solve(request, profile)
    monkeypatch.undo()
    return plan


def test_the_verifier_needs_the_witness_functions_of_a_mixed_bound(monkeypatch, long_items_pool):
    # at 4 s the pool's bound comes within 0.1% of its plan by a mix (the functions alike left it
    # 11% under); the certificate names the mix, and the verifier proves the bound with it and
    # cannot without it
    profile, request = long_items_pool
    plan = clockless(monkeypatch, profile, request)
    assert plan.lower_bound_s > plan.objective_s * 0.995
    witness = plan.bound_certificate.expanded[0].strategies[0]
    assert witness.functions is not None and "u_k(3)" in witness.functions
    assert verify_bound(plan, profile, request).ok
    stripped = plan.bound_certificate.model_copy(
        update={
            "expanded": [
                entry.model_copy(
                    update={"strategies": [w.model_copy(update={"functions": None}) for w in entry.strategies]}
                )
                for entry in plan.bound_certificate.expanded
            ]
        }
    )
    assert not verify_bound(plan.model_copy(update={"bound_certificate": stripped}), profile, request).ok
    # the 2 s default mixes no functions: its bound stays where the functions alike leave it
    short = request.model_copy(update={"options": request.options.model_copy(update={"time_limit_s": 2.0})})
    default = clockless(monkeypatch, profile, short)
    assert default.lower_bound_s < plan.lower_bound_s * 0.95
    assert all(w.functions is None for e in default.bound_certificate.expanded for w in e.strategies)
