"""The closed loop on CPU: online runs of the tiny model that refit their profile step after step (issue 31.6).

    python benchmarks/closed_loop.py            # both scenarios, 14 steps each (~5 min on 2 busy cores)
    python benchmarks/closed_loop.py --quick    # a smoke run: 3 steps, nothing written
    python benchmarks/closed_loop.py --profile benchmarks/data/tiny-cpu-intel-xeon.json --one-at-a-time

Every run is `hydraplan run`'s online mode without a server: 2 gloo ranks, float32, rank 0 plans
each step with the local planner (`api.cli.run_planning.LocalPlanner`) and, after each step,
hands it the step's measurements (`runtime.step_measurements`), which it refits in-process with
the session's code (`cost_models.online_fit.apply_step`); the next step is planned with the new
profile version. Each step's batch: `--batch-sequences` log-uniform lengths up to `--max-length`
(`SyntheticLengths`, the same batches in every run). The profile: the bundled `tiny-cpu` one (or
`--profile`, one measured on the machine that runs the benchmark) on a pretend device of
`--memory-bytes` per rank (as `benchmarks/runtime_vs_model.py`: capacities of
~1K tokens, so packing matters). 200 MB since the bundled profile's memory is fitted to the real
peak (2026-12-03): one `<1,1,1>` rank then holds 787 tokens, more than the longest sequence (768),
so work can move off a slow rank; at the 150 MB used before it held 574, and the batches' longest
sequences could only run on the two-rank schemes that hold both ranks.

1. **Wrong start vs right start** (the two at the same time, so they share the machine's load;
   `--one-at-a-time` runs them one after the other, for a quiet machine): the same run from the
   profile (right) and from the profile with every scheme's quadratic term `a` x2 and linear term `b` x0.5 (wrong).
   Per step: the median relative stage-time error of the step's measured micro-batches against
   the profile version that planned it, and the measured step time. Targets (issue 31): within
   10 steps the wrong start's median error is <= 10%, and its measured step time within 5% of
   the right start's (same batches).
2. **Slowdown**: the right start, with rank 1's compute made `--slow-factor` times slower from
   the middle step on (`RunSpec.slowdowns`, `runtime.faults.burn_cpu`): per step the plan's
   strategy, each pipeline's ranks and tokens, the median error and the measured step time.
3. **Memory** (`--scenario memory`, its own section): the right start with every scheme's
   activation bytes x0.35, so the capacities it derives on the pretend device promise micro-batches
   a rank cannot hold: per step the plan's capacities, its largest micro-batch, the capacity
   changes the plan names and the measured peak against the device. Target: no step over the
   device's memory once a plan has named a lowered capacity.

Times: thread CPU time per op (`runtime.step_timing` with the `cpu` clock: on these
oversubscribed cores a rank's wall clock holds its neighbours' work), the measured step is the
slowest pipeline's critical path plus the gradient sync, as the planner models it. The full
report goes to benchmarks/results/closed_loop.md with a plot (closed_loop.svg), the key table to
the `closed_loop` section of benchmarks/RESULTS.md (`--section` names another).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.report import RESULTS_PATH, command_line, markdown_table, write_result  # noqa: E402

SECTION = "closed_loop"
TARGET_ERROR = 0.10
TARGET_STEP_RATIO = 0.05
TARGET_WITHIN_STEPS = 10
WRONG_A, WRONG_B = 2.0, 0.5
WRONG_MEMORY = 0.35  # the memory scenario's activation bytes, against the bundled profile's
NUM_RANKS = 2


@dataclass
class RunResult:
    """One online run: per step its plan's facts, the loop's entry and the measured step."""

    name: str
    strategies: list[str]
    versions: list[int | None]
    errors: list[float | None]
    step_s: list[float]
    pipelines: list[list[tuple[str, list[int], int, float]]]  # per step: (scheme, ranks, tokens, measured s)
    wall_s: float
    ratios: list[list[dict]]  # per step: each pipeline's ranks and measured / predicted stage time
    slow_ranks: list[dict[int, float]]  # per step: the slow ranks and factors its plan was made with
    peaks: list[float | None]  # per step: the largest peak any rank measured (None: none sent)
    plans: list = dataclasses.field(repr=False)  # per step: its `Plan`


def wrong_memory_profile(profile):
    """The profile with every scheme's activation bytes x WRONG_MEMORY (its capacities then derived
    from that under-predicting model; the static bytes kept)."""
    from hydraplan.cost_models.online_fit import scaled_activations

    schemes = [scaled_activations(entry, WRONG_MEMORY) for entry in profile.schemes]
    return profile.model_copy(update={"schemes": schemes})


def wrong_profile(profile):
    """The profile with every scheme's `a` x WRONG_A and `b` x WRONG_B."""
    schemes = [entry.model_copy(update={"a": entry.a * WRONG_A, "b": entry.b * WRONG_B}) for entry in profile.schemes]
    return profile.model_copy(update={"schemes": schemes})


