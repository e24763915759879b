"""Planner latency, solver by solver, at three cluster sizes (issue 3, "Targets").

    python benchmarks/latency.py                          # 64, 256 and 1024 GPUs; greedy, lp, auto; 5 batches
    python benchmarks/latency.py --configs 64xh100-1M --repeats 9
    python benchmarks/latency.py --time-limit-s 2 10      # rows for both budgets
    python benchmarks/latency.py --quick                  # a smoke run of a few seconds
    python benchmarks/latency.py --scale                  # the hard budget: overrun up to 4,096 GPUs / 64M tokens
    python benchmarks/latency.py --scale --quick          # ... as a smoke run

For each cluster size, `--repeats` Wikipedia batches (seeds 0..R-1) are planned by each solver in
turn (solvers interleaved batch by batch, so machine noise falls on all of them alike) at the
planner's default time limit (2 s; `--time-limit-s` for others). One untimed solve first loads the
solver libraries. Reported per (cluster, solver, time limit): the wall time of the
`planner.solve.solve` call, p50 (median) and p95 (nearest rank: the largest of 5); the time how
many plans the clock cut (`plan.solver.cut_by_clock`: the work limits did not decide the search
alone, so the plan is not reproducible); the stages before planning (building the analytic
cost profile, sampling the batch) and the median gap of the plans, so that a fast time can be
weighed against what it buys.

Targets (issue 3): p50 <= 1 s for 64 GPUs / 1M tokens and <= 10 s for 1024 GPUs / 16M tokens.
The full output goes to benchmarks/results/latency.md (`latency_scale.md` with `--scale`) and the table to
the section of that name in benchmarks/RESULTS.md (`--results` for another file).

`--scale` measures instead how hard the planning-time budget is (issue 10): for each (cluster,
budget) of `SCALE_ROWS`, up to 4,096 GPUs and 64M tokens, `--repeats` seeded batches (8 by
default) are planned twice by the default solver: once in full, for the wall time and the overrun
(wall - budget) as a share of the budget, and once cancelled at once (`cancel` true from the
start), for the time to the first plan: the first incumbent, built and checked. Targets: a first
plan within 2 s at 1024 GPUs / 16M tokens and within 10 s at 4096 GPUs / 64M tokens, p99 overrun
<= 10% of the budget. They go to the `latency_scale` section.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    ALL_DATASETS,
    DEFAULT_TIME_LIMIT_S,
    GPUS_PER_NODE,
    SETTINGS,
    Setting,
    batch_lengths,
    fmt,
    make_request,
    median,
    percentile,
    profile_for,
    progress,
    split_names,
)
from benchmarks.report import RESULTS_PATH, command_line, markdown_table, write_result  # noqa: E402
from hydraplan.cost_models.analytic import build_profile  # noqa: E402
from hydraplan.cost_models.catalog import get_gpu, get_model  # noqa: E402
from hydraplan.planner.errors import PlanningError  # noqa: E402
from hydraplan.planner.solve import solve  # noqa: E402

# cluster sizes: the model, GPU, context cap and batch size of the quality settings
CONFIGS: dict[str, Setting] = {
    "64xh100-1M": SETTINGS["8b-64xh100"],
    "256xh100-4M": SETTINGS["70b-256xh100"],
    "1024xh100-16M": SETTINGS["8b-1024xh100"],
}
DATASET = "wikipedia"
SOLVERS = ("greedy", "lp", "auto")
TARGETS = (("64xh100-1M", 1.0, "64 GPUs / 1M tokens"), ("1024xh100-16M", 10.0, "1024 GPUs / 16M tokens"))
TARGET_SOLVER = "auto"  # the default backend: the one the targets are about

QUICK_CONFIGS = ("64xh100-1M",)
QUICK_REPEATS = 2
QUICK_TIME_LIMIT_S = 0.25
QUICK_MAX_TOKENS = 128 * 1024

# --scale: (cluster, budget) rows for the hard budget (issue 10, item 3); the 4,096-GPU cluster is
# the 1,024-GPU setting four times over
SCALE_SETTINGS: dict[str, Setting] = {
    **CONFIGS,
    "4096xh100-64M": Setting("8b-4096xh100", "llama3-8b", "h100-sxm-80gb", 4096, 32 * 1024, 64_000_000, (DATASET,)),
}
SCALE_ROWS: dict[str, tuple[str, float]] = {
    "64xh100-1M@0.1s": ("64xh100-1M", 0.1),
    "64xh100-1M@2s": ("64xh100-1M", 2.0),
    "256xh100-4M@2s": ("256xh100-4M", 2.0),
    "1024xh100-16M@0.5s": ("1024xh100-16M", 0.5),
    "1024xh100-16M@2s": ("1024xh100-16M", 2.0),
    "4096xh100-64M@2s": ("4096xh100-64M", 2.0),
    "4096xh100-64M@10s": ("4096xh100-64M", 10.0),
}
SCALE_TARGETS = (("1024xh100-16M@2s", "1024 GPUs / 16M tokens"), ("4096xh100-64M@10s", "4096 GPUs / 64M tokens"))
SCALE_OVERRUN_TARGET = 0.10  # p99 overrun, as a share of the budget
SCALE_REPEATS = 8
QUICK_SCALE_ROWS = ("64xh100-1M@0.1s",)


@dataclass
class Sample:
    config: str
    solver: str
    time_limit_s: float
    seed: int
    num_sequences: int
    profile_s: float  # build_profile, uncached
    sample_s: float  # sample_batch
    wall_s: float = float("nan")  # the solve() call
    cut_by_clock: bool = False  # plan.solver.cut_by_clock
    gap: float = float("nan")
    status: str = ""
    error: str | None = None


def measure(
    config: str, setting: Setting, dataset: str, solver: str, time_limit_s: float, seed: int, max_tokens: int | None
) -> Sample:
    started = time.perf_counter()
    profile = build_profile(get_model(setting.model), get_gpu(setting.gpu), setting.num_gpus, GPUS_PER_NODE)
    profile_s = time.perf_counter() - started
    tokens = min(setting.num_tokens, max_tokens) if max_tokens else setting.num_tokens
    started = time.perf_counter()
    lengths = batch_lengths(dataset, tokens, seed, setting.context_cap)
    sample_s = time.perf_counter() - started
    sample = Sample(config, solver, time_limit_s, seed, len(lengths), profile_s, sample_s)
    request = make_request(lengths, setting.num_gpus, solver, time_limit_s, seed)
    started = time.perf_counter()
    try:
        plan = solve(request, profile)
    except PlanningError as error:
        sample.error = str(error)
        return sample
    sample.wall_s = time.perf_counter() - started
    sample.cut_by_clock = plan.solver.cut_by_clock
    sample.gap = plan.gap
    sample.status = str(plan.status)
    return sample


def warm_up(setting: Setting) -> None:
    """One untimed small solve per solver: library imports are not charged to the first sample."""
    lengths = batch_lengths(DATASET, min(setting.num_tokens, QUICK_MAX_TOKENS), 10_000, setting.context_cap)
    profile = profile_for(setting.model, setting.gpu, setting.num_gpus)
    for solver in SOLVERS:
        try:
            solve(make_request(lengths, setting.num_gpus, solver, QUICK_TIME_LIMIT_S, 0), profile)
        except PlanningError:
            pass


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------

HEADERS = [
    "cluster",
    "solver",
    "time limit s",
    "batches",
    "sequences p50",
    "profile build ms",
    "batch sampling ms",
    "solve wall p50 s",
    "solve wall p95 s",
    "plans cut by clock",
    "gap p50 %",
]


def group(samples: list[Sample]) -> dict[tuple[str, str, float], list[Sample]]:
    groups: dict[tuple[str, str, float], list[Sample]] = {}
    for sample in samples:
        groups.setdefault((sample.config, sample.solver, sample.time_limit_s), []).append(sample)
    return groups


def table_row(key: tuple[str, str, float], samples: list[Sample]) -> list[str]:
    config, solver, limit = key
    solved = [s for s in samples if s.error is None]
    walls = [s.wall_s for s in solved]
    return [
        config,
        solver,
        f"{limit:g}",
        str(len(solved)),
        fmt(median([s.num_sequences for s in samples]), 0),
        fmt(1000 * median([s.profile_s for s in samples]), 1),
        fmt(1000 * median([s.sample_s for s in samples]), 1),
        fmt(median(walls)),
        fmt(percentile(walls, 95)),
        str(sum(s.cut_by_clock for s in solved)),
        fmt(100 * median([s.gap for s in solved])),
    ]


def targets(samples: list[Sample], max_tokens: int | None) -> list[str]:
    lines = []
    if max_tokens:
        lines.append(
            f"**Batches capped at {max_tokens} tokens: the verdicts below judge this smaller run, not the sizes "
            "of the issue.**\n"
        )
    groups = group(samples)
    for config, limit, label in TARGETS:
        keys = [key for key in groups if key[0] == config]
        if not keys:
            lines.append(f"- p50 <= {limit:g} s for {label}: not measured in this run.")
            continue
        lines.append(f"- p50 <= {limit:g} s for {label} (`{config}`):")
        for key in sorted(keys, key=lambda k: (k[2], k[1] != TARGET_SOLVER, k[1])):
            walls = [s.wall_s for s in groups[key] if s.error is None]
            if not walls:
                lines.append(f"  - `{key[1]}` at a {key[2]:g} s limit: no plan on any batch.")
                continue
            p50 = median(walls)
            note = " (the default solver)" if key[1] == TARGET_SOLVER else ""
            lines.append(
                f"  - `{key[1]}`{note} at a {key[2]:g} s limit: {'met' if p50 <= limit else 'MISSED'} "
                f"(p50 {p50:.2f} s, p95 {percentile(walls, 95):.2f} s)."
            )
    return lines


def report_body(samples: list[Sample], dataset: str, run_lines: list[str], max_tokens: int | None) -> tuple[str, str]:
    groups = group(samples)
    table = markdown_table(HEADERS, [table_row(key, rows) for key, rows in groups.items()])
    configs = list(dict.fromkeys(s.config for s in samples))
    parts = [
        "Clusters: " + "; ".join(f"`{c}` {CONFIGS[c].describe()}" for c in configs) + f"; dataset {dataset}.",
        *run_lines,
        "Columns: `solve wall` is the wall time of `planner.solve.solve` (p95 nearest-rank); `plans cut by clock` "
        "counts the plans (of `batches`) whose search the time limit, not the work limits, ended (not reproducible); "
        "profile build (analytic, uncached) and batch sampling come before planning.",
        table,
    ]
    errors = [s for s in samples if s.error]
    if errors:
        parts.append(
            "Failures:\n" + "\n".join(f"- {s.config} / {s.solver} seed {s.seed}: no plan ({s.error})" for s in errors)
        )
    parts.append("### Targets\n\n" + "\n".join(targets(samples, max_tokens)))
    return table, "\n\n".join(parts)


# ---------------------------------------------------------------------------------------------
# Scale: how hard the budget is
# ---------------------------------------------------------------------------------------------


@dataclass
class ScaleSample:
    row: str
    solver: str
    time_limit_s: float
    seed: int
    num_sequences: int
    wall_s: float = float("nan")  # the full solve() call
    first_plan_s: float = float("nan")  # solve() cancelled at once: the first incumbent, built and checked
    gap: float = float("nan")
    status: str = ""
    first_status: str = ""
    error: str | None = None

    @property
    def overrun(self) -> float:
        """(wall - budget) / budget: negative when the plan came early."""
        return (self.wall_s - self.time_limit_s) / self.time_limit_s


def measure_scale(row: str, solver: str, seed: int, max_tokens: int | None) -> ScaleSample:
    config, time_limit_s = SCALE_ROWS[row]
    setting = SCALE_SETTINGS[config]
    profile = profile_for(setting.model, setting.gpu, setting.num_gpus)
    tokens = min(setting.num_tokens, max_tokens) if max_tokens else setting.num_tokens
    lengths = batch_lengths(DATASET, tokens, seed, setting.context_cap)
    sample = ScaleSample(row, solver, time_limit_s, seed, len(lengths))
    request = make_request(lengths, setting.num_gpus, solver, time_limit_s, seed)
    # the two solves alternate which goes first, so machine noise falls on both alike
    for kind in ("full", "first") if seed % 2 == 0 else ("first", "full"):
        started = time.perf_counter()
        try:
            plan = solve(request, profile, cancel=(lambda: True) if kind == "first" else None)
        except PlanningError as error:
            sample.error = str(error)
            return sample
        elapsed = time.perf_counter() - started
        if kind == "full":
            sample.wall_s, sample.gap, sample.status = elapsed, plan.gap, str(plan.status)
        else:
            sample.first_plan_s, sample.first_status = elapsed, str(plan.status)
    return sample


SCALE_HEADERS = [
    "cluster @ budget",
    "solver",
    "batches",
    "sequences p50",
    "first plan p50 s",
    "first plan max s",
    "wall p50 s",
    "wall max s",
    "overrun p50 %",
    "overrun p99 %",
    "within budget %",
    "gap p50 %",
    "timeout_incumbent %",
]


def scale_row(key: tuple[str, str], samples: list[ScaleSample]) -> list[str]:
    row, solver = key
    solved = [s for s in samples if s.error is None]
    overruns = [100 * s.overrun for s in solved]
    return [
        row,
        solver,
        str(len(solved)),
        fmt(median([s.num_sequences for s in samples]), 0),
        fmt(median([s.first_plan_s for s in solved])),
        fmt(max((s.first_plan_s for s in solved), default=float("nan"))),
        fmt(median([s.wall_s for s in solved])),
        fmt(max((s.wall_s for s in solved), default=float("nan"))),
        fmt(median(overruns), 1),
        fmt(percentile(overruns, 99), 1),
        fmt(100 * sum(s.wall_s <= s.time_limit_s for s in solved) / max(len(solved), 1), 0),
        fmt(100 * median([s.gap for s in solved])),
        fmt(100 * sum(s.status == "timeout_incumbent" for s in solved) / max(len(solved), 1), 0),
    ]


def scale_targets(groups: dict[tuple[str, str], list[ScaleSample]], max_tokens: int | None) -> list[str]:
    lines = []
    if max_tokens:
        lines.append(f"**Batches capped at {max_tokens} tokens: the verdicts below judge this smaller run.**\n")
    for row, label in SCALE_TARGETS:
        keys = [key for key in groups if key[0] == row]
        budget = SCALE_ROWS[row][1]
        if not keys:
            lines.append(f"- A plan within {budget:g} s and p99 overrun <= 10% at {label}: not measured in this run.")
            continue
        for key in keys:
            solved = [s for s in groups[key] if s.error is None]
            if not solved:
                lines.append(f"- `{key[1]}` at {label}, {budget:g} s: no plan on any batch.")
                continue
            first = max(s.first_plan_s for s in solved)
            overrun = percentile([s.overrun for s in solved], 99)
            lines.append(
                f"- First plan within {budget:g} s at {label} (`{key[1]}`): "
                f"{'met' if first <= budget else 'MISSED'} (slowest {first:.2f} s of {len(solved)} batches)."
            )
            lines.append(
                f"- p99 overrun <= {100 * SCALE_OVERRUN_TARGET:.0f}% of the {budget:g} s budget at {label} "
                f"(`{key[1]}`): {'met' if overrun <= SCALE_OVERRUN_TARGET else 'MISSED'} "
                f"(p99 {100 * overrun:.1f}%, wall p99 {percentile([s.wall_s for s in solved], 99):.2f} s)."
            )
    return lines


def scale_body(samples: list[ScaleSample], run_lines: list[str], max_tokens: int | None) -> tuple[str, str]:
    groups: dict[tuple[str, str], list[ScaleSample]] = {}
    for sample in samples:
        groups.setdefault((sample.row, sample.solver), []).append(sample)
    table = markdown_table(SCALE_HEADERS, [scale_row(key, rows) for key, rows in groups.items()])
    configs = list(dict.fromkeys(SCALE_ROWS[s.row][0] for s in samples))
    parts = [
        "Clusters: " + "; ".join(f"`{c}` {SCALE_SETTINGS[c].describe()}" for c in configs) + f"; dataset {DATASET}.",
        *run_lines,
        "Columns: `first plan` is the wall time of `planner.solve.solve` cancelled at once (`cancel` true from "
        "the start: the first incumbent, built and checked); `wall` that of the full solve at the budget; "
        "`overrun` is (wall - budget) / budget, negative when the plan came early (p99 nearest-rank: the "
        "largest below 100 batches); `within budget` the share of full solves that returned by the budget.",
        table,
    ]
    errors = [s for s in samples if s.error]
    if errors:
        parts.append("Failures:\n" + "\n".join(f"- {s.row} / {s.solver} seed {s.seed}: {s.error}" for s in errors))
    parts.append("### Targets\n\n" + "\n".join(scale_targets(groups, max_tokens)))
    return table, "\n\n".join(parts)


def load_average() -> str:
    """The 1-minute load average: other work on the machine stretches every phase alike."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "n/a"


