"""Never behind a peer (`planner.portfolio`): for any request, at any budget, cut by the clock or
not, the plan's objective is at most that of every shipped baseline's plan of the same batch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic import synthetic_profile, wikipedia_like_batch

from benchmarks.quality import same_batch
from hydraplan.cost_models.analytic import build_profile
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.planner.baselines import BASELINES, INTERLEAVED_BASELINES, recipe_counts_for, run_baseline
from hydraplan.planner.errors import PlanningError
from hydraplan.planner.schemas import Plan, PlanRequest, SolverOptions
from hydraplan.planner.solve import solve

TOLERANCE = 1e-9  # relative: the same plan's objective summed in another order

PROFILES = {
    "synthetic-16": (synthetic_profile(max_gpus=16), 16),
    "tiny-8": (build_profile(get_model("tiny"), get_gpu("h100-sxm-80gb"), 8, 8), 8),
    "8b-32": (build_profile(get_model("llama3-8b"), get_gpu("h100-sxm-80gb"), 32, 8), 32),
    # with the interleaved schemes of the recipe's chunk counts: megatron-vpp and wlb-vpp plan too
    "8b-32-vpp": (
        build_profile(
            get_model("llama3-8b"),
            get_gpu("h100-sxm-80gb"),
            32,
            8,
            virtual_stages=recipe_counts_for("llama3-8b", 32, 32),
        ),
        32,
    ),
}


def behind(plan: Plan, request: PlanRequest, profile) -> list[str]:
    """The baselines whose own plan of the same batch has a smaller objective than `plan`."""
    worse = []
    for name in BASELINES:
        try:
            baseline = run_baseline(name, request, profile)
        except PlanningError:
            continue
        if same_batch(plan, baseline) and plan.objective_s > baseline.objective_s * (1 + TOLERANCE):
            worse.append(f"{name}: {baseline.objective_s:.6f} < {plan.objective_s:.6f} ({baseline.strategy})")
    return worse


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    profile_name=st.sampled_from(sorted(PROFILES)),
    num_tokens=st.integers(20_000, 400_000),
    seed=st.integers(0, 1000),
    time_limit_s=st.sampled_from([0.01, 0.05, 0.3, 2.0]),
    max_schemes=st.integers(1, 3),
)
def test_never_behind_a_baseline(profile_name: str, num_tokens: int, seed: int, time_limit_s: float, max_schemes: int):
    profile, num_gpus = PROFILES[profile_name]
    lengths = wikipedia_like_batch(num_tokens, seed=seed, cap=16384)
    options = SolverOptions(time_limit_s=time_limit_s, seed=seed, max_schemes=max_schemes, oversize="split")
    request = PlanRequest(lengths=lengths, num_gpus=num_gpus, gpus_per_node=8, options=options)
    try:
        plan = solve(request, profile)
    except PlanningError:
        return
    assert behind(plan, request, profile) == []


@pytest.mark.parametrize("stop_after", [0, 1, 3])
def test_never_behind_even_when_cancelled_at_once(stop_after: int) -> None:
    """A search the caller cancels at its first questions still returns a plan no baseline beats."""
    profile, num_gpus = PROFILES["8b-32"]
    lengths = wikipedia_like_batch(300_000, seed=stop_after)
    request = PlanRequest(lengths=lengths, num_gpus=num_gpus, options=SolverOptions(time_limit_s=5.0))
    asked = {"n": 0}

    def cancel() -> bool:
        asked["n"] += 1
        return asked["n"] > stop_after

    plan = solve(request, profile, cancel=cancel)
    assert plan.solver.cut_by_clock
    assert behind(plan, request, profile) == []


def test_the_plan_names_the_baseline_it_grew_from() -> None:
    """llama-32b on 64 A100s, 200K lognormal tokens (seed 0): flexsp's strategy
    `2x<4,1,2> + 12x<4,1,1>` beat every strategy the search solved itself (4,480.2 ms against
    4,520.0 ms before the portfolio); its plan, polished by the search, is now the plan."""
    from hydraplan.api.datasets import sample_batch

    profile = build_profile(get_model("llama-32b"), get_gpu("a100-80gb"), 64, 8)
    lengths = sample_batch("lognormal", 200_000, 0, 32768)
    request = PlanRequest(lengths=lengths, num_gpus=64, options=SolverOptions(seed=0, oversize="split", time_limit_s=5))
    plan = solve(request, profile)
    flexsp = run_baseline("flexsp", request, profile)
    assert plan.solver.winner == "flexsp" and plan.strategy == flexsp.strategy == "2x<4,1,2> + 12x<4,1,1>"
    assert plan.step_time_s < flexsp.step_time_s
    searched = solve(
        request.model_copy(update={"options": request.options.model_copy(update={"max_schemes": 1})}), profile
    )
    assert searched.solver.winner in {"search", *BASELINES}


def test_a_pool_keeps_the_search_inside_it() -> None:
    """With a strategy pool the baselines' plans are not candidates: the plan stays in the pool."""
    profile, num_gpus = PROFILES["8b-32"]
    lengths = wikipedia_like_batch(200_000, seed=1)
    pool = ["4x<2,1,4>", "32x<1,1,1>"]
    options = SolverOptions(time_limit_s=2.0, strategy_pool=pool)
    plan = solve(PlanRequest(lengths=lengths, num_gpus=num_gpus, options=options), profile)
    assert plan.strategy in pool and plan.solver.winner == "search"
    assert np.isfinite(plan.objective_s)


def test_never_behind_an_interleaved_baseline_that_beats_the_plain_ones() -> None:
    """Llama 3 8B on 16 H100 with only its pp 2 schemes and their recipe's v = 4 entries: the
    interleaved baselines beat the plain ones (a quarter of the bubble), and the plan is behind
    neither."""
    full = build_profile(get_model("llama3-8b"), get_gpu("h100-sxm-80gb"), 16, 8, virtual_stages=[4])
    profile = full.model_copy(update={"schemes": [entry for entry in full.schemes if entry.pp == 2]})
    lengths = wikipedia_like_batch(120_000, seed=5, cap=8192)
    options = SolverOptions(time_limit_s=2.0, seed=0, oversize="split")
    request = PlanRequest(lengths=lengths, num_gpus=16, gpus_per_node=8, options=options)
    plain = min(run_baseline(name, request, profile).objective_s for name in ("megatron", "wlb"))
    interleaved = {name: run_baseline(name, request, profile) for name in INTERLEAVED_BASELINES}
    assert min(plan.objective_s for plan in interleaved.values()) < plain
    plan = solve(request, profile)
    assert behind(plan, request, profile) == []
    assert plan.objective_s <= min(p.objective_s for p in interleaved.values()) * (1 + TOLERANCE)
