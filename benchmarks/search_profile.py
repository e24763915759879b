"""Where the planner's CPU goes: per phase of `planner.solve.solve`, and the hottest functions.

    python benchmarks/search_profile.py                       # 8B / 64, 70B / 256, 8B / 1,024 H100
    python benchmarks/search_profile.py --settings 70b-256xh100 --seeds 0 1

Each setting's batch (seed 0 unless --seeds) is planned at the setting's budget with the clock
standing still (`benchmarks.quality.clock_standing_still`: the work limits alone end the search,
as in an uncut run), once untimed to load caches, then once with each phase timed in CPU seconds
(`time.process_time`, which another process's load does not inflate), then once under cProfile
for the functions with the most self time. Phases nest (an expansion bounds its strategies, the
polish refines), so their times are not meant to add up; `solve` is the whole call.

The results go to the `search_profile` section of benchmarks/RESULTS.md (`--results` for another file).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import pstats
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.common import SETTINGS, batch_lengths, make_request, profile_for  # noqa: E402
from benchmarks.quality import clock_standing_still  # noqa: E402
from benchmarks.report import RESULTS_PATH, command_line, markdown_table, write_result  # noqa: E402
from hydraplan.planner import search as search_module  # noqa: E402
from hydraplan.planner import solve as solve_module  # noqa: E402

DEFAULT_SETTINGS = ("8b-64xh100", "70b-256xh100", "8b-1024xh100")
# (module, attribute, phase name): the phases of a solve, in the order they run
PHASES = (
    (solve_module, "peer_candidates", "baselines' plans (portfolio)"),
    (search_module, "_initial_incumbents", "first incumbents (homogeneous)"),
    (search_module, "_seed_sets", "scheme-set bounds (seeding)"),
    (search_module.Frontier, "expand_next", "expansions (strategy bounds, estimates)"),
    (search_module, "_first_solution", "strategy solves (dispatch + packing)"),
    (search_module, "_polish", "polish (LP, refinement, MILP)"),
    (search_module, "polish_packings", "packing search"),
    (search_module, "_tighten_bounds", "bound tightening"),
    (solve_module, "build_plan", "building the plan"),
    (solve_module, "check_plan", "independent check"),
)
TOP_FUNCTIONS = 8


@contextmanager
def timed_phases(totals: dict[str, float]) -> Iterator[None]:
    """Wrap each phase's function to add its CPU time to `totals` (restored on exit)."""
    originals = []
    for owner, name, label in PHASES:
        original = getattr(owner, name)
        originals.append((owner, name, original))
        setattr(owner, name, _timed(original, label, totals))
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def _timed(function: Callable, label: str, totals: dict[str, float]) -> Callable:
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        started = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            totals[label] = totals.get(label, 0.0) + time.process_time() - started

    return wrapper


def profile_setting(name: str, seed: int) -> tuple[dict[str, float], list[tuple[str, float]], str]:
    """(CPU seconds per phase with `solve` the whole call, top functions by self time, plan line)."""
    setting = SETTINGS[name]
    lengths = batch_lengths(setting.datasets[0], setting.num_tokens, seed, setting.context_cap)
    profile = profile_for(setting.model, setting.gpu, setting.num_gpus)
    request = make_request(lengths, setting.num_gpus, "auto", setting.time_limit_s, seed)
    with clock_standing_still(True):
        solve_module.solve(request, profile)  # caches, compiled kernels
        totals: dict[str, float] = {}
        with timed_phases(totals):
            started = time.process_time()
            plan = solve_module.solve(request, profile)
            totals["solve"] = time.process_time() - started
        profiler = cProfile.Profile()
        profiler.enable()
        solve_module.solve(request, profile)
        profiler.disable()
    stats = pstats.Stats(profiler).stats  # (file, line, function) -> (calls, ..., self time, total, ...)
    top = sorted(((f"{Path(key[0]).name}:{key[2]}", value[2]) for key, value in stats.items()), key=lambda x: -x[1])
    summary = f"{plan.strategy}, {plan.step_time_s * 1e3:,.1f} ms, grown from {plan.solver.winner}"
    return totals, top[:TOP_FUNCTIONS], summary


def report(results: dict[str, tuple[dict[str, float], list[tuple[str, float]], str]]) -> tuple[str, str]:
    """(phase table, full body)."""
    names = list(results)
    labels = ["solve", *(label for _, _, label in PHASES)]
    rows = [[label, *(f"{results[name][0].get(label, 0.0):.3f}" for name in names)] for label in labels]
    table = markdown_table(["CPU s (clock standing still)", *names], rows)
    parts = [table, "Plans: " + "; ".join(f"`{name}` {results[name][2]}" for name in names) + "."]
    for name in names:
        top = markdown_table(["function", "self s (cProfile)"], [[f"`{f}`", f"{t:.3f}"] for f, t in results[name][1]])
        parts.append(f"### Most self time, {name}\n\n{top}")
    return table, "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS), choices=sorted(SETTINGS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--results", type=Path, default=RESULTS_PATH)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    results = {}
    for name in args.settings:
        for seed in args.seeds:
            key = name if len(args.seeds) == 1 else f"{name} seed {seed}"
            results[key] = profile_setting(name, seed)
            print(f"{key}: {results[key][0]['solve']:.3f} s of CPU", file=sys.stderr)
    table, body = report(results)
    print(table)
    if not args.no_write:
        write_result("search_profile", command_line(), body, table, path=args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
