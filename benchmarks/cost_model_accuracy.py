"""Cost-model error on this machine's CPU: fitted and calibrated predictions vs measurements (issue 11).

    python benchmarks/cost_model_accuracy.py                      # measure (~10 min), report, time the default run
    python benchmarks/cost_model_accuracy.py --measured raw.json  # report on an earlier measurement
    python benchmarks/cost_model_accuracy.py --quick              # a smoke run of a minute or two

1. **Measure**: `hydraplan profile --device cpu --model tiny --mixes long short mixed random` for
   `<1,1,1>`, `<2,1,1>`, `<1,1,2>` and both stages of `<1,2,1>` (the same code as the CLI).
2. **Measured schemes, held-out micro-batches**: each (scheme, stage) is fitted
   (`cost_models.fit.fit_stage`) on the long, short and mixed micro-batches only; the `random`
   ones (log-uniform lengths, a mix the fit never saw) are predicted. Reported: median and p95
   absolute percentage error of stage time, and the median of peak (saved-activation) memory.
3. **Calibration only**: the analytic model's hardware parameters are fitted
   (`cost_models.calibrate.calibrate`) on `<1,1,1>` and `<2,1,1>` alone (long, short, mixed), then
   every micro-batch of `<1,1,2>` and of both `<1,2,1>` stages is predicted.
4. **Profile time**: the wall time of `hydraplan profile --device cpu --model tiny` with its
   default budget (the command that regenerates the bundled profile), unless `--skip-default-run`.

Stage times are the measuring thread's CPU time (`clock: thread`; communication waits are not in
them, and TP/CP communication is modelled from the measured collectives), so the errors are of the
compute the cost model predicts. The CPU is shared with other jobs while this runs: the load
average is printed next to the figures. The full report goes to benchmarks/results/cost_model_accuracy.md,
its two error tables to the `cost_model_accuracy` section of benchmarks/RESULTS.md (`--results` for
another file).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.report import RESULTS_PATH, command_line, markdown_table, write_result  # noqa: E402
from hydraplan.api.cli import main as hydraplan_main  # noqa: E402
from hydraplan.cost_models.analytic import AnalyticOptions  # noqa: E402
from hydraplan.cost_models.calibrate import calibrate, modelled_activation_bytes, predict_stage_time_s  # noqa: E402
from hydraplan.cost_models.catalog import get_gpu, get_model  # noqa: E402
from hydraplan.cost_models.fit import build_profiled_profile, fit_collectives, fit_stage  # noqa: E402
from hydraplan.cost_models.profile_io import load_profile  # noqa: E402
from hydraplan.planner.measurements import ProfileProvenance, StageSample  # noqa: E402
from hydraplan.planner.simulate import simulate_1f1b  # noqa: E402

FIT_MIXES = ("long", "short", "mixed")
HELD_OUT = "random"
MEASURED = ((1, 1, 1), (2, 1, 1), (1, 1, 2), (1, 2, 1))
CALIBRATE_ON = ((1, 1, 1), (2, 1, 1))
PREDICT = ((1, 1, 2), (1, 2, 1))
TARGETS = {"measured_median": 0.10, "measured_p95": 0.25, "memory_median": 0.10, "calibrated_median": 0.20}
DEFAULT_RUN_LIMIT_S = 300.0
# The whole-step check's micro-batches (one pipeline's share of a batch, 1F1B on <1,2,1>).
STEP_MICRO_BATCHES = ([512], [300, 200, 12], [128] * 4, [640, 64], [96] * 5, [384, 128])
FP32_BYTES = 4


def measure(path: Path, budget_s: float, repeats: int, token_counts: list[int]) -> None:
    argv = ["profile", "--device", "cpu", "--model", "tiny", "--schemes", *(f"<{t},{p},{c}>" for t, p, c in MEASURED)]
    argv += ["--mixes", *FIT_MIXES, HELD_OUT, "--budget-s", str(budget_s), "--repeats", str(repeats)]
    argv += ["--token-counts", *map(str, token_counts), "--out", str(path), "--progress"]
    code = hydraplan_main(argv)
    if code not in (0, 130):
        raise SystemExit(f"hydraplan profile failed with exit code {code}")


def abs_errors(predicted: list[float], measured: list[float]) -> list[float]:
    return [abs(p - m) / m for p, m in zip(predicted, measured) if m > 0]


def summary(errors: list[float]) -> tuple[str, str]:
    if not errors:
        return "-", "-"
    return f"{np.median(errors):.1%}", f"{np.percentile(errors, 95):.1%}"


def by_stage(samples: list[StageSample]) -> dict[tuple, list[StageSample]]:
    groups: dict[tuple, list[StageSample]] = {}
    for sample in samples:
        if not sample.oom and sample.time_s:
            groups.setdefault((*sample.key, sample.stage), []).append(sample)
    return groups


def measured_rows(samples: list[StageSample]) -> tuple[list[list[object]], dict[str, list[float]]]:
    """Per scheme: fit on the fit mixes of each stage, predict the held-out mix."""
    rows, pooled = [], {"time": [], "memory": []}
    groups = by_stage(samples)
    for scheme in MEASURED:
        time_errors, memory_errors, fit_errors, counts = [], [], [], [0, 0]
        for key, group in groups.items():
            if key[:3] != scheme:
                continue
            fit_part = [s for s in group if s.mix in FIT_MIXES]
            held = [s for s in group if s.mix == HELD_OUT]
            if len(fit_part) < 3 or not held:
                continue
            fit = fit_stage(fit_part)
            fit_errors += [abs(r) for r in fit.time_residuals]
            time_errors += abs_errors([fit.stage_time_s(s.lengths) for s in held], [s.time_s for s in held])
            # against what the fit was made on: the real peak where measured, else the saved bytes
            with_memory = [s for s in held if (s.peak_bytes or s.activation_bytes)]
            memory_errors += abs_errors(
                [fit.activation_bytes(s.lengths) + fit.static_bytes - max(s.static_bytes or 0, 0) for s in with_memory],
                [s.peak_bytes or s.activation_bytes for s in with_memory],
            )
            counts[0] += len(fit_part)
            counts[1] += len(held)
        pooled["time"] += time_errors
        pooled["memory"] += memory_errors
        median, p95 = summary(time_errors)
        rows.append(
            [_name(scheme), counts[0], counts[1], summary(fit_errors)[0], median, p95, summary(memory_errors)[0]]
        )
    return rows, pooled


def calibrated_rows(provenance: ProfileProvenance) -> tuple[list[list[object]], list[float], str]:
    """Calibrate on CALIBRATE_ON (fit mixes), predict every micro-batch of PREDICT."""
    model, gpu, options = get_model("tiny"), get_gpu("h100-sxm-80gb"), AnalyticOptions()
    training = [s for s in provenance.samples if s.key in CALIBRATE_ON and s.mix in FIT_MIXES]
    calibration = calibrate(model, gpu, provenance.model_copy(update={"samples": training}), options)
    hardware = calibration.hardware
    rows, pooled = [], []
    for scheme in PREDICT:
        targets = [s for s in provenance.samples if s.key == scheme and not s.oom and s.time_s]
        predicted = [
            predict_stage_time_s(model, gpu, s, hardware, options, include_communication=False) for s in targets
        ]
        errors = abs_errors(predicted, [s.time_s for s in targets])
        pooled += errors
        memory = [s for s in targets if s.activation_bytes]
        memory_predicted = [
            hardware.activation_memory_scale
            * modelled_activation_bytes(model, s, hardware.activation_element_bytes, options)
            for s in memory
        ]
        memory_errors = abs_errors(memory_predicted, [s.activation_bytes for s in memory])
        median, p95 = summary(errors)
        rows.append([_name(scheme), len(targets), median, p95, summary(memory_errors)[0]])
    fitted = (
        f"Fitted features: {', '.join(calibration.fitted)}. GEMM {hardware.gemm_flops_per_s / 1e9:.1f} GFLOP/s "
        f"(half-point {hardware.gemm_half_dim:.3g}), per-token work TP does not split "
        f"{hardware.unsplit_s_per_token_per_layer * 1e6:.2f} us per layer, attention "
        f"{hardware.attention_flops_per_s / 1e9:.1f} GFLOP/s (half-points {hardware.attention_half_length_tokens:.3g} "
        f"tokens, {hardware.attention_half_heads:.3g} heads), {hardware.per_layer_overhead_s * 1e3:.2f} ms per layer "
        f"and {hardware.per_micro_batch_overhead_s * 1e3:.2f} ms per micro-batch, activation memory "
        f"{hardware.activation_memory_scale:.2f}x Korthikanti's count at fp32; in-sample error median "
        f"{calibration.error()['time_median_abs_error']:.1%}."
    )
    return rows, pooled, fitted


def whole_step(provenance: ProfileProvenance, repeats: int) -> str:
    """A measured 2-stage 1F1B step against the planner's 1F1B simulation of the fitted profile."""
    from benchmarks.pipeline_step import critical_path_s, measure_step

    fit_only = provenance.model_copy(update={"samples": [s for s in provenance.samples if s.mix in FIT_MIXES]})
    model = get_model("tiny")
    profile = build_profiled_profile(
        fit_only, model="tiny", device_name="cpu", num_layers=model.num_layers, memory_bytes=None, model_spec=model
    )
    entry = next(e for e in profile.schemes if e.key == (1, 2, 1))
    stage_times = [entry.a * sum(x * x for x in item) + entry.b * sum(item) + entry.c for item in STEP_MICRO_BATCHES]
    predicted = simulate_1f1b(stage_times, 2, entry.fwd_fraction)
    p2p = fit_collectives(provenance.collectives).get(("send_recv", 2))
    transfer = [p2p.seconds(sum(item) * model.hidden_size * FP32_BYTES) if p2p else 0.0 for item in STEP_MICRO_BATCHES]
    ranks = measure_step(STEP_MICRO_BATCHES, repeats)
    paths, walls = [], []
    for repeat in range(repeats):
        durations = [ranks[stage]["runs"][repeat]["durations"] for stage in range(2)]
        paths.append(critical_path_s(durations, len(STEP_MICRO_BATCHES), transfer))
        walls.append(max(ranks[stage]["runs"][repeat]["wall_s"] for stage in range(2)))
    measured, wall = statistics.median(paths), statistics.median(walls)
    return (
        f"- whole-step check, 2-rank 1F1B step of <1,2,1> ({len(STEP_MICRO_BATCHES)} micro-batches, "
        f"{sum(map(sum, STEP_MICRO_BATCHES))} tokens, median of {repeats}): planner predicts {predicted * 1e3:.0f} ms "
        f"(fitted profile, `simulate_1f1b`); measured critical path of the executed schedule {measured * 1e3:.0f} ms "
        f"(per-operation thread CPU time plus the measured p2p transfer): error "
        f"{abs(predicted - measured) / measured:.1%}; "
        f"elapsed wall time {wall * 1e3:.0f} ms on the shared CPU (other processes' load included, so not comparable)"
    )


