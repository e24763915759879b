"""Measured vs predicted step time: hydraplan's plan and the `megatron` baseline, run on CPU (issue 12.8).

    python benchmarks/runtime_vs_model.py                  # 4 batches x 2 plans, bundled tiny-cpu profile
    python benchmarks/runtime_vs_model.py --fresh-profile  # measure a new profile first (~5 min)
    python benchmarks/runtime_vs_model.py --quick          # a smoke run: 1 small batch, 2 steps

1. **Profile**: the CPU-measured profile of the `tiny` model (`cost_models/data/tiny-cpu.json`, or
   a fresh `hydraplan profile --device cpu --model tiny` with `--fresh-profile`). Its memory is
   set to `--memory-bytes` per rank (a pretend device: the host's RAM would let any scheme hold
   the whole batch in one micro-batch, and packing would not matter), so capacities are ~1K-1.5K
   tokens and long sequences need TP, CP or PP.
2. **Batches**: seeded long-tailed lengths (lognormal, clipped to [16, 1150]) of about
   `--tokens` tokens each.
3. **Plans**: hydraplan (`plan_with_profile`, heterogeneous allowed) and `megatron` (the best
   homogeneous arrival-order plan, `planner.baselines`) on the same batch and cluster; and an
   interleaved plan (issue 32): the fixed strategy `INTERLEAVED_STRATEGY`, whose `<1,2,1,2>`
   entry is the measured `<1,2,1>` entry cut into 2 chunks with the profile's own point-to-point
   figures (`interleaved_profile`: its `send_recv` samples) for the extra transfers.
4. **Run**: each plan with `hydraplan run --plan P --steps K --report R` (the CLI's own code, on
   `--num-gpus` gloo ranks, float32); step 0 warms up, the median over the others is reported.
5. **Measured step** (`runtime.step_timing`): per pipeline the longest path through the executed
   1F1B graph with each op's thread CPU time plus its TP/CP collectives' transfer time and the
   p2p transfers on its edges, the slowest pipeline plus the gradient sync (what the planner's
   `step_time_s` is: slowest pipeline + `grad_sync_s`); the AdamW step is shown beside it (the
   planner has no optimizer term). Overhead: the slowest pipeline's path against the ops' own
   work on it (model compute + the TP/CP collectives inside the layers: the runtime's share is
   the rest, its bookkeeping and the p2p transfers), and against the model compute alone.

The full report goes to benchmarks/results/<section>.md, the step-time table to the section
(`--section`, default `runtime_vs_model`) of benchmarks/RESULTS.md (`--results` for another file);
nothing is written with `--quick`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.report import RESULTS_PATH, command_line, markdown_table, write_result  # noqa: E402

SECTION = "runtime_vs_model"
TARGET_ERROR = 0.15
TARGET_OVERHEAD = 0.10
MEASURED_SCHEMES = ("<1,1,1>", "<2,1,1>", "<1,1,2>", "<1,2,1>")
INTERLEAVED_STRATEGY = "1x<2,1,1> + 1x<1,2,1,2>"  # beside a TP pipeline, which holds the longest
FLOAT32_BYTES = 4  # the runs' activations


# ---------------------------------------------------------------------------------------------
# What one run of one plan gave (plain data: the table builders below are tested on it)
# ---------------------------------------------------------------------------------------------


@dataclass
class StageSample:
    """One micro-batch on one PP stage: predicted vs measured (seconds)."""

    scheme: str
    predicted_s: float
    model_s: float  # model forward + backward, thread CPU (slowest rank of the stage)
    bookkeeping_s: float
    collectives_s: float
    fwd_s: float  # the forward op's duration

    @property
    def measured_s(self) -> float:
        return self.model_s + self.bookkeeping_s + self.collectives_s


@dataclass
class RunResult:
    """One plan of one batch, predicted and measured (medians over the timed steps)."""

    batch: int
    name: str  # "hydraplan" or "megatron"
    strategy: str
    num_tokens: int
    predicted_step_s: float
    predicted_pipeline_s: float
    predicted_sync_s: float
    measured_step_s: float  # slowest pipeline's critical path + gradient sync
    measured_pipeline_s: float
    measured_sync_s: float
    optimizer_s: float
    overhead: float  # slowest pipeline's path / model compute on it - 1
    runtime_overhead: float  # ... / (model compute + TP/CP collectives on it) - 1
    path_parts_s: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0  # the slowest rank's wall time of the pipeline part of a step
    measured_step_comm_wall_s: float = 0.0  # the measured step with communication by the wall clock
    measured_step_comm_busiest_s: float = 0.0  # ... by the busiest participant's CPU time
    samples: list[StageSample] = field(default_factory=list)

    @property
    def error(self) -> float:
        return (self.predicted_step_s - self.measured_step_s) / self.measured_step_s


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f}"


def median_error(results: list[RunResult]) -> float:
    return statistics.median(abs(result.error) for result in results) if results else float("nan")


def run_rows(results: list[RunResult]) -> list[list[object]]:
    """One row per (batch, plan)."""
    rows = []
    for r in results:
        rows.append(
            [
                r.batch,
                r.name,
                r.strategy,
                _ms(r.predicted_step_s),
                _ms(r.measured_step_s),
                f"{r.error:+.1%}",
                f"{_ms(r.predicted_pipeline_s)} / {_ms(r.measured_pipeline_s)}",
                f"{r.predicted_sync_s * 1e3:.0f} / {r.measured_sync_s * 1e3:.0f}",
                _ms(r.optimizer_s),
                f"{r.runtime_overhead:.1%} / {r.overhead:.1%}",
                _ms(r.measured_step_comm_busiest_s),
                _ms(r.measured_step_comm_wall_s),
                _ms(r.wall_s),
            ]
        )
    return rows


RUN_HEADERS = [
    "batch",
    "plan",
    "strategy",
    "predicted ms",
    "measured ms",
    "error",
    "slowest pipeline ms (pred / meas)",
    "grad sync ms (pred / meas)",
    "AdamW ms (not modelled)",
    "path overhead (runtime / incl. collectives)",
    "measured ms, comm by busiest CPU",
    "measured ms, comm by wall clock",
    "elapsed wall ms",
]


def winner_rows(results: list[RunResult], error: float) -> tuple[list[list[object]], list[str]]:
    """Per batch: the predicted and the measured faster plan, and whether they agree.

    Where the two plans' measured times differ by no more than `error` (the median error), the
    measurement cannot tell them apart, and a disagreement does not count against the target."""
    by_batch: dict[int, dict[str, RunResult]] = {}
    for r in results:
        if r.name in ("hydraplan", "megatron"):  # the interleaved plan is a fixed strategy, not a contender
            by_batch.setdefault(r.batch, {})[r.name] = r
    rows, misses = [], []
    for batch, plans in sorted(by_batch.items()):
        if len(plans) != 2:
            continue
        first, second = plans.values()
        predicted = min(plans.values(), key=lambda r: r.predicted_step_s)
        measured = min(plans.values(), key=lambda r: r.measured_step_s)
        predicted_gap = abs(first.predicted_step_s - second.predicted_step_s) / min(
            first.predicted_step_s, second.predicted_step_s
        )
        measured_gap = abs(first.measured_step_s - second.measured_step_s) / min(
            first.measured_step_s, second.measured_step_s
        )
        if first.strategy == second.strategy and first.predicted_step_s == second.predicted_step_s:
            verdict = "same plan"
        elif predicted.name == measured.name:
            verdict = "agree"
        elif measured_gap <= error:
            verdict = "differ, within the error"
        else:
            verdict = "DISAGREE"
            misses.append(f"batch {batch}: predicted {predicted.name}, measured {measured.name} ({measured_gap:.1%})")
        rows.append([batch, predicted.name, f"{predicted_gap:.1%}", measured.name, f"{measured_gap:.1%}", verdict])
    return rows, misses


WINNER_HEADERS = ["batch", "predicted faster", "predicted gap", "measured faster", "measured gap", "verdict"]


def term_rows(results: list[RunResult]) -> list[list[object]]:
    """Per scheme, over every micro-batch on every stage: which part of the stage time is off."""
    by_scheme: dict[str, list[StageSample]] = {}
    for r in results:
        for sample in r.samples:
            by_scheme.setdefault(sample.scheme, []).append(sample)
    rows = []
    for scheme in sorted(by_scheme):
        samples = by_scheme[scheme]
        ratio = [s.measured_s / s.predicted_s for s in samples if s.predicted_s > 0]
        errors = [abs(s.measured_s - s.predicted_s) / s.measured_s for s in samples if s.measured_s > 0]
        total = sum(s.measured_s for s in samples) or 1.0
        rows.append(
            [
                scheme,
                len(samples),
                f"{statistics.median(ratio):.3f}",
                f"{statistics.median(errors):.1%}",
                f"{sum(s.model_s for s in samples) / total:.1%}",
                f"{sum(s.bookkeeping_s for s in samples) / total:.1%}",
                f"{sum(s.collectives_s for s in samples) / total:.1%}",
                f"{statistics.median(s.fwd_s / s.measured_s for s in samples if s.measured_s > 0):.3f}",
            ]
        )
    return rows


TERM_HEADERS = [
    "scheme",
    "stage samples",
    "measured / predicted (median)",
    "abs error (median)",
    "model compute",
    "bookkeeping",
    "TP/CP collectives",
    "forward share",
]


def target_lines(results: list[RunResult], misses: list[str]) -> list[str]:
    error = median_error(results)
    heterogeneous = [r for r in results if r.name == "hydraplan"]
    overhead = statistics.median(r.runtime_overhead for r in heterogeneous) if heterogeneous else float("nan")
    worst = max((r.runtime_overhead for r in heterogeneous), default=float("nan"))
    strict = statistics.median(r.overhead for r in heterogeneous) if heterogeneous else float("nan")
    strict_worst = max((r.overhead for r in heterogeneous), default=float("nan"))
    state = "met" if error <= TARGET_ERROR else "NOT met"
    lines = [
        f"- step time error, median over {len(results)} runs: {error:.1%} ({state}, target <= {TARGET_ERROR:.0%})",
        f"- predicted winner = measured winner wherever the measured gap exceeds the median error: "
        f"{'met' if not misses else 'NOT met: ' + '; '.join(misses)}",
        f"- runtime overhead, hydraplan plans (slowest pipeline's critical path over the ops' own work on it: "
        f"model compute + the TP/CP collectives inside the layers, which the profile's stage times hold): "
        f"median {overhead:.1%}, worst {worst:.1%} ({'met' if worst <= TARGET_OVERHEAD else 'NOT met'}, "
        f"target <= {TARGET_OVERHEAD:.0%})",
        f"- the same over the model compute alone (TP/CP collectives counted as overhead): median {strict:.1%}, "
        f"worst {strict_worst:.1%} ({'within' if strict_worst <= TARGET_OVERHEAD else 'over'} "
        f"{TARGET_OVERHEAD:.0%})" + _overhead_split(heterogeneous),
    ]
    return lines


def _overhead_split(results: list[RunResult]) -> str:
    """What the overhead is made of, as medians over the runs (shares of the model compute)."""
    with_parts = [r for r in results if r.path_parts_s.get("model_s")]
    if not with_parts:
        return ""
    shares = {
        part: statistics.median(r.path_parts_s[part] / r.path_parts_s["model_s"] for r in with_parts)
        for part in ("bookkeeping_s", "transfer_s", "collectives_s")
    }
    return (
        f"; of it the runtime's own bookkeeping {shares['bookkeeping_s']:.1%} and p2p transfers "
        f"{shares['transfer_s']:.1%}, TP/CP collectives {shares['collectives_s']:.1%} (medians)"
    )


def report_body(results: list[RunResult], preamble: list[str]) -> str:
    error = median_error(results)
    winners, misses = winner_rows(results, error)
    parts = [
        *preamble,
        "### Step times (median over the timed steps)",
        markdown_table(RUN_HEADERS, run_rows(results)),
        "### Which plan is faster",
        markdown_table(WINNER_HEADERS, winners),
        "### Per scheme: stage time of a micro-batch on one stage, measured vs the profile's `a, b, c`",
        "Measured: the forward and backward ops' model compute + bookkeeping + TP/CP collectives (slowest "
        "rank of the stage); predicted: the plan's `stage_time_s`. The shares split the measured time.",
        markdown_table(TERM_HEADERS, term_rows(results)),
        "### Targets",
        "\n".join(target_lines(results, misses)),
    ]
    return "\n\n".join(parts)


# ---------------------------------------------------------------------------------------------
# Profile, batches, plans, runs
# ---------------------------------------------------------------------------------------------


def benchmark_profile(profile, memory_bytes: float):
    """`profile` on a pretend device of `memory_bytes` per rank (capacities from its memory model)."""
    schemes = [entry.model_copy(update={"capacity_tokens": None}) for entry in profile.schemes]
    update = {"gpu_memory_bytes": memory_bytes, "memory_reserve_bytes": 0.0, "schemes": schemes}
    return profile.model_copy(update=update)


def batch_lengths(seed: int, tokens: int) -> list[int]:
    """Long-tailed lengths drawn until their sum reaches `tokens` (seeded)."""
    rng = np.random.default_rng(seed)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(int(np.clip(rng.lognormal(5.3, 1.0), 16, 1150)))
    return lengths


def fresh_profile(path: Path, budget_s: float, token_counts: list[int], repeats: int) -> None:
    from hydraplan.api.cli import main as hydraplan_main

    argv = ["profile", "--device", "cpu", "--model", "tiny", "--schemes", *MEASURED_SCHEMES]
    argv += ["--token-counts", *map(str, token_counts), "--repeats", str(repeats)]
    argv += ["--budget-s", str(budget_s), "--out", str(path), "--progress"]
    if hydraplan_main(argv) not in (0, 130):
        raise SystemExit("hydraplan profile failed")


def p2p_figures(profile) -> tuple[float, float]:
    """(seconds per byte, seconds per message) of a point-to-point transfer: a least-squares line
    through the profile's measured `send_recv` samples, each part at least 0."""
    samples = [c for c in (profile.provenance.collectives if profile.provenance else []) if c.op == "send_recv"]
    if len(samples) < 2:
        return 0.0, 0.0
    slope, intercept = np.polyfit([c.bytes for c in samples], [c.seconds for c in samples], 1)
    return max(0.0, float(slope)), max(0.0, float(intercept))