def online_run(name: str, profile, args, slowdowns: tuple = ()) -> RunResult:
    from hydraplan.api.cli.run_planning import LocalPlanner, SyntheticLengths
    from hydraplan.planner.schemas import Plan, SolverOptions
    from hydraplan.runtime.launch import run_ranks
    from hydraplan.runtime.step_timing import step_timing
    from hydraplan.runtime.worker import RunSpec, run_worker

    options = SolverOptions(time_limit_s=args.plan_time_limit_s, seed=0, oversize="split")
    planner = LocalPlanner(profile.model_dump_json(), NUM_RANKS, NUM_RANKS, options.model_dump_json())
    spec = RunSpec(
        steps=args.steps,
        dtype="float32",
        planner=planner,
        next_lengths=SyntheticLengths(args.batch_sequences, args.max_length, args.data_seed),
        post_measurements=True,
        slowdowns=slowdowns,
    )
    started = time.perf_counter()
    reports = run_ranks(run_worker, NUM_RANKS, args=(spec,), timeout_s=args.timeout_s)
    wall_s = time.perf_counter() - started
    plans = [Plan.model_validate_json(text) for text in reports[0]["plan_jsons"]]
    loop = {entry["step"]: entry for entry in reports[0]["loop"]}
    timings = [step_timing(reports, step) for step in range(len(plans))]
    return RunResult(
        name=name,
        strategies=[plan.strategy for plan in plans],
        versions=[None if plan.session_feedback is None else plan.session_feedback.profile_version for plan in plans],
        errors=[loop.get(step, {}).get("median_error") for step in range(len(plans))],
        step_s=[timing.step_s for timing in timings],
        pipelines=[
            [
                (
                    f"<{p.scheme.tp},{p.scheme.pp},{p.scheme.cp}>",
                    list(p.ranks),
                    p.num_tokens,
                    timing.pipelines[p.index].total_s,
                )
                for p in plan.pipelines
                if p.index in timing.pipelines
            ]
            for plan, timing in zip(plans, timings)
        ],
        wall_s=wall_s,
        ratios=[loop.get(step, {}).get("pipeline_ratios", []) for step in range(len(plans))],
        slow_ranks=[dict(plan.rank_slowdowns or {}) for plan in plans],
        peaks=[step_peak(reports, step) for step in range(len(plans))],
        plans=plans,
    )


def step_peak(reports: list[dict], step: int) -> float | None:
    """The largest peak memory any rank sent for `step` (None when no rank measured one)."""
    peaks = [report["steps"][step].get("peak_memory_bytes") for report in reports if step < len(report["steps"])]
    peaks = [peak for peak in peaks if peak is not None]
    return max(peaks) if peaks else None


# ---------------------------------------------------------------------------------------------
# Tables, verdicts, plot
# ---------------------------------------------------------------------------------------------


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def start_table(wrong: RunResult, right: RunResult) -> str:
    rows = []
    for step in range(len(wrong.step_s)):
        ratio = wrong.step_s[step] / right.step_s[step] - 1
        rows.append(
            [
                step,
                wrong.versions[step] if wrong.versions[step] is not None else 0,
                wrong.strategies[step],
                pct(wrong.errors[step]),
                f"{wrong.step_s[step]:.3f}",
                right.versions[step] if right.versions[step] is not None else 0,
                right.strategies[step],
                pct(right.errors[step]),
                f"{right.step_s[step]:.3f}",
                f"{ratio:+.1%}",
            ]
        )
    headers = [
        "step",
        "wrong: version",
        "wrong: strategy",
        "wrong: median error",
        "wrong: step s",
        "right: version",
        "right: strategy",
        "right: median error",
        "right: step s",
        "wrong / right - 1",
    ]
    return markdown_table(headers, rows)


