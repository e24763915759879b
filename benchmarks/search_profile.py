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

    python benchmarks/search_profile.py --to-final --settings 70b-256xh100 --seeds 0 1 --repeats 5

`--to-final` measures instead the CPU to the final plan: when (CPU seconds into the solve, the clock
standing still) the strategy of the returned plan is first solved, when a solve or polish first
reaches the plan's step time (the last refinements may gain a little more), when the search proper ends
(the baselines' plans are asked for), and the whole solve, for the search as it is ("after") and
with probes off ("before": `search.PROBE_EVERY = 0`, the order before them), alternating in one
process, median of `--repeats`. This machine's pace varies over minutes: compare the columns of
one run (ratios), not runs. Section `search_profile_to_final`.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import math
import pstats
import statistics
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


# the search's order before probes, as module settings the "before" runs set (the same process): probes
# off, and with them the polishes ahead; the cheaper kernels of the same session are in both
VARIANTS: dict[str, dict[str, object]] = {"before": {"PROBE_EVERY": 0}, "after": {}}
# ... and, for --to-final, the search as a slow machine runs it: polishes ahead from the first probe
# on (`search.EARLY_POLISH_AFTER_SHARE`; the clock standing still never says the search is late)
SLOW = "after, slow machine"
TO_FINAL_VARIANTS: dict[str, dict[str, object]] = {**VARIANTS, SLOW: {"EARLY_POLISH_AFTER_SHARE": -1.0}}


@contextmanager
def variant(name: str) -> Iterator[None]:
    """The search module with `TO_FINAL_VARIANTS[name]`'s settings (restored on exit)."""
    saved = {key: getattr(search_module, key) for key in TO_FINAL_VARIANTS[name]}
    for key, value in TO_FINAL_VARIANTS[name].items():
        setattr(search_module, key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(search_module, key, value)


def to_final_plan(name: str, seed: int, variant_name: str) -> tuple[float, float, float, float, str, float]:
    """One solve of the setting's batch, the clock standing still: (CPU s when the returned plan's
    strategy was first solved, CPU s when a solve or polish first reached the plan's step time, CPU s
    when the search proper ended, CPU s of the solve, the plan's strategy, its step time s)."""
    setting = SETTINGS[name]
    lengths = batch_lengths(setting.datasets[0], setting.num_tokens, seed, setting.context_cap)
    profile = profile_for(setting.model, setting.gpu, setting.num_gpus)
    request = make_request(lengths, setting.num_gpus, "auto", setting.time_limit_s, seed)
    solved: list[tuple[float, str]] = []
    reached: list[tuple[float, float]] = []  # (CPU s, objective s) of every solve and polish
    search_end = [math.nan]
    started = [0.0]
    first_solution, polish, peers = (
        search_module._first_solution,
        search_module.polish_candidate,
        solve_module.peer_candidates,
    )

    def noted_solution(strategy, *args, **kwargs):
        candidate = first_solution(strategy, *args, **kwargs)
        solved.append((time.process_time() - started[0], str(strategy)))
        if candidate is not None:
            reached.append((time.process_time() - started[0], candidate.objective_s))
        return candidate

    def noted_polish(*args, **kwargs):
        candidate = polish(*args, **kwargs)
        reached.append((time.process_time() - started[0], candidate.objective_s))
        return candidate

    def noted_peers(*args, **kwargs):
        search_end[0] = time.process_time() - started[0]
        return peers(*args, **kwargs)

    with clock_standing_still(True), variant(variant_name):
        search_module._first_solution, search_module.polish_candidate = noted_solution, noted_polish
        solve_module.peer_candidates = noted_peers
        try:
            started[0] = time.process_time()
            plan = solve_module.solve(request, profile)
            total = time.process_time() - started[0]
        finally:
            search_module._first_solution, search_module.polish_candidate = first_solution, polish
            solve_module.peer_candidates = peers
    final = str(plan.strategy)
    first = next((at for at, text in solved if text == final), math.nan)  # nan: a baseline's own plan
    # nan: only the last refinements (or a baseline's plan) reached it
    step = next((at for at, objective in reached if objective <= plan.step_time_s * (1 + 1e-9)), math.nan)
    return first, step, search_end[0], total, final, plan.step_time_s


def to_final_report(names: list[str], seeds: list[int], repeats: int) -> tuple[str, str]:
    """(table, body) of `to_final_plan` per setting and seed and variant (`TO_FINAL_VARIANTS`), medians."""
    rows, notes = [], []
    for name in names:
        for seed in seeds:
            for variant_name in TO_FINAL_VARIANTS:  # caches, compiled kernels
                to_final_plan(name, seed, variant_name)
            runs: dict[str, list[tuple[float, float, float, float, str, float]]] = {v: [] for v in TO_FINAL_VARIANTS}
            for _ in range(repeats):
                for variant_name in TO_FINAL_VARIANTS:
                    runs[variant_name].append(to_final_plan(name, seed, variant_name))
            medians = {v: [statistics.median(run[i] for run in runs[v]) for i in range(4)] for v in TO_FINAL_VARIANTS}
            plans = {(run[4], round(run[5], 6)) for v in TO_FINAL_VARIANTS for run in runs[v]}
            before = medians["before"]

            def cell(index: int, medians=medians, before=before) -> str:
                values = [medians[v][index] for v in TO_FINAL_VARIANTS]
                ratios = [f"{value / before[index]:.2f}x" for value in values[1:]]
                shown = " / ".join("-" if math.isnan(value) else f"{value:.3f}" for value in values)
                return shown if math.isnan(before[index]) else f"{shown} ({', '.join(ratios)})"

            rows.append([name, str(seed), *(cell(index) for index in range(4)), "yes" if len(plans) == 1 else "NO"])
            strategy, step_s = runs["after"][0][4], runs["after"][0][5]
            notes.append(f"`{name}` seed {seed}: {strategy}, {step_s * 1e3:,.1f} ms")
            print(f"{name} seed {seed}: {rows[-1][2:]}", file=sys.stderr)
    columns = " / ".join(TO_FINAL_VARIANTS)
    headers = [
        "setting",
        "seed",
        f"CPU s to the final plan's strategy ({columns})",
        "CPU s to the final plan's step time",
        "CPU s to the search's end",
        "CPU s of the solve",
        "same plan",
    ]
    table = markdown_table(headers, rows)
    body = "\n\n".join(
        [
            f"Medians of {repeats} solves per variant, alternating in one process, the clock standing still "
            "(work limits only). before: probes off (`search.PROBE_EVERY = 0`, the search's order until "
            f"now); after: the search as it is; {SLOW}: as it is where the clock says the search is late "
            "(polishes ahead from the first probe on: `search.EARLY_POLISH_AFTER_SHARE`). Ratios against "
            "before; `-`: no solve or polish reached the plan's step time (the last refinements did).",
            table,
            "Plans (the same in every run and variant): " + "; ".join(notes) + ".",
        ]
    )
    return table, body


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
    parser.add_argument("--to-final", action="store_true", help="CPU to the final plan, before / after")
    parser.add_argument("--repeats", type=int, default=5, help="solves per variant with --to-final")
    args = parser.parse_args(argv)
    if args.to_final:
        table, body = to_final_report(args.settings, args.seeds, args.repeats)
        print(body)
        if not args.no_write:
            write_result("search_profile_to_final", command_line(), body, table, path=args.results)
        return 0
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
