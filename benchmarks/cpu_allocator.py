"""What pinning glibc's mmap threshold does to a CPU stage's peak memory and time (runtime.cpu_allocator).

    python benchmarks/cpu_allocator.py            # tiny model, stage <1,1,1>/0, float32, 1 thread

For each heap setting (glibc's default moving threshold, and the threshold pinned at 64 KiB,
256 KiB and 1 MiB), a fresh process runs the same micro-batches in the same order. Per shape it
meters `--steps` forward+backward steps with the profiler's own meter (`ProcessPeakMeter`: the
process's resident high-water mark above its size before the step, gradients allocated) and times
`--steps` more (thread CPU time). The processes alternate setting by setting, `--rounds` times, so
that the settings share the machine's load; the table gives medians over the rounds of:

- spread: (largest - smallest) / median of one shape's metered steps in one process, in percent:
  how far one step's peak can be from the next one's on the same shape;
- peak: the median metered step, MiB;
- time: the median timed step, ms of thread CPU, and its ratio to the default heap's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.report import RESULTS_PATH, command_line, markdown_table, write_result  # noqa: E402

SETTINGS = {"default": None, "pinned 64 KiB": 64 * 1024, "pinned 256 KiB": 256 * 1024, "pinned 1 MiB": 2**20}
# (mix, lengths): one long sequence at three lengths, many short ones, a mixture, and the first
# long shape again at the end (after the heap has served larger ones)
SHAPES = (
    ("long", [256]),
    ("long", [768]),
    ("long", [1536]),
    ("short", [32] * 24),
    ("mixed", [400, 200, 100, 50, 18]),
    ("long again", [256]),
)


def measure(threshold: int | None, steps: int, model: str) -> list[dict]:
    """Runs in the child process: the shapes' metered peaks and timed steps under one heap setting."""
    import time

    from hydraplan.runtime import cpu_allocator

    if threshold is not None and not cpu_allocator.pin_mmap_threshold(threshold):
        raise SystemExit("this C library has no mallopt: nothing to compare")
    import torch

    from hydraplan.runtime import profiler
    from hydraplan.runtime.model import ModelConfig, PackedBatch

    if threshold is None:  # the runner pins the heap on CPU; here the default must stay
        profiler.pin_mmap_threshold = lambda *args: False
    torch.set_num_threads(1)
    cfg = ModelConfig.from_catalog(model)
    runner = profiler.StageRunner(cfg, 1, 0, profiler.MeasureOptions())
    rows = []
    for mix, lengths in SHAPES:
        batch = PackedBatch.from_lengths(lengths, cfg.vocab_size, 0, torch.device("cpu"))
        hidden, grad = runner.inputs(batch)
        runner.step(batch, hidden, grad, [])  # warm-up
        peaks, times = [], []
        for _ in range(steps):
            runner._allocate_grads()
            with profiler.ProcessPeakMeter() as meter:
                runner.step(batch, hidden, grad, [])
            peaks.append(meter.bytes)
        for _ in range(steps):
            started = time.thread_time()
            runner.step(batch, hidden, grad, [])
            times.append(time.thread_time() - started)
        rows.append({"mix": mix, "tokens": sum(lengths), "peaks": peaks, "times": times})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=6, help="metered and timed steps per shape")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per setting, alternating")
    parser.add_argument("--results", type=Path, default=RESULTS_PATH)
    parser.add_argument("--no-write", action="store_true", help="print only; write no results")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # threshold in the child; 0: default
    args = parser.parse_args(argv)
    if args.steps < 2 or args.rounds < 1:
        parser.error("--steps must be >= 2 and --rounds >= 1")
    if args.child is not None:
        print(json.dumps(measure(args.child or None, args.steps, args.model)))
        return 0
    runs: dict[str, list[list[dict]]] = {name: [] for name in SETTINGS}
    for round_index in range(args.rounds):
        for name, threshold in SETTINGS.items():
            print(f"round {round_index + 1}/{args.rounds}: {name}", file=sys.stderr)
            child = [sys.executable, __file__, "--child", str(threshold or 0)]
            child += ["--steps", str(args.steps), "--model", args.model]
            done = subprocess.run(child, capture_output=True, text=True, check=True)
            runs[name].append(json.loads(done.stdout.splitlines()[-1]))
    rows = []
    for index, (mix, lengths) in enumerate(SHAPES):
        default_ms = None
        for name in SETTINGS:
            shape_runs = [run[index] for run in runs[name]]
            spreads = [(max(r["peaks"]) - min(r["peaks"])) / statistics.median(r["peaks"]) * 100 for r in shape_runs]
            peak = statistics.median(statistics.median(r["peaks"]) for r in shape_runs) / 2**20
            ms = statistics.median(statistics.median(r["times"]) for r in shape_runs) * 1e3
            default_ms = ms if default_ms is None else default_ms
            rows.append(
                [
                    mix,
                    f"{sum(lengths):,}",
                    name,
                    f"{statistics.median(spreads):.1f}",
                    f"{max(spreads):.1f}",
                    f"{peak:.1f}",
                    f"{ms:.0f}",
                    f"{ms / default_ms:.2f}x",
                ]
            )
    headers = ["shape", "tokens", "heap", "spread % (median)", "spread % (worst)", "peak MiB", "time ms", "vs default"]
    table = markdown_table(headers, rows)
    print(table)
    body = (
        f"Model `{args.model}`, stage <1,1,1>/0, float32, 1 intra-op thread; {args.steps} metered and "
        f"{args.steps} timed steps per shape in each process, {args.rounds} rounds of fresh processes, the "
        "settings alternating; medians over the rounds (spread: also the worst round). Shapes in this order: "
        + ", ".join(f"{mix} {sum(lengths):,}" for mix, lengths in SHAPES)
        + ".\n\n"
        + table
        + "\n"
    )
    if not args.no_write:
        write_result("cpu_allocator", command_line(), body, table, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
