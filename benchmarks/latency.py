"""Planner latency, solver by solver, at three cluster sizes (issue 3, "Targets").

    python benchmarks/latency.py                          # 64, 256 and 1024 GPUs; greedy, lp, auto; 5 batches
    python benchmarks/latency.py --configs 64xh100-1M --repeats 9
    python benchmarks/latency.py --time-limit-s 2 10      # rows for both budgets
    python benchmarks/latency.py --quick                  # a smoke run of a few seconds

For each cluster size, `--repeats` Wikipedia batches (seeds 0..R-1) are planned by each solver in
turn (solvers interleaved batch by batch, so machine noise falls on all of them alike) at the
planner's default time limit (2 s; `--time-limit-s` for others). One untimed solve first loads the
solver libraries. Reported per (cluster, solver, time limit): the wall time of the
`planner.solve.solve` call, p50 (median) and p95 (nearest rank: the largest of 5); the time the
planner reports in `plan.solver.solve_time_s` (search and plan building; the rest of the wall time
is checking the plan and loading the backend); the stages before planning (building the analytic
cost profile, sampling the batch) and the median gap of the plans, so that a fast time can be
weighed against what it buys.

Targets (issue 3): p50 <= 1 s for 64 GPUs / 1M tokens and <= 10 s for 1024 GPUs / 16M tokens.
The results go to the `latency` section of benchmarks/RESULTS.md (`--results` for another file).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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
from benchmarks.report import RESULTS_PATH, command_line, markdown_table, write_section  # noqa: E402
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
    reported_s: float = float("nan")  # plan.solver.solve_time_s
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
    sample.reported_s = plan.solver.solve_time_s
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
    "planner-reported p50 s",
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
        fmt(median([s.reported_s for s in solved])),
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
        "Columns: `solve wall` is the wall time of `planner.solve.solve` (p95 nearest-rank); `planner-reported` "
        "is `plan.solver.solve_time_s` (search and plan building; the rest of the wall time is the plan check "
        "and backend loading); profile build (analytic, uncached) and batch sampling come before planning.",
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
        "--results", type=Path, default=RESULTS_PATH, help="file to write the section to (default: %(default)s)"
    )
    parser.add_argument("--no-write", action="store_true", help="print the table only, write no results file")
    parser.add_argument("--json", type=Path, help="also write every sample to this JSON file")
    args = parser.parse_args(argv)
    args.configs = split_names(args.configs, CONFIGS, "config") or list(QUICK_CONFIGS if args.quick else CONFIGS)
    args.solvers = split_names(args.solvers, SOLVERS, "solver") or list(SOLVERS)
    if args.repeats is None:
        args.repeats = QUICK_REPEATS if args.quick else 5
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
                        else f"{sample.wall_s:.2f}s wall ({sample.reported_s:.2f}s reported), gap "
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
    print(table)
    print()
    print(body.split("### Targets", 1)[1].strip())
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(s) for s in samples], indent=1))
    if not args.no_write:
        command = command_line() if argv is None else "python benchmarks/latency.py " + " ".join(argv)
        write_section("latency", command, body, path=args.results)
        progress(f"wrote the latency section of {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