def time_default_run() -> float:
    """Wall seconds of the documented command (into a temporary file)."""
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        script = Path(sys.executable).with_name("hydraplan")  # the one installed next to this Python
        executable = str(script) if script.exists() else "hydraplan"
        command = [executable, "profile", "--device", "cpu", "--model", "tiny", "--out", f"{folder}/p.json"]
        subprocess.run(command, check=True, timeout=2 * DEFAULT_RUN_LIMIT_S)
        return time.perf_counter() - started


def _name(scheme: tuple[int, int, int]) -> str:
    name = f"<{scheme[0]},{scheme[1]},{scheme[2]}>"
    return name + " (both stages)" if scheme[1] > 1 else name


def _verdict(value: float, target: float) -> str:
    return f"{value:.1%} ({'met' if value <= target else 'NOT met'}, target <= {target:.0%})"


def report(
    provenance: ProfileProvenance,
    default_run_s: float | None,
    step_line: str | None,
    load: str,
    args: argparse.Namespace,
) -> tuple[str, str]:
    """The full report, and its summary: the measured schemes' and the calibration-only schemes' errors."""
    rows, pooled = measured_rows(provenance.samples)
    calibrated, calibrated_pooled, fitted = calibrated_rows(provenance)
    source = (
        f"Raw measurement: `{args.measured}` (taken by this script with `--repeats 5 --keep FILE`; measurement "
        f"budget {provenance.budget_s:.0f} s, {'cut by the budget' if provenance.interrupted else 'complete'})."
        if args.measured
        else f"Measurement budget {provenance.budget_s:.0f} s "
        f"({'cut by it' if provenance.interrupted else 'complete'})."
    )
    measured_title = "Measured schemes: held-out micro-batches (random lengths; fit on long, short, mixed)"
    measured = markdown_table(
        ["scheme", "fit batches", "held-out", "fit error (median)", "time median", "time p95", "memory median"], rows
    )
    calibration_title = "Calibration only (hardware parameters fitted on <1,1,1> and <2,1,1>)"
    calibration = markdown_table(["scheme", "micro-batches", "time median", "time p95", "memory median"], calibrated)
    parts = [
        source,
        f"Measured {len(provenance.samples)} micro-batches ({provenance.hardware}, torch {provenance.torch_version}, "
        f"{provenance.num_threads} thread per rank, {provenance.dtype}, clock {provenance.clock}, {provenance.date}); "
        f"load average {load} on a CPU shared with other jobs: figures are noisy.",
        f"### {measured_title}",
        measured,
        f"### {calibration_title}",
        fitted,
        calibration,
        "### Targets",
    ]
    time_median = statistics.median(pooled["time"]) if pooled["time"] else float("nan")
    time_p95 = float(np.percentile(pooled["time"], 95)) if pooled["time"] else float("nan")
    memory_median = statistics.median(pooled["memory"]) if pooled["memory"] else float("nan")
    calibrated_median = statistics.median(calibrated_pooled) if calibrated_pooled else float("nan")
    lines = [
        "Pooled over the schemes of each group (every held-out or predicted micro-batch counts once); the "
        "tables above give each scheme's own figures:",
        "",
        f"- measured schemes, stage time median: {_verdict(time_median, TARGETS['measured_median'])}",
        f"- measured schemes, stage time p95: {_verdict(time_p95, TARGETS['measured_p95'])}",
        f"- measured schemes, peak memory median: {_verdict(memory_median, TARGETS['memory_median'])}",
        f"- calibration-only schemes, stage time median: {_verdict(calibrated_median, TARGETS['calibrated_median'])}",
    ]
    if default_run_s is not None:
        state = "met" if default_run_s <= DEFAULT_RUN_LIMIT_S else "NOT met"
        lines.append(
            f"- `hydraplan profile --device cpu --model tiny` (default budget): {default_run_s:.0f} s "
            f"({state}, target <= 300 s)"
        )
    lines.append(step_line or "- whole-step check: skipped (--skip-step)")
    lines += _per_scheme_misses(rows, calibrated)
    parts.append("\n".join(lines))
    summary = f"{measured_title}:\n\n{measured}\n\n{calibration_title}:\n\n{calibration}"
    return "\n\n".join(parts), summary


