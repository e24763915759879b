"""Exact dispatch (+ packing) models for a fixed strategy, solved by OR-Tools CP-SAT or PuLP/CBC.

One model, two backends: the builder talks to a small adapter (`binary`, `integer`, `add`,
`minimise`, `solve`) that each backend implements. All times are integer ticks
(`scale` ticks per second, at least 1e6 ticks per pipeline load) so CP-SAT can take them; the
caller re-evaluates the decoded plan in floats with the exact 1F1B simulation.

Joint model (small instances), exact for pp = 1 and an upper bound of 1F1B for pp > 1
(1F1B never exceeds `sum(t) + (pp-1) max(t)`):
  x[i,p,b]  item i in micro-batch slot b of pipeline p (only where i fits p's capacity)
  u[p,b]    slot b of pipeline p is used; t[p,b] its stage time; top[p] its largest slot time
  minimise T  s.t. each item once; slot tokens <= capacity * u; a used slot holds an item;
  t = sum w x + c u; top >= t;
  sum_b t + (pp-1) top <= T; slots used in order; slot 0 used (no idle pipeline).
Dispatch model (large instances):
  x[i,p] item i on pipeline p; minimise T s.t. each item once; every pipeline gets an item;
  rho_p * sum_i w_ip x[i,p] + K_p <= T, with rho_p the packing inflation measured on an incumbent.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.planner.cost import SchemeCoefficients

JOINT_MODEL_LIMIT = 2_000  # x variables; above it the dispatch model is used


@dataclass(frozen=True)
class MilpResult:
    assignment: list[np.ndarray]  # item indices per pipeline
    micro_batches: list[list[np.ndarray]] | None  # joint model only: slots per pipeline
    proven_optimal: bool


# CP-SAT's deterministic time per CPU second of its one worker, measured on the dispatch models of
# the tests' 64-sequence tiny batch (2-core EPYC: 0.058-0.083 units in 0.13-0.18 CPU s, i.e.
# 0.45); a little below, so that the work limit ends a solve within its share of the budget
CPSAT_DETERMINISTIC_PER_CPU_S = 0.4


class CpSatAdapter:
    def __init__(self) -> None:
        from ortools.sat.python import cp_model

        self._cp = cp_model
        self.model = cp_model.CpModel()
        self._solver = cp_model.CpSolver()

    def binary(self, name: str):
        return self.model.NewBoolVar(name)

    def integer(self, upper: int, name: str):
        return self.model.NewIntVar(0, upper, name)

    def add(self, terms, sense: str, rhs: int) -> None:
        expression = sum(coefficient * variable for coefficient, variable in terms)
        if sense == "<=":
            self.model.Add(expression <= rhs)
        elif sense == ">=":
            self.model.Add(expression >= rhs)
        else:
            self.model.Add(expression == rhs)

    def minimise(self, variable) -> None:
        self.model.Minimize(variable)

    def hint(self, variable, value: int) -> None:
        self.model.AddHint(variable, value)

    def solve(self, work_limit_s: float, seed: int, wall_limit_s: float) -> tuple[str, bool]:
        """Status, and whether the wall-time cap (not the deterministic work limit) ended it.

        `work_limit_s` is CPU seconds on the reference machine, turned into CP-SAT's deterministic
        time, which then ends the solve whatever the machine's load."""
        work = max(0.005, work_limit_s * CPSAT_DETERMINISTIC_PER_CPU_S)
        self._solver.parameters.max_deterministic_time = work
        self._solver.parameters.max_time_in_seconds = max(0.01, wall_limit_s)
        self._solver.parameters.num_workers = 1
        self._solver.parameters.random_seed = seed
        status = self._solver.Solve(self.model)
        if status == self._cp.OPTIMAL:
            return "optimal", False
        # stopped early: by the work limit (deterministic) unless its work fell short of it
        cut = self._solver.deterministic_time < 0.99 * work
        return ("feasible" if status == self._cp.FEASIBLE else "none"), cut

    def value(self, variable) -> float:
        return float(self._solver.Value(variable))