def slow_table(slow: RunResult, first_slow_step: int, factor: float) -> str:
    rows = []
    for step in range(len(slow.step_s)):
        parts = "; ".join(
            f"{scheme} ranks {ranks}: {tokens} tok, {seconds:.3f} s"
            for scheme, ranks, tokens, seconds in slow.pipelines[step]
        )
        rows.append(
            [
                step,
                f"x{factor:g}" if step >= first_slow_step else "-",
                slow.versions[step] if slow.versions[step] is not None else 0,
                slow.strategies[step],
                ", ".join(f"{rank}: x{factor:.2f}" for rank, factor in slow.slow_ranks[step].items()) or "-",
                parts,
                ", ".join(f"{entry['ranks']}: {entry['measured_over_predicted']:.2f}" for entry in slow.ratios[step]),
                pct(slow.errors[step]),
                f"{slow.step_s[step]:.3f}",
            ]
        )
    headers = ["step", "rank 1", "version", "strategy", "plan's slow ranks", "pipelines (ranks, tokens, measured)"]
    headers += ["measured / predicted by ranks", "median error", "step s"]
    return markdown_table(headers, rows)


def visits_table(wrong: RunResult, right: RunResult) -> str:
    """The median step error by how many earlier steps ran the step's schemes: the refit is per
    scheme, so a scheme first run late is still at its starting coefficients."""

    def by_visits(run: RunResult) -> dict[int, list[float]]:
        seen: dict[str, int] = {}
        groups: dict[int, list[float]] = {}
        for step, pipelines in enumerate(run.pipelines):
            schemes = sorted({scheme for scheme, _, _, _ in pipelines})
            visits = min(seen.get(scheme, 0) for scheme in schemes)
            if run.errors[step] is not None:
                groups.setdefault(min(visits, 3), []).append(run.errors[step])
            for scheme in schemes:
                seen[scheme] = seen.get(scheme, 0) + 1
        return groups

    wrong_groups, right_groups = by_visits(wrong), by_visits(right)
    rows = []
    for visits in range(4):
        label = "3 or more" if visits == 3 else str(visits)
        row = [label]
        for groups in (wrong_groups, right_groups):
            errors = groups.get(visits, [])
            row += [len(errors), pct(statistics.median(errors)) if errors else "-"]
        rows.append(row)
    headers = ["earlier steps of the scheme", "wrong: steps", "wrong: median error"]
    headers += ["right: steps", "right: median error"]
    return markdown_table(headers, rows)


@dataclass(frozen=True)
class StartResult:
    """One wrong / right pair over the target's steps (TARGET_WITHIN_STEPS on)."""

    worst_error: float | None  # the wrong start's largest per-step median error
    first_good: int | None  # the wrong start's first step at or under TARGET_ERROR
    step_ratio: float  # the wrong start's summed step time over the right start's, minus 1
    right_error: float  # the right start's median per-step error
    same_plan_ratio: float | None  # median step-time ratio over the steps both planned alike (the runs' drift)

    @property
    def error_ok(self) -> bool:
        return self.worst_error is not None and self.worst_error <= TARGET_ERROR

    @property
    def time_ok(self) -> bool:
        return abs(self.step_ratio) <= TARGET_STEP_RATIO


def same_plan(wrong: RunResult, right: RunResult, step: int) -> bool:
    """Whether both runs gave `step` the same strategy and each pipeline the same tokens."""
    tokens = [[(scheme, count) for scheme, _, count, _ in run.pipelines[step]] for run in (wrong, right)]
    return wrong.strategies[step] == right.strategies[step] and tokens[0] == tokens[1]


