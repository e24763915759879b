"""Real determinism: the work limits, not the clock, decide what is searched; a plan the clock
cut says so; `plan_id` is the hash of the plan's content, `request_hash` that of its request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from synthetic import synthetic_profile, wikipedia_like_batch

from hydraplan.planner.build import identified
from hydraplan.planner.milp import solve_milp
from hydraplan.planner.schemas import Plan, PlanRequest, SolverOptions, SolveStatus
from hydraplan.planner.solve import solve

PROFILE = synthetic_profile(max_gpus=16)


def request(lengths, **options) -> PlanRequest:
    options.setdefault("time_limit_s", 5.0)
    return PlanRequest(lengths=lengths, num_gpus=16, gpus_per_node=8, options=SolverOptions(**options))


def test_plan_id_is_the_hash_of_the_content() -> None:
    plan = solve(request(wikipedia_like_batch(20_000, seed=5)), PROFILE)
    assert identified(plan) == plan  # recomputing changes nothing
    # any change to the content changes the id; the request hash stays the request's
    changed = identified(plan.model_copy(update={"step_time_s": plan.step_time_s * 1.01}))
    assert changed.plan_id != plan.plan_id and changed.request_hash == plan.request_hash
    reseeded = identified(plan.model_copy(update={"solver": plan.solver.model_copy(update={"seed": 9})}))
    assert reseeded.plan_id != plan.plan_id
    # and the id is not part of what it hashes: forging it is visible
    forged = plan.model_copy(update={"plan_id": "hp-" + "0" * 20})
    assert identified(forged).plan_id == plan.plan_id != forged.plan_id


def test_a_search_the_clock_cut_says_so() -> None:
    lengths = wikipedia_like_batch(60_000, seed=6)
    calls = {"n": 0}

    def cancel_soon() -> bool:  # cancels a few questions in: the clock, not the work, ends it
        calls["n"] += 1
        return calls["n"] > 3

    cut = solve(request(lengths), PROFILE, cancel=cancel_soon)
    assert cut.solver.cut_by_clock
    assert cut.status == SolveStatus.TIMEOUT_INCUMBENT  # never 'optimal', whatever its gap
    full = solve(request(lengths), PROFILE)
    assert not full.solver.cut_by_clock and full.status != SolveStatus.TIMEOUT_INCUMBENT
    assert cut.plan_id != full.plan_id  # the flag alone makes them different plans


def test_a_plan_the_clock_cut_is_never_optimal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Within the gap tolerance (here any gap is), a search the clock cut is still
    `timeout_incumbent`: 'optimal' is never said beside 'cut by the clock'."""
    import dataclasses

    import hydraplan.planner.solve as solve_module

    lengths = wikipedia_like_batch(20_000, seed=5)
    uncut = solve(request(lengths, gap_tolerance=1.0), PROFILE)
    assert uncut.status == SolveStatus.OPTIMAL and not uncut.solver.cut_by_clock
    real_search = solve_module.search
    monkeypatch.setattr(solve_module, "search", lambda *args: dataclasses.replace(real_search(*args), timed_out=True))
    cut = solve(request(lengths, gap_tolerance=1.0), PROFILE)
    assert cut.solver.cut_by_clock and cut.gap == uncut.gap
    assert cut.status == SolveStatus.TIMEOUT_INCUMBENT


def test_a_milp_the_wall_clock_ended_is_reported() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(100, 4000, size=300)
    coefs = [PROFILE_COEF] * 8
    cuts: list[bool] = []
    result = solve_milp("cpsat", lengths, coefs, 50.0, 0, wall_limit_s=0.01, on_wall_cut=lambda: cuts.append(True))
    assert cuts == [True] and (result is None or not result.proven_optimal)
    finished: list[bool] = []
    small = solve_milp(
        "cpsat", lengths[:4], coefs[:2], 5.0, 0, wall_limit_s=5.0, on_wall_cut=lambda: finished.append(1)
    )
    assert small is not None and small.proven_optimal and finished == []


def _first_coef():
    from hydraplan.planner.cost import ProfileCostModel

    cost = ProfileCostModel(PROFILE)
    return cost.coefficients(min(cost.schemes(), key=lambda scheme: scheme.num_gpus))


PROFILE_COEF = _first_coef()