class PulpAdapter:
    def __init__(self) -> None:
        import pulp

        self._pulp = pulp
        self.model = pulp.LpProblem("dispatch", pulp.LpMinimize)
        self._count = 0

    def _name(self, name: str) -> str:
        self._count += 1
        return f"{name}_{self._count}"

    def binary(self, name: str):
        return self.model.add_variable(self._name(name), 0, 1, cat="Binary")

    def integer(self, upper: int, name: str):
        return self.model.add_variable(self._name(name), 0, upper, cat="Integer")

    def add(self, terms, sense: str, rhs: int) -> None:
        expression = self._pulp.lpSum(coefficient * variable for coefficient, variable in terms)
        self.model += (
            (expression <= rhs) if sense == "<=" else (expression >= rhs) if sense == ">=" else (expression == rhs)
        )

    def minimise(self, variable) -> None:
        self.model += variable

    def hint(self, variable, value: int) -> None:
        variable.setInitialValue(value)

    def solve(self, work_limit_s: float, seed: int, wall_limit_s: float) -> tuple[str, bool]:
        """Status, and whether the time limit ended it: CBC has no deterministic work limit, so
        every solve it does not finish is ended by the wall clock."""
        pulp = self._pulp
        with warnings.catch_warnings():
            # the bundled CBC binary is what PuLP 3 ships; its 4.0 deprecation notice is noise here
            warnings.simplefilter("ignore", DeprecationWarning)
            limit_s = max(0.05, min(work_limit_s, wall_limit_s))
            solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=limit_s, threads=1)
            self.model.solve(solver)
        # PuLP reports "Optimal" at a time limit; the solution status tells the truth.
        if self.model.sol_status == pulp.LpSolutionOptimal:
            return "optimal", False
        return ("feasible" if self.model.sol_status == pulp.LpSolutionIntegerFeasible else "none"), True

    def value(self, variable) -> float:
        return float(variable.value() or 0.0)


ADAPTERS = {"cpsat": CpSatAdapter, "pulp": PulpAdapter}


def solve_milp(
    backend: str,
    lengths: np.ndarray,
    coefs: Sequence[SchemeCoefficients],
    work_limit_s: float,
    seed: int,
    inflation: Sequence[float] | None = None,
    hint: Sequence[np.ndarray] | None = None,
    wall_limit_s: float | None = None,
    on_wall_cut: Callable[[], None] = lambda: None,
) -> MilpResult | None:
    """Best assignment the backend finds within the work limit (CP-SAT's deterministic time;
    CBC's wall time) and the wall-time cap (default: the work limit), or None when it finds none.
    `on_wall_cut()` is called when the wall clock, not the work limit, ended the solve."""
    fits = [[p for p, coef in enumerate(coefs) if lengths[i] <= coef.capacity_tokens] for i in range(len(lengths))]
    if any(not any(p in options for options in fits) for p in range(len(coefs))):
        return None  # some pipeline can hold no item: every plan would leave it idle
    joint = sum(len(options) for options in fits) * len(lengths) <= JOINT_MODEL_LIMIT
    adapter = ADAPTERS[backend]()
    scale = _ticks_per_second(lengths, coefs)
    if joint:
        decode = _build_joint(adapter, lengths, coefs, fits, scale)
    else:
        decode = _build_dispatch(adapter, lengths, coefs, fits, scale, inflation or [1.0] * len(coefs), hint)
    status, cut = adapter.solve(work_limit_s, seed, work_limit_s if wall_limit_s is None else wall_limit_s)
    if cut:
        on_wall_cut()
    if status == "none":
        return None
    return decode(status == "optimal")


def _ticks_per_second(lengths: np.ndarray, coefs: Sequence[SchemeCoefficients]) -> float:
    """At least 1e6 ticks for the smallest possible pipeline load (one fair share of the work)."""
    share = min(float(coef.work_s(lengths).sum()) for coef in coefs) / len(coefs)
    return 1e6 / max(share, 1e-12)


def _ticks(seconds: float, scale: float) -> int:
    return int(round(seconds * scale))