def start_result(wrong: RunResult, right: RunResult) -> StartResult | None:
    """The pair's figures over steps TARGET_WITHIN_STEPS on (None: too few steps)."""
    late = range(TARGET_WITHIN_STEPS, len(wrong.step_s))
    if not late:
        return None
    errors = [wrong.errors[step] for step in late if wrong.errors[step] is not None]
    alike = [
        wrong.step_s[step] / right.step_s[step] - 1
        for step in range(len(wrong.step_s))
        if same_plan(wrong, right, step)
    ]
    return StartResult(
        worst_error=max(errors, default=None),
        first_good=next((s for s, e in enumerate(wrong.errors) if e is not None and e <= TARGET_ERROR), None),
        step_ratio=sum(wrong.step_s[step] for step in late) / sum(right.step_s[step] for step in late) - 1,
        right_error=statistics.median([e for s in late if (e := right.errors[s]) is not None] or [0.0]),
        same_plan_ratio=statistics.median(alike) if alike else None,
    )


def start_verdict(wrong: RunResult, right: RunResult) -> tuple[str, bool, bool]:
    """Whether, by step TARGET_WITHIN_STEPS, the wrong start's error is <= TARGET_ERROR (on
    every step from there on) and its step time within TARGET_STEP_RATIO of the right start's
    (summed over those steps)."""
    result = start_result(wrong, right)
    if result is None:
        return "too few steps for the targets (need more than 10)", False, False
    drift = (
        ""
        if result.same_plan_ratio is None
        else f" On the steps both runs planned alike, the wrong start's step time was {result.same_plan_ratio:+.1%} "
        "against the right start's (median): the two runs' measurement drift."
    )
    text = (
        f"Wrong start, steps {TARGET_WITHIN_STEPS}-{len(wrong.step_s) - 1}: median stage-time error at most "
        f"{pct(result.worst_error)} "
        f"(target <= {TARGET_ERROR:.0%}: {'met' if result.error_ok else 'NOT met'}; first step at or under it: "
        f"{result.first_good}); measured step time {result.step_ratio:+.1%} against the right start over those steps "
        f"(target within {TARGET_STEP_RATIO:.0%}: {'met' if result.time_ok else 'NOT met'}). Right start's median "
        f"error over the same steps: {pct(result.right_error)}.{drift}"
    )
    return text, result.error_ok, result.time_ok


def repeats_table(pairs: list[tuple[str, RunResult, RunResult]]) -> tuple[str, str]:
    """Every wrong / right pair's figures, and the verdict on their medians."""
    rows, results = [], []
    for index, (order, wrong, right) in enumerate(pairs, start=1):
        result = start_result(wrong, right)
        if result is None:
            return "", "too few steps for the targets (need more than 10)"
        results.append(result)
        rows.append(
            [
                index,
                order,
                pct(result.worst_error),
                result.first_good,
                f"{result.step_ratio:+.1%}",
                pct(result.right_error),
                "-" if result.same_plan_ratio is None else f"{result.same_plan_ratio:+.1%}",
                "met" if result.error_ok and result.time_ok else "NOT met",
            ]
        )
    headers = [
        "pair",
        "order",
        "wrong: worst median error",
        "wrong: first step <= 10%",
        "step time vs right",
        "right: median error",
        "same plans: wrong / right - 1",
        "both targets",
    ]
    worst = statistics.median([r.worst_error for r in results if r.worst_error is not None] or [1.0])
    ratio = statistics.median([r.step_ratio for r in results])
    both = sum(r.error_ok and r.time_ok for r in results)
    verdict = (
        f"Over {len(results)} pairs (medians): the wrong start's worst median error on steps {TARGET_WITHIN_STEPS} on "
        f"{pct(worst)} (target <= {TARGET_ERROR:.0%}: {'met' if worst <= TARGET_ERROR else 'NOT met'}), its step "
        f"time {ratio:+.1%} against the right start's (target within {TARGET_STEP_RATIO:.0%}: "
        f"{'met' if abs(ratio) <= TARGET_STEP_RATIO else 'NOT met'}); both targets met by {both} of {len(results)} "
        "pairs."
    )
    return markdown_table(headers, rows), verdict


