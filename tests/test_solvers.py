"""Solver backends: differential tests against brute force on tiny instances, time-outs,
determinism, strategy switch cost and strategy pools."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from synthetic import synthetic_profile, wikipedia_like_batch

from hydraplan.planner.baselines import run_baseline
from hydraplan.planner.check import check_plan
from hydraplan.planner.errors import PlanningError
from hydraplan.planner.schemas import CostProfile, PlanRequest, SchemeCost, SolverOptions, SolveStatus
from hydraplan.planner.solve import evaluate_strategy, solve
from hydraplan.planner.strategies import parse_strategy

TINY_PROFILE = CostProfile(
    num_layers=4,
    schemes=[
        SchemeCost(tp=1, pp=1, cp=1, a=2e-9, b=1e-5, c=2e-3, capacity_tokens=3000),
        SchemeCost(tp=2, pp=1, cp=1, a=1e-9, b=6e-6, c=2e-3, capacity_tokens=7000),
    ],
)
TINY_STRATEGIES = ["2x<1,1,1>", "3x<1,1,1>", "1x<2,1,1> + 1x<1,1,1>", "1x<2,1,1> + 2x<1,1,1>"]


def fewest_bins(lengths: list[int], capacity: int) -> int:
    """Exact bin packing by dynamic programming over subsets (tiny inputs only)."""
    count = len(lengths)
    full = (1 << count) - 1
    size = [sum(lengths[i] for i in range(count) if mask >> i & 1) for mask in range(full + 1)]
    best = [0] + [count + 1] * full
    for mask in range(1, full + 1):
        sub = mask
        while sub:
            if size[sub] <= capacity and best[mask ^ sub] + 1 < best[mask]:
                best[mask] = best[mask ^ sub] + 1
            sub = (sub - 1) & mask
    return best[full]


def brute_force_step_s(lengths: list[int], strategy: str, profile: CostProfile) -> float:
    """Best step time over every assignment and packing (pp = 1: time = work + c * bins)."""
    schemes = parse_strategy(strategy).pipeline_schemes()
    costs = {(s.tp, s.pp, s.cp): s for s in profile.schemes}
    best = float("inf")
    for owners in itertools.product(range(len(schemes)), repeat=len(lengths)):
        worst = 0.0
        for pipeline, scheme in enumerate(schemes):
            mine = [length for length, owner in zip(lengths, owners) if owner == pipeline]
            cost = costs[(scheme.tp, scheme.pp, scheme.cp)]
            if not mine or max(mine) > cost.capacity_tokens:
                worst = float("inf")
                break
            work = sum(cost.a * x * x + cost.b * x for x in mine)
            worst = max(worst, work + cost.c * fewest_bins(mine, cost.capacity_tokens))
        best = min(best, worst)
    return best


def tiny_request(lengths, num_gpus, solver, **options) -> PlanRequest:
    return PlanRequest(
        lengths=lengths,
        num_gpus=num_gpus,
        gpus_per_node=8,
        options=SolverOptions(solver=solver, time_limit_s=10, **options),
    )


@pytest.mark.parametrize("case", range(6))
def test_exact_backends_match_brute_force_and_bound_greedy(case):
    rng = np.random.default_rng(case)
    lengths = rng.integers(200, 2900, size=int(rng.integers(3, 8))).tolist()
    strategy = TINY_STRATEGIES[case % len(TINY_STRATEGIES)]
    num_gpus = parse_strategy(strategy).num_gpus
    optimum = brute_force_step_s(lengths, strategy, TINY_PROFILE)
    results = {}
    for solver in ("cpsat", "pulp", "greedy", "lp"):
        plan = evaluate_strategy(tiny_request(lengths, num_gpus, solver), TINY_PROFILE, parse_strategy(strategy))
        assert check_plan(plan) == []
        assert plan.lower_bound_s <= optimum * (1 + 1e-9)
        results[solver] = plan.step_time_s
    assert results["cpsat"] == pytest.approx(optimum, rel=1e-5)
    assert results["pulp"] == pytest.approx(optimum, rel=1e-5)
    assert results["greedy"] >= optimum * (1 - 1e-9)
    assert results["lp"] >= optimum * (1 - 1e-9)


def test_search_with_an_exact_backend_finds_the_best_tiny_strategy():
    lengths = [2500, 2400, 900, 700, 650, 300]
    best = min(brute_force_step_s(lengths, s, TINY_PROFILE) for s in ["2x<1,1,1>", "1x<2,1,1>"])
    plan = solve(tiny_request(lengths, 2, "cpsat"), TINY_PROFILE)
    assert check_plan(plan) == []
    assert plan.step_time_s == pytest.approx(best, rel=1e-5)
    assert plan.lower_bound_s <= best * (1 + 1e-9)


@pytest.mark.parametrize("solver", ["greedy", "lp", "cpsat", "pulp", "auto"])
def test_every_backend_returns_checked_plans(solver):
    lengths = wikipedia_like_batch(30_000, seed=11)
    plan = solve(tiny_request(lengths, 16, solver, max_strategies_solved=6), synthetic_profile(max_gpus=16))
    assert check_plan(plan) == []
    assert plan.solver.backend == solver


def test_time_out_still_returns_a_valid_plan():
    lengths = wikipedia_like_batch(200_000, seed=12)
    plan = solve(
        PlanRequest(lengths=lengths, num_gpus=64, options=SolverOptions(time_limit_s=0.05, solver="auto")),
        synthetic_profile(max_gpus=64),
    )
    assert check_plan(plan) == []
    assert plan.status == SolveStatus.TIMEOUT_INCUMBENT


def test_cancel_stops_the_search_with_its_incumbent():
    lengths = wikipedia_like_batch(100_000, seed=13)
    plan = solve(PlanRequest(lengths=lengths, num_gpus=32), synthetic_profile(max_gpus=32), cancel=lambda: True)
    assert check_plan(plan) == [] and plan.solver.num_strategies_solved == 1


@pytest.mark.parametrize("solver", ["greedy", "lp"])
def test_same_request_and_seed_give_the_same_plan_under_the_work_limit(solver):
    lengths = wikipedia_like_batch(80_000, seed=14)
    request = tiny_request(lengths, 32, solver, max_strategies_solved=8)
    first, second = solve(request, synthetic_profile(max_gpus=32)), solve(request, synthetic_profile(max_gpus=32))
    assert not first.solver.cut_by_clock and first.model_dump_json() == second.model_dump_json()


def test_switch_cost_keeps_the_previous_strategy_unless_the_gain_is_larger():
    profile = synthetic_profile(max_gpus=16)
    lengths = wikipedia_like_batch(60_000, seed=15)
    previous = "2x<8,1,1>"  # every GPU holds an eighth of every layer: any other layout must load some

    def request_after(previous_strategy: str = previous) -> PlanRequest:
        options = SolverOptions(solver="greedy", time_limit_s=10)
        return PlanRequest(lengths=lengths, num_gpus=16, previous_strategy=previous_strategy, options=options)

    def plan_after(cost_profile, previous_strategy: str = previous):
        request = request_after(previous_strategy)
        staying = evaluate_strategy(request, cost_profile, parse_strategy(previous_strategy))
        return solve(request, cost_profile), staying

    # fast link: the gain beats the re-sharding, the planner switches and pays for it
    moved, staying = plan_after(profile)
    assert moved.strategy != previous and moved.switch_cost_s > 0 and staying.switch_cost_s == 0
    assert moved.objective_s == pytest.approx(moved.step_time_s + moved.switch_cost_s)
    assert moved.objective_s < staying.objective_s and check_plan(moved) == []
    # slow link (1 MB/s): no gain pays for re-sharding, the planner stays
    slow = profile.model_copy(update={"grad_sync_bandwidth_bytes_per_s": 1e6, "grad_sync_s": 0.0})
    stay, _ = plan_after(slow)
    assert stay.strategy == previous and stay.switch_cost_s == 0.0 and check_plan(stay) == []
    # from whole-model replicas every new shard is already held: even on the slow link the planner
    # leaves 16x<1,1,1>, at no switch cost
    left, replicas = plan_after(slow, "16x<1,1,1>")
    assert left.strategy != "16x<1,1,1>" and left.switch_cost_s == 0.0 and check_plan(left) == []
    assert left.objective_s == left.step_time_s < replicas.objective_s
    # no bandwidth at all: a switch cannot be priced, so a previous strategy is refused, by name
    unpriced = profile.model_copy(update={"grad_sync_bandwidth_bytes_per_s": None, "grad_sync_s": 0.0})
    for attempt in (lambda: plan_after(unpriced), lambda: run_baseline("megatron", request_after(), unpriced)):
        with pytest.raises(PlanningError, match=r"previous_strategy '2x<8,1,1>'.*grad_sync_bandwidth_bytes_per_s"):
            attempt()


def test_strategy_pool_restricts_the_search():
    profile = synthetic_profile(max_gpus=16)
    lengths = wikipedia_like_batch(40_000, seed=16)
    pool = ["4x<4,1,1>", "2x<4,2,1>"]
    plan = solve(tiny_request(lengths, 16, "greedy", strategy_pool=pool), profile)
    assert plan.strategy in pool and check_plan(plan) == []
    with pytest.raises(PlanningError, match=r"strategy_pool\[1\]"):
        solve(tiny_request(lengths, 16, "greedy", strategy_pool=["4x<4,1,1>", "four of them"]), profile)
    with pytest.raises(PlanningError, match=r"strategy_pool\[0\] 2x<4,1,1> uses 8 GPUs, the cluster has 16"):
        solve(tiny_request(lengths, 16, "greedy", strategy_pool=["2x<4,1,1>"]), profile)
    with pytest.raises(PlanningError, match=r"strategy_pool\[0\] 1x<16,1,1>: scheme <16,1,1> is not in the cost"):
        solve(tiny_request(lengths, 16, "greedy", strategy_pool=["1x<16,1,1>"]), profile)


@pytest.mark.parametrize("backend", ["cpsat", "pulp"])
def test_joint_milp_cannot_leave_a_pipeline_empty(backend):
    """Regression (seen in the quality benchmark): the joint model let a micro-batch slot count as
    used with no item in it, so a pipeline could come back empty. Here only one of the two
    pipelines can hold the single item: the model must be infeasible, not decode an empty one."""
    from hydraplan.planner.cost import ProfileCostModel
    from hydraplan.planner.milp import solve_milp
    from hydraplan.planner.scheme import ParallelScheme

    cost = ProfileCostModel(TINY_PROFILE)
    coefs = [cost.coefficients(ParallelScheme(2, 1, 1)), cost.coefficients(ParallelScheme(1, 1, 1))]
    assert solve_milp(backend, np.array([5000]), coefs, work_limit_s=2, seed=0) is None
    two = solve_milp(backend, np.array([5000, 100]), coefs, work_limit_s=2, seed=0)
    assert two is not None and [items.tolist() for items in two.assignment] == [[0], [1]]