def run_scale(args: argparse.Namespace, argv: list[str] | None) -> int:
    began = time.perf_counter()
    load_before = load_average()
    warm_up(SCALE_SETTINGS[SCALE_ROWS[args.configs[0]][0]])
    samples: list[ScaleSample] = []
    total = len(args.configs) * args.repeats * len(args.solvers)
    for row in args.configs:
        for seed in range(args.repeats):
            for solver in args.solvers:
                sample = measure_scale(row, solver, seed, args.max_tokens)
                samples.append(sample)
                outcome = (
                    f"NO PLAN ({sample.error})"
                    if sample.error
                    else f"first plan {sample.first_plan_s:.2f}s, wall {sample.wall_s:.2f}s "
                    f"(overrun {100 * sample.overrun:+.1f}%), gap {100 * sample.gap:.2f}% {sample.status}"
                )
                progress(
                    f"[{len(samples)}/{total} {time.perf_counter() - began:.0f}s] {row} {solver} seed {seed}: "
                    f"{sample.num_sequences} seqs, {outcome}"
                )
    run_lines = [
        f"Run: {args.repeats} batches per row (seeds 0..{args.repeats - 1}), each solved in full and cancelled at "
        f"once (alternating which first) after one untimed warm-up solve per solver; oversize policy `split`; "
        f"{time.perf_counter() - began:.0f} s in all; 1-minute load average {load_before} at the start, "
        f"{load_average()} at the end ({os.cpu_count()} cores: above that, other work shared them)."
    ]
    if args.max_tokens:
        run_lines.append(f"**Batches capped at {args.max_tokens} tokens: smaller than the issue's sizes.**")
    table, body = scale_body(samples, run_lines, args.max_tokens)
    return publish("latency_scale", table, body, samples, args, argv)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Planner latency by solver and cluster size (issue 3).")
    parser.add_argument(
        "--configs", nargs="+", metavar="NAME", help=f"cluster sizes (default: all): {', '.join(CONFIGS)}"
    )
    parser.add_argument(
        "--solvers", nargs="+", metavar="NAME", help=f"solvers, side by side (default: {', '.join(SOLVERS)})"
    )
    parser.add_argument("--repeats", type=int, help="batches per row, seeds 0..R-1 (default 5)")
    parser.add_argument(
        "--time-limit-s",
        type=float,
        nargs="+",
        metavar="SECONDS",
        help=f"solver time limit(s); one row per value (default: the planner's {DEFAULT_TIME_LIMIT_S:g} s)",
    )
    parser.add_argument("--dataset", default=DATASET, choices=ALL_DATASETS, help="batch source (default: wikipedia)")
    parser.add_argument("--max-tokens", type=int, help="cap the tokens per batch (smaller than the issue's sizes)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: {', '.join(QUICK_CONFIGS)}, {QUICK_REPEATS} batches of at most {QUICK_MAX_TOKENS} "
        f"tokens, {QUICK_TIME_LIMIT_S:g} s limit (explicit flags still win)",
    )
    parser.add_argument(
        "--scale",
        action="store_true",
        help=f"measure the hard budget instead: time to a first plan and overrun per (cluster, budget) row, "
        f"default solver, {SCALE_REPEATS} batches; --configs then names rows: {', '.join(SCALE_ROWS)}",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS_PATH,
        help="summary file; the full output goes to results/ beside it (default: %(default)s)",
    )
    parser.add_argument("--no-write", action="store_true", help="print the table only, write no results file")
    parser.add_argument("--json", type=Path, help="also write every sample to this JSON file")
    args = parser.parse_args(argv)
    if args.scale:
        args.configs = split_names(args.configs, SCALE_ROWS, "row") or list(
            QUICK_SCALE_ROWS if args.quick else SCALE_ROWS
        )
        args.solvers = split_names(args.solvers, SOLVERS, "solver") or [TARGET_SOLVER]
    else:
        args.configs = split_names(args.configs, CONFIGS, "config") or list(QUICK_CONFIGS if args.quick else CONFIGS)
        args.solvers = split_names(args.solvers, SOLVERS, "solver") or list(SOLVERS)
    if args.repeats is None:
        args.repeats = QUICK_REPEATS if args.quick else SCALE_REPEATS if args.scale else 5
    if args.time_limit_s is None:
        args.time_limit_s = [QUICK_TIME_LIMIT_S if args.quick else DEFAULT_TIME_LIMIT_S]
    if args.quick:
        args.max_tokens = args.max_tokens or QUICK_MAX_TOKENS
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if any(not 0 < limit <= 600 for limit in args.time_limit_s):
        parser.error("--time-limit-s must be in (0, 600]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.scale:
        return run_scale(args, argv)
    began = time.perf_counter()
    warm_up(CONFIGS[args.configs[0]])
    samples: list[Sample] = []
    total = len(args.configs) * args.repeats * len(args.solvers) * len(args.time_limit_s)
    for config in args.configs:
        for limit in args.time_limit_s:
            for seed in range(args.repeats):
                for solver in args.solvers:
                    sample = measure(config, CONFIGS[config], args.dataset, solver, limit, seed, args.max_tokens)
                    samples.append(sample)
                    outcome = (
                        f"NO PLAN ({sample.error})"
                        if sample.error
                        else f"{sample.wall_s:.2f}s wall{' (cut by clock)' if sample.cut_by_clock else ''}, gap "
                        f"{100 * sample.gap:.2f}% {sample.status}"
                    )
                    progress(
                        f"[{len(samples)}/{total} {time.perf_counter() - began:.0f}s] {config} {solver} "
                        f"limit {limit:g}s seed {seed}: {sample.num_sequences} seqs, {outcome}"
                    )
    run_lines = [
        f"Run: {args.repeats} batches per row (seeds 0..{args.repeats - 1}), solvers interleaved batch by batch "
        f"after one untimed warm-up solve; oversize policy `split`; {time.perf_counter() - began:.0f} s in all."
    ]
    if args.max_tokens:
        run_lines.append(
            f"**Batches capped at {args.max_tokens} tokens: smaller than the issue's sizes, not the benchmark.**"
        )
    table, body = report_body(samples, args.dataset, run_lines, args.max_tokens)
    return publish("latency", table, body, samples, args, argv)


def publish(section: str, table: str, body: str, samples: list, args: argparse.Namespace, argv) -> int:
    """Print the table and the targets, write the samples (--json), the full output (results/<section>.md)
    and the summary section of RESULTS.md (the table)."""
    print(table)
    print()
    print(body.split("### Targets", 1)[1].strip())
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(s) for s in samples], indent=1))
    if not args.no_write:
        command = command_line() if argv is None else "python benchmarks/latency.py " + " ".join(argv)
        full = write_result(section, command, body, table, path=args.results)
        progress(f"wrote {full} and the {section} section of {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