def slow_verdict(slow: RunResult, first_slow_step: int) -> str:
    """Tokens given to the pipelines holding the slowed rank (1), before and after the slowdown."""

    def share(step: int) -> float:
        total = sum(tokens for _, _, tokens, _ in slow.pipelines[step])
        on_slow = sum(tokens for _, ranks, tokens, _ in slow.pipelines[step] if 1 in ranks)
        return on_slow / total if total else 0.0

    before = [share(step) for step in range(first_slow_step)]
    after = [share(step) for step in range(first_slow_step, len(slow.step_s))]
    text = (
        f"Share of each step's tokens on pipelines that hold rank 1: mean {statistics.fmean(before):.0%} before the "
        f"slowdown, {statistics.fmean(after):.0%} after it (per step: {', '.join(f'{s:.0%}' for s in before + after)})."
    )
    # a one-pipeline strategy holds every rank (100%): only steps of several pipelines can move work
    detected = next((step for step in range(len(slow.step_s)) if 1 in slow.slow_ranks[step]), None)
    phases = [("before the slowdown", range(first_slow_step))]
    if detected is None:
        phases.append(("after it (rank 1 never detected slow)", range(first_slow_step, len(slow.step_s))))
    else:
        phases.append(("after it, before its plans named rank 1 slow", range(first_slow_step, detected)))
        phases.append((f"from step {detected} on (its plans name rank 1 slow)", range(detected, len(slow.step_s))))
    parts = []
    for label, steps in phases:
        shares = [share(step) for step in steps if len(slow.pipelines[step]) > 1]
        mean = f"{statistics.fmean(shares):.0%}" if shares else "-"
        parts.append(f"{label}: {mean} over {len(shares)} steps")
    return f"{text} On steps with more than one pipeline, rank 1's share: {'; '.join(parts)}."


def plot_svg(wrong: RunResult, right: RunResult, slow: RunResult) -> str:
    """Two panels: median stage-time error per step, and measured step time per step."""
    width, height, left, top, panel_h, gap = 760, 520, 70, 30, 190, 60
    plot_w = width - left - 30
    steps = len(wrong.step_s)
    series = [(wrong, "#c62828", "wrong start"), (right, "#2b62a8", "right start"), (slow, "#e59b2e", "slowdown")]
    max_error = max([e for run, _, _ in series for e in run.errors if e is not None] + [TARGET_ERROR]) * 1.1
    max_step = max(s for run, _, _ in series for s in run.step_s) * 1.1
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        "font-family='DejaVu Sans, Arial, sans-serif' font-size='11'>",
        f"<rect width='{width}' height='{height}' fill='white'/>",
    ]

    def x_of(step: int) -> float:
        return left + plot_w * step / max(1, steps - 1)

    for index, (title, value_max, values_of, fmt) in enumerate(
        (
            ("median stage-time error vs the planning version", max_error, lambda r: r.errors, "{:.0%}"),
            ("measured step time, s (thread CPU)", max_step, lambda r: r.step_s, "{:.2f}"),
        )
    ):
        y0 = top + index * (panel_h + gap)
        parts.append(f"<text x='{left}' y='{y0 - 8}' font-weight='bold'>{title}</text>")
        parts.append(f"<rect x='{left}' y='{y0}' width='{plot_w}' height='{panel_h}' fill='none' stroke='#999'/>")
        for tick in range(5):
            value = value_max * tick / 4
            y = y0 + panel_h - panel_h * tick / 4
            parts.append(f"<text x='{left - 6}' y='{y + 4:.1f}' text-anchor='end'>{fmt.format(value)}</text>")
        for step in range(steps):
            parts.append(f"<text x='{x_of(step):.1f}' y='{y0 + panel_h + 14}' text-anchor='middle'>{step}</text>")
        if index == 0:
            y = y0 + panel_h - panel_h * TARGET_ERROR / value_max
            parts.append(
                f"<line x1='{left}' x2='{left + plot_w}' y1='{y:.1f}' y2='{y:.1f}' stroke='#777' "
                "stroke-dasharray='4 3'/>"
            )
        for run, colour, _ in series:
            points = [
                f"{x_of(step):.1f},{y0 + panel_h - panel_h * value / value_max:.1f}"
                for step, value in enumerate(values_of(run))
                if value is not None
            ]
            parts.append(f"<polyline points='{' '.join(points)}' fill='none' stroke='{colour}' stroke-width='2'/>")
    legend_y = height - 14
    for index, (_, colour, label) in enumerate(series):
        x = left + index * 160
        parts.append(
            f"<line x1='{x}' x2='{x + 24}' y1='{legend_y - 4}' y2='{legend_y - 4}' stroke='{colour}' stroke-width='3'/>"
        )
        parts.append(f"<text x='{x + 30}' y='{legend_y}'>{label}</text>")
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--batch-sequences", type=int, default=12)
    parser.add_argument("--max-length", type=int, default=768)
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--memory-bytes", type=float, default=200e6, help="pretend device memory per rank")
    parser.add_argument("--plan-time-limit-s", type=float, default=0.5)
    parser.add_argument("--slow-factor", type=float, default=3.0)
    parser.add_argument("--timeout-s", type=float, default=1200.0)
    parser.add_argument(
        "--scenario",
        choices=("all", "slowdown", "memory"),
        default="all",
        help="slowdown: only the slowdown run (its own section, default closed_loop-slowdown); memory: a profile "
        "whose activation bytes are x0.35, so its capacities are too large (default section closed_loop-memory)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="the right start's profile (a `hydraplan profile --device cpu --model tiny` file measured on this "
        "machine); default: the bundled tiny-cpu profile, measured on the host its provenance names",
    )
    parser.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="run the wrong and the right start one after the other (2 ranks on the cores at a time) instead of at "
        "the same time (4 ranks): less noise in each op's CPU time on a quiet machine, exposed to a change of load "
        "between the runs",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="wrong / right pairs to run (the targets then judged on their medians; the tables show the first pair)",
    )
    parser.add_argument("--quick", action="store_true", help="3 steps, nothing written")
    parser.add_argument("--results", type=Path, default=RESULTS_PATH)
    parser.add_argument("--section", default=None, help="section of RESULTS.md and name of the results file")
    args = parser.parse_args(argv)
    if args.section is None:
        args.section = SECTION if args.scenario == "all" else f"{SECTION}-{args.scenario}"
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: must be at least 1")
    if args.quick:
        args.steps = 3
    return args