def interleaved_profile(profile, hidden_size: int):
    """`profile` with `<1,2,1,2>`: the `<1,2,1>` entry cut into 2 chunks (`analytic.chunk_entry`),
    each chunk's extra boundary transfers (the activation forward, its gradient backward: 2
    messages of `hidden_size` float32 values per token) priced by `p2p_figures`; its capacity is
    derived from its memory under the interleaved schedule."""
    from hydraplan.cost_models.analytic import chunk_entry

    per_byte, per_message = p2p_figures(profile)
    plain = next(entry for entry in profile.schemes if entry.key == (1, 2, 1))
    chunked = chunk_entry(plain, 2, 2 * hidden_size * FLOAT32_BYTES * per_byte, 2 * per_message)
    return profile.model_copy(update={"schemes": [*profile.schemes, chunked]})


def make_plans(lengths: list[int], profile, num_gpus: int, time_limit_s: float) -> dict:
    import hydraplan
    from hydraplan.planner.baselines import megatron
    from hydraplan.planner.schemas import PlanRequest, SolverOptions
    from hydraplan.planner.solve import evaluate_strategy
    from hydraplan.planner.strategies import parse_strategy

    plans = {
        "hydraplan": hydraplan.plan_with_profile(
            lengths, profile, num_gpus=num_gpus, gpus_per_node=num_gpus, time_limit_s=time_limit_s
        )
    }
    request = PlanRequest(
        lengths=lengths, num_gpus=num_gpus, gpus_per_node=num_gpus, options=SolverOptions(time_limit_s=time_limit_s)
    )
    plans["megatron"] = megatron(request, profile)
    if num_gpus == 4 and any(entry.v > 1 for entry in profile.schemes):
        plans["interleaved"] = evaluate_strategy(request, profile, parse_strategy(INTERLEAVED_STRATEGY))
    return plans