def _build_joint(adapter, lengths, coefs, fits, scale):
    num_items = len(lengths)
    slots = {p: range(sum(1 for options in fits if p in options)) for p in range(len(coefs))}
    x = {(i, p, b): adapter.binary("x") for i in range(num_items) for p in fits[i] for b in slots[p]}
    used = {(p, b): adapter.binary("u") for p in slots for b in slots[p]}
    horizon = _ticks(sum(float(coef.work_s(lengths).sum()) + len(lengths) * coef.c for coef in coefs) * 2, scale) + 1
    times = {key: adapter.integer(horizon, "t") for key in used}
    top = {p: adapter.integer(horizon, "top") for p in slots}
    makespan = adapter.integer(horizon * 4, "T")
    _place_each_item_once(adapter, {i: [x[i, p, b] for p in fits[i] for b in slots[p]] for i in range(num_items)})
    for (p, b), slot_used in used.items():
        members = [(i, x[i, p, b]) for i in range(num_items) if (i, p, b) in x]
        adapter.add([(int(lengths[i]), var) for i, var in members] + [(-coefs[p].capacity_tokens, slot_used)], "<=", 0)
        adapter.add([(1, var) for _, var in members] + [(-1, slot_used)], ">=", 0)  # a used slot holds an item
        work = [(_ticks(float(coefs[p].work_s(lengths[i : i + 1])[0]), scale), var) for i, var in members]
        adapter.add(
            [(1, times[p, b])] + [(-w, var) for w, var in work] + [(-_ticks(coefs[p].c, scale), slot_used)], "==", 0
        )
        adapter.add([(1, top[p]), (-1, times[p, b])], ">=", 0)
        if b > 0:
            adapter.add([(1, slot_used), (-1, used[p, b - 1])], "<=", 0)
    for p in slots:
        adapter.add([(1, used[p, 0])], "==", 1)
        stage_sum = [(1, times[p, b]) for b in slots[p]] + [(coefs[p].scheme.pp - 1, top[p])]
        adapter.add(stage_sum + [(-1, makespan)], "<=", 0)
    adapter.minimise(makespan)

    def decode(optimal: bool) -> MilpResult:
        batches = [
            [
                np.asarray(
                    [i for i in range(num_items) if (i, p, b) in x and adapter.value(x[i, p, b]) > 0.5], dtype=np.int64
                )
                for b in slots[p]
            ]
            for p in slots
        ]
        batches = [[batch for batch in pipeline if len(batch)] for pipeline in batches]
        assignment = [np.sort(np.concatenate(p)) if p else np.empty(0, dtype=np.int64) for p in batches]
        return MilpResult(assignment, batches, optimal)

    return decode


def _place_each_item_once(adapter, choices: dict[int, list]) -> None:
    for variables in choices.values():
        adapter.add([(1, variable) for variable in variables], "==", 1)


def _build_dispatch(adapter, lengths, coefs, fits, scale, inflation, hint):
    num_items = len(lengths)
    x = {(i, p): adapter.binary("x") for i in range(num_items) for p in fits[i]}
    loads = [
        [
            (_ticks(inflation[p] * float(coefs[p].work_s(lengths[i : i + 1])[0]), scale), x[i, p])
            for i in range(num_items)
            if (i, p) in x
        ]
        for p in range(len(coefs))
    ]
    horizon = (
        sum(weight for pipeline in loads for weight, _ in pipeline)
        + _ticks(max((c.scheme.pp - 1) * c.c for c in coefs), scale)
        + 1
    )
    makespan = adapter.integer(horizon, "T")
    _place_each_item_once(adapter, {i: [x[i, p] for p in fits[i]] for i in range(num_items)})
    for p, coef in enumerate(coefs):
        adapter.add([(1, var) for _, var in loads[p]], ">=", 1)
        adapter.add(loads[p] + [(-1, makespan)], "<=", -_ticks((coef.scheme.pp - 1) * coef.c, scale))
    adapter.minimise(makespan)
    if hint is not None:
        owner = {int(i): p for p, items in enumerate(hint) for i in items}
        for (i, p), var in x.items():
            adapter.hint(var, 1 if owner.get(i) == p else 0)

    def decode(optimal: bool) -> MilpResult:
        assignment = [
            np.asarray([i for i in range(num_items) if (i, p) in x and adapter.value(x[i, p]) > 0.5], dtype=np.int64)
            for p in range(len(coefs))
        ]
        return MilpResult(assignment, None, optimal)

    return decode