def main(argv: list[str] | None = None) -> int:
    from benchmarks.runtime_vs_model import benchmark_profile

    args = parse_args(argv)
    right_profile = benchmark_profile(start_profile(args), args.memory_bytes)
    first_slow_step = args.steps // 2
    if args.scenario == "slowdown":
        return slowdown_only(args, right_profile, first_slow_step)
    if args.scenario == "memory":
        return memory_only(args, right_profile)
    pairs = [start_pair(args, right_profile, index) for index in range(args.repeats)]
    runs = {"wrong": pairs[0][1], "right": pairs[0][2]}
    runs["slow"] = online_run("slow", right_profile, args, ((1, first_slow_step, args.slow_factor),))
    for name, run in runs.items():
        print(f"{name}: {args.steps} steps in {run.wall_s:.0f} s wall", file=sys.stderr, flush=True)
    wrong, right, slow = runs["wrong"], runs["right"], runs["slow"]
    first = start_table(wrong, right) + "\n\nBy the scheme's earlier steps:\n\n" + visits_table(wrong, right)
    second = slow_table(slow, first_slow_step, args.slow_factor)
    verdict, _, _ = start_verdict(wrong, right)
    if len(pairs) > 1:
        table, over_pairs = repeats_table(pairs)
        first += f"\n\n{verdict}\n\nEvery pair (the tables above are pair 1's):\n\n{table}"
        verdict = over_pairs
    moved = slow_verdict(slow, first_slow_step)
    print(first, "\n", verdict, "\n\n", second, "\n", moved, sep="")
    if args.quick:
        return 0
    svg_path = args.results.parent / "results" / f"{args.section}.svg"
    svg_path.parent.mkdir(parents=True, exist_ok=True)
    svg_path.write_text(plot_svg(wrong, right, slow))
    setup = (
        f"{runs_text(args)}, {profile_text(args, right_profile)} on a pretend device of "
        f"{args.memory_bytes / 1e6:.0f} MB per rank, local planner (plan budget {args.plan_time_limit_s} s) with the "
        f"in-process refit; wrong start: a x{WRONG_A:g}, b x{WRONG_B:g}; slowdown: rank 1 x{args.slow_factor:g} from "
        f"step {first_slow_step}. Times: thread CPU per op (`runtime.step_timing`, clock `cpu`): on these 2 shared "
        f"cores a rank's wall time holds other processes' work. {order_text(args)} Runs took {wrong.wall_s:.0f} / "
        f"{right.wall_s:.0f} / {slow.wall_s:.0f} s wall."
    )
    body = (
        f"{setup}\n\n![per-step error and step time]({args.section}.svg)\n\n"
        f"### Wrong start vs right start\n\n{first}\n\n"
        f"{verdict}\n\n### Slowdown of rank 1\n\n{second}\n\n{moved}\n"
    )
    summary = f"{setup}\n\n{verdict}\n\n{moved}\n"
    write_result(args.section, command_line(), body, summary, path=args.results)
    return 0