def run_plan(plan, steps: int, folder: Path, reuse: bool = False) -> list[dict]:
    """Every rank's report of `hydraplan run --plan ... --steps ... --report ...` (its summary kept
    quiet); with `reuse`, the report kept in `folder` for this plan id is read instead."""
    from hydraplan.api.cli import main as hydraplan_main

    plan_path, report_path = folder / f"{plan.plan_id}.json", folder / f"{plan.plan_id}.report.json"
    if reuse:
        if not report_path.exists():  # a plan cut by the clock differs from the kept one
            raise SystemExit(f"--reuse: no kept report for plan {plan.plan_id} ({plan.strategy}) in {folder}")
        return json.loads(report_path.read_text())["ranks"]
    plan_path.write_text(plan.model_dump_json())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = hydraplan_main(["run", "--plan", str(plan_path), "--steps", str(steps), "--report", str(report_path)])
    if code != 0:
        raise SystemExit(f"hydraplan run failed ({code}):\n{out.getvalue()}")
    return json.loads(report_path.read_text())["ranks"]


def summarise(batch: int, name: str, plan, reports: list[dict]) -> RunResult:
    """Predicted and measured figures of one run (step 0 is the warm-up when there are more)."""
    from hydraplan.runtime.step_timing import op_times, step_timing

    steps = range(1 if len(reports[0]["steps"]) > 1 else 0, len(reports[0]["steps"]))
    timings = [step_timing(reports, step) for step in steps]
    by_wall = [step_timing(reports, step, clock="wall") for step in steps]
    by_busiest = [step_timing(reports, step, clock="cpu-busiest") for step in steps]

    def median(values) -> float:
        return statistics.median(list(values))

    paths = [t.pipelines[t.slowest_pipeline] for t in timings]
    result = RunResult(
        batch=batch,
        name=name,
        strategy=plan.strategy,
        num_tokens=sum(plan.input_lengths),
        predicted_step_s=plan.step_time_s,
        predicted_pipeline_s=max(p.time_s for p in plan.pipelines),
        predicted_sync_s=plan.grad_sync_s,
        measured_step_s=median(t.step_s for t in timings),
        measured_pipeline_s=median(t.pipeline_s for t in timings),
        measured_sync_s=median(t.sync_s for t in timings),
        optimizer_s=median(t.optimizer_s for t in timings),
        overhead=median(p.overhead for p in paths),
        runtime_overhead=median(p.runtime_overhead for p in paths),
        path_parts_s={
            part: median(getattr(p, part) for p in paths)
            for part in ("model_s", "bookkeeping_s", "collectives_s", "transfer_s")
        },
        wall_s=median(max(r["steps"][step]["pipeline_s"] for r in reports) for step in steps),
        measured_step_comm_wall_s=median(t.step_s for t in by_wall),
        measured_step_comm_busiest_s=median(t.step_s for t in by_busiest),
    )
    last = steps[-1]
    for pipeline in plan.pipelines:
        scheme = str(pipeline.scheme.scheme)
        chunks = range(pipeline.scheme.v) if pipeline.scheme.v > 1 else [None]
        for stage in range(pipeline.scheme.pp):
            mine = [r["steps"][last]["ops"] for r in reports if r["pipeline"] == pipeline.index and r["stage"] == stage]
            times = op_times(mine)
            for index, micro in enumerate(pipeline.micro_batches):
                # a stage's micro-batch: its op, or its v chunks' ops summed (what `stage_time_s` prices)
                keys = [(index,) if chunk is None else (index, chunk) for chunk in chunks]
                forward, backward = (
                    _summed([times[(True, *k)] for k in keys]),
                    _summed([times[(False, *k)] for k in keys]),
                )
                result.samples.append(
                    StageSample(
                        scheme=scheme,
                        predicted_s=micro.stage_time_s,
                        model_s=forward.model_s + backward.model_s,
                        bookkeeping_s=forward.bookkeeping_s + backward.bookkeeping_s,
                        collectives_s=forward.collectives_s + backward.collectives_s,
                        fwd_s=forward.duration_s,
                    )
                )
    return result


