"""The planning-time budget is hard: every phase of the search stops at the clock and the plan
that comes back is checked, with a valid lower bound and status `timeout_incumbent`.

The clock is made deterministic here: a `cancel` callback that turns true after N checks, or a
fake clock whose time moves only when it is read. No test asserts a wall time beyond a generous
"within 10x the budget".
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest
from synthetic import synthetic_profile, wikipedia_like_batch

import hydraplan.planner.search as search_module
from hydraplan.planner.bounds import BoundTables, SyncFloors
from hydraplan.planner.check import check_plan
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.schemas import CostProfile, PlanRequest, SchemeCost, SolverBackend, SolverOptions, SolveStatus
from hydraplan.planner.search import (
    Clock,
    Frontier,
    SearchSettings,
    _homogeneous,
    _seed_sets,
    runnable_schemes,
    search,
    solve_strategy,
)
from hydraplan.planner.solve import solve

NUM_GPUS = 64
PROFILE = synthetic_profile(max_gpus=NUM_GPUS)
# more than 512 sequences: the brief settings, so the full search takes about a second
LENGTHS = wikipedia_like_batch(600_000, seed=1)


def request(time_limit_s: float = 60.0, solver: str = "auto", lengths=LENGTHS, num_gpus=NUM_GPUS) -> PlanRequest:
    options = SolverOptions(time_limit_s=time_limit_s, solver=solver)
    return PlanRequest(lengths=lengths, num_gpus=num_gpus, gpus_per_node=8, options=options)


class CancelAfter:
    """A `cancel` callback that says stop from its (n+1)-th call on, counting every call."""

    def __init__(self, checks: int) -> None:
        self.checks, self.calls, self.expired_at = checks, 0, None

    def __call__(self) -> bool:
        self.calls += 1
        if self.calls > self.checks and self.expired_at is None:
            self.expired_at = self.calls
        return self.calls > self.checks


@pytest.fixture(scope="module")
def full_plan():
    """The search run to its work limits (the time limit is far away)."""
    return solve(request(), PROFILE)


def assert_valid(plan, full) -> None:
    assert check_plan(plan) == [] and check_plan(plan, PROFILE) == []
    # the bound stays valid: no plan, the full search's included, is below it
    assert 0 < plan.lower_bound_s <= min(plan.objective_s, full.objective_s) * (1 + 1e-12)


@pytest.fixture
def work_after_expiry(monkeypatch):
    """Records the search's costly steps (a strategy screened, a scheme set expanded, an LP or
    MILP polish) taken while the `cancel` callback `CancelAfter` in `cancels` already said stop."""
    cancels: list[CancelAfter] = []
    late: list[str] = []

    def watched(name, function):
        def wrapper(*args, **kwargs):
            if cancels and cancels[-1].expired_at is not None:
                late.append(name)
            return function(*args, **kwargs)

        return wrapper

    for name in ("_first_solution", "lp_candidate", "milp_candidate"):
        monkeypatch.setattr(search_module, name, watched(name, getattr(search_module, name)))
    monkeypatch.setattr(Frontier, "expand_next", watched("expand_next", Frontier.expand_next))
    return cancels, late


def test_cancelled_at_once_returns_the_first_incumbent(full_plan, work_after_expiry):
    cancels, late = work_after_expiry
    cancel = CancelAfter(0)
    cancels.append(cancel)
    plan = solve(request(), PROFILE, cancel=cancel)
    assert_valid(plan, full_plan)
    assert plan.status == SolveStatus.TIMEOUT_INCUMBENT and plan.solver.num_strategies_solved == 1
    assert late == []  # nothing but the first screen: no set expanded, no polish
    cost = ProfileCostModel(PROFILE)
    assert plan.solver.num_strategies == len(_homogeneous(runnable_schemes(cost, NUM_GPUS), NUM_GPUS))
    # the first incumbent is one of the strategies the full search solved and kept the best of
    assert full_plan.objective_s <= plan.objective_s * (1 + 1e-12)
    # once cancel() says stop, every phase left asks at most once more before returning
    assert cancel.calls - cancel.expired_at <= 10


@pytest.mark.parametrize("checks", [1, 4, 40, 400, 1000])
def test_cancel_after_n_checks_stops_with_a_checked_plan(full_plan, work_after_expiry, checks):
    cancels, late = work_after_expiry
    cancel = CancelAfter(checks)
    cancels.append(cancel)
    plan = solve(request(), PROFILE, cancel=cancel)
    assert_valid(plan, full_plan)
    assert cancel.expired_at is not None, "the search ended before the clock: raise the batch"
    assert late == []
    assert plan.status == SolveStatus.TIMEOUT_INCUMBENT
    assert plan.solver.num_strategies_solved <= full_plan.solver.num_strategies_solved
    assert cancel.calls - cancel.expired_at <= 10


def test_a_clock_cut_is_deterministic():
    first, second = (solve(request(), PROFILE, cancel=CancelAfter(40)) for _ in range(2))
    assert first.model_dump(exclude={"solver"}) == second.model_dump(exclude={"solver"})


@pytest.mark.parametrize("solver", ["greedy", "lp", "auto"])
def test_a_tiny_budget_on_a_large_batch_binds(solver):
    """256 GPUs and ~2,700 sequences: the full search takes over a second of CPU, the budget is 0.2 s.
    The budgeted solve is compared with the full search, run just after it under the same load (a
    fixed wall limit failed a correct build at load 15 on 2 cores: 4.5-5 s)."""
    profile = synthetic_profile(max_gpus=256)
    lengths = wikipedia_like_batch(2_000_000, seed=1)
    started = time.perf_counter()
    plan = solve(request(0.2, solver, lengths, 256), profile)
    budgeted_s = time.perf_counter() - started
    assert check_plan(plan, profile) == [] and plan.lower_bound_s <= plan.objective_s
    assert plan.status == SolveStatus.TIMEOUT_INCUMBENT
    started = time.perf_counter()
    full = solve(request(600.0, solver, lengths, 256), profile)
    full_s = time.perf_counter() - started
    assert not full.solver.cut_by_clock
    # the clock cut the search short: fewer strategies solved, less time (what stays after the cut,
    # the baselines' plans, the plan's build and check, is about half of the full solve here)
    assert plan.solver.num_strategies_solved < full.solver.num_strategies_solved
    assert budgeted_s < full_s, (budgeted_s, full_s)


@pytest.mark.parametrize("solver", ["cpsat", "pulp"])
def test_a_milp_too_large_to_build_in_time_is_skipped(solver):
    """128 one-GPU pipelines and 3,000 sequences: a 384K-variable dispatch model, ~10 s to build
    in Python, under a 0.3 s budget."""
    scheme = SchemeCost(tp=1, pp=1, cp=1, a=1e-10, b=5e-5, c=1e-3, capacity_tokens=8192)
    profile = CostProfile(source="user", model="m", gpu="g", num_layers=8, schemes=[scheme])
    lengths = [200 + (97 * index) % 3000 for index in range(3000)]
    started = time.perf_counter()
    plan = solve(request(0.3, solver, lengths, 128), profile)
    assert time.perf_counter() - started < 10 * 0.3
    assert check_plan(plan, profile) == [] and plan.strategy == "128x<1,1,1>"


class FakeTime:
    """A clock whose time passes only when it is read: `step_s` per reading."""

    def __init__(self, budget_s: float, step_s: float) -> None:
        self.left_s, self.step_s, self.readings = budget_s, step_s, 0

    def remaining_s(self) -> float:
        self.readings += 1
        self.left_s -= self.step_s
        return self.left_s


@pytest.mark.parametrize("step_s", [0.3, 0.05, 0.01])
def test_search_stops_at_a_fake_clock_with_a_valid_bound(full_plan, step_s):
    cost = ProfileCostModel(PROFILE)
    lengths = np.asarray(LENGTHS, dtype=np.int64)
    settings = SearchSettings(SolverBackend.AUTO, max_schemes=3, max_strategies_solved=16, seed=0, thorough=False)
    results = []
    for _ in range(2):
        fake = FakeTime(budget_s=1.0, step_s=step_s)
        results.append(search(lengths, cost, NUM_GPUS, settings, Clock(fake.remaining_s, lambda: False), 1.0))
    first, second = results
    assert first is not None and first.timed_out
    assert first.lower_bound_s <= min(first.best.objective_s, full_plan.objective_s) * (1 + 1e-12)
    assert first.num_strategies_solved <= settings.max_strategies_solved
    # the same readings of the clock give the same search
    assert str(first.best.strategy) == str(second.best.strategy) and first.lower_bound_s == second.lower_bound_s
    assert first.best.objective_s == second.best.objective_s


def seeding_inputs():
    """What scheme-set seeding starts from: costs, runnable schemes, bound tables, an incumbent."""
    cost = ProfileCostModel(PROFILE)
    lengths = np.asarray(LENGTHS, dtype=np.int64)
    coefs = runnable_schemes(cost, NUM_GPUS)
    tables = BoundTables.build(lengths, coefs)
    solved = (solve_strategy(strategy, lengths, cost) for strategy in _homogeneous(coefs, NUM_GPUS))
    return cost, coefs, tables, next(candidate for candidate in solved if candidate is not None)


@pytest.mark.parametrize("blocks", [0, 1, 7, 60, 300])
def test_seeding_cut_short_keeps_a_floor_under_every_set(blocks):
    """Sets left out when seeding stops are covered by the frontier's floor: no set's bound, as
    full seeding computes it, is below the lower bound the cut frontier reports."""
    cost, coefs, tables, incumbent = seeding_inputs()

    def frontier_seeded(should_stop) -> tuple[Frontier, bool]:
        frontier = Frontier(tables, cost, NUM_GPUS)
        clock = Clock(remaining_s=lambda: math.inf, cancelled=should_stop)
        _seed_sets(frontier, coefs, cost, NUM_GPUS, 3, incumbent.objective_s, clock)
        return frontier, clock.cut

    full, full_cut = frontier_seeded(lambda: False)
    counter = CancelAfter(blocks)
    cut, was_cut = frontier_seeded(counter)
    assert not full_cut and was_cut
    assert len(cut.sets) < len(full.sets)
    least_full = min(bound for bound, _, _ in full.sets)
    assert cut.lower_bound_s() <= least_full * (1 + 1e-12)
    listed = {columns for _, _, columns in cut.sets}
    unlisted = [bound for bound, _, columns in full.sets if columns not in listed]
    assert unlisted and cut.floor_s <= min(unlisted) * (1 + 1e-12)
    full_bounds = {columns: bound for bound, _, columns in full.sets}
    assert all(full_bounds[columns] == bound for bound, _, columns in cut.sets)  # listed sets as in full
    assert cut.set_pricing is not None  # the bounds can still be tightened after the search


def test_set_packing_bound_stopped_early_keeps_what_it_proved():
    """40 long sequences on 32 GPUs: the set packing bound raises many sets; stopped after its
    first chunk of step times it raises fewer, never above the full bound, never below the start."""
    cost = ProfileCostModel(synthetic_profile(max_gpus=32))
    lengths = np.random.default_rng(1).integers(8000, 30000, size=40)
    coefs = runnable_schemes(cost, 32)
    tables = BoundTables.build(lengths, coefs)
    floors = SyncFloors(cost, coefs, 32)
    bounds = dict(itertools.islice(tables.all_set_bounds(3, 32), 200))
    sets = list(bounds)
    start = np.array([bounds[columns] + floors(columns) for columns in sets])
    cap_s = float(start.max() * 1.5)
    full = tables.set_packing_bounds_s(sets, 32, floors, start, cap_s)
    early = tables.set_packing_bounds_s(sets, 32, floors, start, cap_s, should_stop=lambda: True)
    assert (start <= early).all() and (early <= full).all()
    assert (early > start).any() and (full > early).any()


def test_search_solves_a_few_searched_strategies_when_the_expansions_end_at_the_polish_share(monkeypatch):
    """Time is plenty until the first scheme set is expanded, then it falls inside the polish's
    share: the search proper still solves MIN_SEARCH_SOLVES queued strategies (the deadline is
    not reached) instead of handing the polish the homogeneous incumbents alone, and no more."""
    cost = ProfileCostModel(PROFILE)
    lengths = np.asarray(LENGTHS, dtype=np.int64)
    settings = SearchSettings(SolverBackend.AUTO, max_schemes=3, max_strategies_solved=16, seed=0, thorough=False)
    time_limit_s = 1.0
    polish_reserve_s = time_limit_s * (1 - search_module.SEARCH_TIME_SHARE[SolverBackend.AUTO])
    left = {"s": 100.0}
    solves_before_the_drop: list[int] = []
    calls = {"solves": 0}
    first_solution, expand_next = search_module._first_solution, search_module.Frontier.expand_next

    def counted_solution(*args, **kwargs):
        calls["solves"] += 1
        return first_solution(*args, **kwargs)

    def expand_then_drop(self, *args, **kwargs):
        expand_next(self, *args, **kwargs)
        if not solves_before_the_drop:
            solves_before_the_drop.append(calls["solves"])
        left["s"] = polish_reserve_s / 2  # inside the polish's share, before the deadline

    monkeypatch.setattr(search_module, "_first_solution", counted_solution)
    monkeypatch.setattr(search_module.Frontier, "expand_next", expand_then_drop)
    result = search(lengths, cost, NUM_GPUS, settings, Clock(lambda: left["s"], lambda: False), time_limit_s)
    assert result is not None and result.timed_out
    assert solves_before_the_drop and solves_before_the_drop[0] >= 1
    assert result.num_strategies_solved == solves_before_the_drop[0] + search_module.MIN_SEARCH_SOLVES