def slowdown_only(args: argparse.Namespace, profile, first_slow_step: int) -> int:
    """The slowdown scenario alone, into its own section (the full run's numbers stay beside it)."""
    slow = online_run("slow", profile, args, ((1, first_slow_step, args.slow_factor),))
    setup = (
        f"{runs_text(args)}, {profile_text(args, profile)} on a pretend device of "
        f"{args.memory_bytes / 1e6:.0f} MB per rank, local planner (plan budget {args.plan_time_limit_s} s) with the "
        f"in-process refit and per-rank slowdown factors (`cost_models.rank_speed`); slowdown: rank 1 "
        f"x{args.slow_factor:g} from step {first_slow_step}. Times: thread CPU per op (`runtime.step_timing`, clock "
        f"`cpu`). The run took {slow.wall_s:.0f} s wall."
    )
    table = slow_table(slow, first_slow_step, args.slow_factor)
    return single_run_report(args, slow, table, slow_verdict(slow, first_slow_step), setup)


def start_pair(args: argparse.Namespace, right_profile, index: int) -> tuple[str, RunResult, RunResult]:
    """Pair `index` of the wrong and the right start: its order and both runs. One after the other,
    the order alternates from pair to pair (a drift of the machine between two runs then falls on
    each start in turn)."""
    starts = [("wrong", wrong_profile(right_profile)), ("right", right_profile)]
    if args.one_at_a_time:
        starts = starts if index % 2 == 0 else starts[::-1]
        runs = {name: online_run(name, profile, args) for name, profile in starts}
        order = " then ".join(name for name, _ in starts)
    else:
        # the wrong and the right start run at the same time, so both see the same load (run one after
        # the other under a changing load, a move of this machine's load between them moved step times by 30%)
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {name: pool.submit(online_run, name, profile, args) for name, profile in starts}
            runs = {name: future.result() for name, future in futures.items()}
        order = "at the same time"
    return order, runs["wrong"], runs["right"]


def start_profile(args: argparse.Namespace):
    """The right start's profile: `--profile`, else the bundled tiny-cpu one."""
    from hydraplan.cost_models.profile_io import ProfileError, bundled_profile, load_profile

    if args.profile is None:
        return bundled_profile()
    try:
        profile = load_profile(args.profile)
    except ProfileError as exc:
        raise SystemExit(f"--profile: {exc}") from None
    if profile.model != "tiny" or profile.provenance is None or profile.provenance.device != "cpu":
        raise SystemExit(f"--profile {args.profile}: not a `hydraplan profile --device cpu --model tiny` file")
    return profile


def profile_text(args: argparse.Namespace, profile) -> str:
    """The right start's `profile` (from `start_profile`) as the setup paragraph names it: its file
    and the host its provenance says it was measured on, and this machine where that differs (a
    profile of another host is not a right start here: results/closed_loop-host.md measured how far
    off)."""
    from hydraplan.runtime.profiler import device_description

    name = "bundled tiny-cpu profile" if args.profile is None else f"tiny profile `{args.profile.name}`"
    here = device_description("cpu")
    elsewhere = "" if here == profile.provenance.hardware else f"; this machine: {here}, so not its right start"
    return f"{name} (measured {profile.provenance.date[:16]} on {profile.provenance.hardware}{elsewhere})"


def order_text(args: argparse.Namespace) -> str:
    """How the runs shared the machine, as the setup paragraph says it."""
    if args.one_at_a_time:
        return (
            f"The wrong start, the right start and the slowdown run ran one after the other (2 ranks on the cores), "
            f"{args.repeats} wrong / right pair(s) in alternating order."
        )
    return (
        f"The wrong and the right start ran at the same time (4 ranks on the cores, the same load for both), "
        f"{args.repeats} pair(s), then the slowdown run alone."
    )