# The README's default plan with the clock standing still: only the work limits end the search.
# Prints the solve's CPU time, the CPU time of a fixed reference workload run just before and
# just after it in the same process, and the plan's id (content hash).
CLOCKLESS = """
import json, sys, time
import numpy as np
from hydraplan import plan

def reference_cpu_s():
    started = time.process_time()
    values = np.random.default_rng(0).random((400, 400))
    for _ in range(20):
        values = np.sort(values, axis=1) @ values.T / 400.0
    total = 0
    for index in range(300_000):
        total += index * index % 7
    return time.process_time() - started

lengths = json.load(open(sys.argv[1]))
plan(lengths[:200], time_limit_s=0.5)  # imports, compiled kernels, caches: not measured
time.perf_counter = lambda: 0.0
before = reference_cpu_s()
started = time.process_time()
made = plan(lengths)
cpu_s = time.process_time() - started
reference_s = (before + reference_cpu_s()) / 2
cut = made.solver.cut_by_clock
print(json.dumps({"cpu_s": cpu_s, "reference_s": reference_s, "plan_id": made.plan_id, "cut": cut}))
"""
# The work-limited default search may need at most half the 2 s budget in CPU seconds on a quiet
# 2-core EPYC (the rest is the margin for three CPU-bound neighbours, which leave it ~half a core);
# it needed 0.44 s there. CPU seconds are not load-proof on this shared machine (at load 6-8 the
# same search took 1.34-1.64 s of CPU: the host's steal is counted), so the search is measured
# against the reference workload above, run beside it under the same load: their ratio was
# 2.3-2.8 at load 6-8 (a ratio holds where absolute CPU seconds do not). 5.0 is about twice that:
# a default search that needs twice the work it needs today fails here.
DEFAULT_CPU_RATIO = 5.0


@pytest.mark.slow
def test_default_plans_are_byte_identical_under_cpu_load(tmp_path: Path) -> None:
    """The README's first command (8B on 64 H100s, ~1M tokens of Wikipedia, every default), run in
    fresh processes with different hash seeds while a CPU-bound process competes for the cores.

    What does not depend on the machine's load is checked always: with the clock standing still the
    work limits alone end the search, within half the budget's CPU time (measured against a
    reference workload beside it, as CPU time itself grows with the host's load). Each real run the clock
    did not cut is then byte-identical to the other and has that plan's id; a run the load made
    the clock cut (`solver.cut_by_clock`) is reported by the plan itself and compared with nothing.
    """
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        outputs = []
        for run in range(2):
            env = {**os.environ, "PYTHONHASHSEED": str(run + 1)}
            done = subprocess.run(
                [sys.executable, "-m", "hydraplan.api.cli", "plan", "--json"],
                check=True,
                capture_output=True,
                env=env,
                timeout=120,
            )
            outputs.append(done.stdout)
        plans = [Plan.model_validate_json(text) for text in outputs]
        lengths = tmp_path / "lengths.json"
        lengths.write_text(json.dumps(plans[0].input_lengths))
        clockless = subprocess.run(
            [sys.executable, "-c", CLOCKLESS, str(lengths)], check=True, capture_output=True, text=True, timeout=300
        )
    finally:
        burner.kill()
        burner.wait()
    reference = json.loads(clockless.stdout.strip().splitlines()[-1])
    assert plans[0].num_gpus == 64 and plans[0].cost_profile.model == "llama3-8b"
    assert not reference["cut"]
    assert plans[0].solver.time_limit_s == 2.0
    assert reference["cpu_s"] <= DEFAULT_CPU_RATIO * reference["reference_s"], reference
    uncut = [(plan, text) for plan, text in zip(plans, outputs) if not plan.solver.cut_by_clock]
    for plan, _ in uncut:
        assert plan.plan_id == reference["plan_id"], "a run the clock did not cut differs from the work-limited plan"
    if len(uncut) == 2:
        assert outputs[0] == outputs[1]


def test_ctrl_c_after_a_cp_sat_solve_is_still_a_keyboard_interrupt(tmp_path: Path) -> None:
    """CP-SAT's own SIGINT handler would stay installed after a solve (a later Ctrl-C then kills the
    process with no message): the planner keeps Python's handler. The signal is raised in the main
    thread: sent to the process, it may land on a solver thread still alive, and the main thread's
    sleep then runs to its end and the script exits before Python looks at the pending signal (seen
    at load 15)."""
    script = tmp_path / "interrupt.py"
    script.write_text(
        "import os, signal, time\n"
        "import numpy as np\n"
        "from hydraplan.planner.milp import solve_milp\n"
        "from hydraplan.planner.cost import ProfileCostModel\n"
        "from hydraplan import analytic_profile\n"
        "cost = ProfileCostModel(analytic_profile('tiny', 'h100-sxm-80gb', num_gpus=8))\n"
        "coef = cost.coefficients(min(cost.schemes(), key=lambda s: s.num_gpus))\n"
        "assert solve_milp('cpsat', np.array([100, 200, 300]), [coef, coef], 1.0, 0) is not None\n"
        "try:\n"
        "    signal.raise_signal(signal.SIGINT)\n"
        "    time.sleep(2)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "interrupted", done.stderr