def _summed(parts):
    """One `OpTime` holding the parts' times (a stage's micro-batch over its chunks)."""
    from hydraplan.runtime.step_timing import OpTime

    return OpTime(
        model_s=sum(p.model_s for p in parts),
        bookkeeping_s=sum(p.bookkeeping_s for p in parts),
        collectives_s=sum(p.collectives_s for p in parts),
        transfer_s=sum(p.transfer_s for p in parts),
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Measured vs predicted step times on this CPU (issue 12.8).")
    parser.add_argument("--batches", type=int, default=4, help="seeded batches (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=4000, help="tokens per batch (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=3, help="steps per run, the first a warm-up (default: 3)")
    parser.add_argument("--num-gpus", type=int, default=4, help="ranks (default: %(default)s)")
    parser.add_argument("--memory-bytes", type=float, default=150e6, help="pretend device memory per rank")
    parser.add_argument("--time-limit-s", type=float, default=1.0, help="planning budget (default: 1.0)")
    parser.add_argument("--profile", type=Path, help="a profile file instead of the bundled tiny-cpu")
    parser.add_argument("--fresh-profile", action="store_true", help="measure a new CPU profile first")
    parser.add_argument("--profile-budget-s", type=float, default=480.0)
    parser.add_argument("--profile-token-counts", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--profile-repeats", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="keep the plans and run reports in this folder")
    parser.add_argument(
        "--reuse", action="store_true", help="report on the runs kept in --keep (plans are deterministic: same ids)"
    )
    parser.add_argument(
        "--no-interleaved", action="store_true", help=f"leave out the interleaved plan ({INTERLEAVED_STRATEGY})"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 batch of 1500 tokens, 2 steps, no write")
    parser.add_argument(
        "--results", type=Path, default=RESULTS_PATH, help="summary file; the full output goes to results/ beside it"
    )
    parser.add_argument(
        "--section", default=SECTION, help="section (and results/<section>.md file) to write (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    if args.reuse and args.keep is None:
        parser.error("--reuse needs --keep DIR")
    if args.quick:
        args.batches, args.tokens, args.steps = 1, 1500, 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from hydraplan.cost_models.profile_io import bundled_profile, load_profile

    folder = args.keep or Path(tempfile.mkdtemp(prefix="runtime_vs_model-"))
    folder.mkdir(parents=True, exist_ok=True)
    if args.fresh_profile:
        args.profile = folder / "tiny-cpu-fresh.json"
        fresh_profile(args.profile, args.profile_budget_s, args.profile_token_counts, args.profile_repeats)
    from hydraplan.cost_models.catalog import get_model

    source = load_profile(args.profile) if args.profile else bundled_profile("tiny-cpu")
    profile = benchmark_profile(source, args.memory_bytes)
    if not args.no_interleaved and source.num_layers % 4 == 0:
        profile = interleaved_profile(profile, get_model(source.model or "tiny").hidden_size)
    started, results = time.perf_counter(), []
    load_before = os.getloadavg()
    for batch in range(args.batches):
        lengths = batch_lengths(batch, args.tokens)
        for name, plan in make_plans(lengths, profile, args.num_gpus, args.time_limit_s).items():
            result = summarise(batch, name, plan, run_plan(plan, args.steps, folder, args.reuse))
            results.append(result)
            print(
                f"batch {batch} {name} {plan.strategy}: predicted {_ms(result.predicted_step_s)} ms, measured "
                f"{_ms(result.measured_step_s)} ms ({result.error:+.1%}), overhead {result.runtime_overhead:.1%} "
                f"(incl. collectives {result.overhead:.1%})",
                flush=True,
            )
    load_after = os.getloadavg()
    meta_path = folder / "runs.json"  # when and under which load the runs were taken
    if args.reuse and meta_path.exists():
        meta = json.loads(meta_path.read_text())
    else:
        meta = {
            "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M UTC}",
            "load_before": load_before[0],
            "load_after": load_after[0],
            "elapsed_s": time.perf_counter() - started,
        }
        meta_path.write_text(json.dumps(meta))
    provenance = source.provenance
    if args.fresh_profile:
        which = (
            f"a fresh measurement on this machine just before the runs (`--fresh-profile`: `hydraplan profile "
            f"--device cpu --model tiny`, token counts {args.profile_token_counts}, {args.profile_repeats} repeats, "
            f"budget {args.profile_budget_s:.0f} s; {len(source.schemes)} schemes fitted)"
        )
    else:
        which = f"`{args.profile}`" if args.profile else "the bundled `cost_models/data/tiny-cpu.json`"
    profile_line = (
        f"Profile: {which}"
        f" ({provenance.hardware if provenance else '?'}, measured {provenance.date if provenance else '?'}, "
        f"clock {provenance.clock if provenance else '?'}), capacities from a pretend device memory of "
        f"{args.memory_bytes / 1e6:.0f} MB per rank: "
        + ", ".join(f"{e.scheme} {c}" for e, c in _capacities(profile))
        + " tokens."
    )
    preamble = [
        profile_line,
        f"{args.batches} batches (seeds 0-{args.batches - 1}, lognormal lengths clipped to [16, 1150], about "
        f"{args.tokens} tokens each) on {args.num_gpus} gloo ranks (torch {metadata.version('torch')}, float32, 1 "
        f"thread per rank), {args.steps} steps per run (step 0 a warm-up; medians over the rest); planning budget "
        f"{args.time_limit_s} s. Runs taken {meta['date']}, load average {meta['load_before']:.1f} before, "
        f"{meta['load_after']:.1f} after (2 cores shared with other jobs); {meta['elapsed_s']:.0f} s in all"
        + (" (this report re-read their kept reports: `--reuse`)." if args.reuse else "."),
        "Measured step = the slowest pipeline's critical path through its executed 1F1B graph (ops: the "
        "thread CPU time of the stage's slowest rank + its TP/CP collectives, each the mean process CPU "
        "time over the stage's ranks (gloo's threads at work: every participant of a ring collective does "
        "the same work, and gloo's caller sleeps while it waits, so the ranks' figures differ by noise and "
        "their largest is biased upwards; `runtime/step_timing.py`); edges: the p2p payload's receive, "
        "process CPU) + the gradient sync (per bucket the mean process CPU time over its holders, summed "
        "per rank, the slowest rank): the planner's `step_time_s` is the slowest simulated pipeline + "
        "`grad_sync_s`. `comm by busiest CPU`: the same with the largest CPU time over the participants "
        "(the figure of earlier runs, an upper one). `comm by wall clock`: the same with every "
        "communication timed by the least wall "
        "time over its participants instead (on these oversubscribed cores that includes waiting to be "
        "scheduled). `elapsed wall ms`: the slowest rank's elapsed pipeline time, for scale only.",
    ]
    body = report_body(results, preamble)
    print(body)
    if not args.quick:
        summary = markdown_table(RUN_HEADERS, run_rows(results))
        write_result(args.section, command_line(), body, summary, args.results)
    return 0


def _capacities(profile):
    from hydraplan.planner.schemas import derive_capacity_tokens

    return [(entry, derive_capacity_tokens(profile, entry)) for entry in profile.schemes]


if __name__ == "__main__":
    sys.exit(main())