def _per_scheme_misses(measured: list[list[object]], calibrated: list[list[object]]) -> list[str]:
    """One line per scheme whose own figure misses a target (the targets read per scheme too)."""
    misses = []
    checks = [(measured, 4, "measured_median", "stage time median"), (measured, 5, "measured_p95", "stage time p95")]
    checks += [
        (measured, 6, "memory_median", "memory median"),
        (calibrated, 2, "calibrated_median", "stage time median"),
    ]
    for rows, column, target, what in checks:
        for row in rows:
            cell = str(row[column])
            if cell.endswith("%") and float(cell[:-1]) / 100 > TARGETS[target]:
                misses.append(f"- per scheme: {row[0]} {what} {cell} is above its target ({TARGETS[target]:.0%})")
    return misses


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Cost-model error on this CPU (issue 11).")
    parser.add_argument("--measured", type=Path, help="report on this earlier raw measurement instead of measuring")
    parser.add_argument("--keep", type=Path, help="keep the raw measurement in this file")
    parser.add_argument("--budget-s", type=float, default=900.0, help="measurement budget (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--token-counts", type=int, nargs="+", default=[128, 256, 512, 768])
    parser.add_argument("--skip-default-run", action="store_true", help="do not time the default profile command")
    parser.add_argument("--skip-step", action="store_true", help="do not run the whole-step check")
    parser.add_argument("--quick", action="store_true", help="smoke run: small batches, 1 repeat, no default run")
    parser.add_argument(
        "--results", type=Path, default=RESULTS_PATH, help="summary file; the full output goes to results/ beside it"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.token_counts, args.repeats, args.skip_default_run, args.budget_s = [32, 64, 96], 1, True, 120.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load = "{:.1f} / {:.1f} / {:.1f} (1, 5, 15 min)".format(*os.getloadavg())
    if args.measured is None:
        path = args.keep or Path(tempfile.mkdtemp()) / "raw.json"
        measure(path, args.budget_s, args.repeats, args.token_counts)
        load = "{:.1f} / {:.1f} / {:.1f} (1, 5, 15 min) at the end of the measurement".format(*os.getloadavg())
    else:
        path = args.measured
        load += " when this report was made (the measurement's own is not in the file)"
    provenance = load_profile(path).provenance
    step_line = None if args.skip_step else whole_step(provenance, args.repeats)
    default_run_s = None if args.skip_default_run else time_default_run()
    body, summary = report(provenance, default_run_s, step_line, load, args)
    print(body)
    if not args.quick:
        write_result("cost_model_accuracy", command_line(), body, summary, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