def runs_text(args: argparse.Namespace) -> str:
    """The ranks, model and batches every scenario runs, as its setup paragraph starts."""
    return (
        f"2 gloo ranks, float32, tiny model, {args.steps} steps of {args.batch_sequences} log-uniform lengths up to "
        f"{args.max_length} (data seed {args.data_seed})"
    )


def single_run_report(args: argparse.Namespace, run: RunResult, table: str, verdict: str, setup: str) -> int:
    """Print a one-run scenario's table and verdict; unless `--quick`, write its own section."""
    print(f"{run.name}: {args.steps} steps in {run.wall_s:.0f} s wall", file=sys.stderr, flush=True)
    print(table, "\n", verdict, sep="")
    if args.quick:
        return 0
    body = f"{setup}\n\n{table}\n\n{verdict}\n"
    write_result(args.section, command_line(), body, f"{setup}\n\n{verdict}\n", path=args.results)
    return 0


def memory_table(run: RunResult, memory_bytes: float) -> str:
    from hydraplan.cost_models.online_fit import scheme_name
    from hydraplan.planner.schemas import derive_capacity_tokens

    rows = []
    for step, plan in enumerate(run.plans):
        used = {(p.scheme.tp, p.scheme.pp, p.scheme.cp, p.scheme.v) for p in plan.pipelines}
        capacities = ", ".join(
            f"{scheme_name(entry.key)}: {derive_capacity_tokens(plan.cost_profile, entry)}"
            for entry in plan.cost_profile.schemes
            if (entry.tp, entry.pp, entry.cp, entry.v) in used
        )
        largest = max(mb.num_tokens for p in plan.pipelines for mb in p.micro_batches)
        changes = plan.session_feedback.capacity_changes if plan.session_feedback else []
        named = "; ".join(f"{c.scheme} {c.from_tokens} -> {c.to_tokens} ({c.reason})" for c in changes) or "-"
        peak = run.peaks[step]
        rows.append(
            [
                step,
                run.versions[step] if run.versions[step] is not None else 0,
                plan.strategy,
                capacities,
                largest,
                named,
                "-" if peak is None else f"{peak / 1e6:.1f}",
                "-" if peak is None else f"{peak / memory_bytes:.0%}",
            ]
        )
    headers = ["step", "version", "strategy", "capacity tokens (plan)", "largest micro-batch tokens"]
    headers += ["capacity lowered (named by the plan)", "measured peak MB", "of the device"]
    return markdown_table(headers, rows)


def memory_verdict(run: RunResult, memory_bytes: float) -> str:
    over = [step for step, peak in enumerate(run.peaks) if peak is not None and peak > memory_bytes]
    lowered = [
        step for step, plan in enumerate(run.plans) if plan.session_feedback and plan.session_feedback.capacity_changes
    ]
    first = lowered[0] if lowered else None
    after = [step for step in over if first is not None and step >= first]
    return (
        f"Steps whose measured peak exceeded the pretend device memory ({memory_bytes / 1e6:.0f} MB; each an "
        f"out-of-memory on a real device): {over or 'none'}. First plan naming a lowered capacity: step {first}; "
        f"plans naming one: {lowered or 'none'}. Steps over the device memory from that plan on: "
        f"{after or 'none'} (target: none)."
    )


def memory_only(args: argparse.Namespace, profile) -> int:
    """The memory scenario: the bundled profile with its activation bytes x WRONG_MEMORY, so its
    capacities promise micro-batches the ranks cannot hold; the measured peaks lower them (issue 31
    item 3)."""
    run = online_run("memory", wrong_memory_profile(profile), args)
    setup = (
        f"{runs_text(args)}, {profile_text(args, profile)} with every scheme's activation "
        f"bytes x{WRONG_MEMORY:g} on a pretend device of {args.memory_bytes / 1e6:.0f} MB per rank, local planner "
        f"(plan budget {args.plan_time_limit_s} s) with the in-process refit. Peaks: each CPU rank's step peak on "
        f"the pinned heap (static bytes plus resident growth net of its gradients, `runtime/worker.py`). "
        f"The run took {run.wall_s:.0f} s wall."
    )
    table = memory_table(run, args.memory_bytes)
    return single_run_report(args, run, table, memory_verdict(run, args.memory_bytes), setup)


if __name__ == "__main__":
    raise SystemExit(main())
