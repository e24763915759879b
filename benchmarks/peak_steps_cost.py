"""What the memory promise costs in profiling time (issue 31 item 4, held-out sets 5 and 6).

    python benchmarks/peak_steps_cost.py [--repeats 3] [--no-write]

Thread CPU seconds of measuring one stage's default profile (`hydraplan profile`'s micro-batches)
on the tiny model, CPU, 1 intra-op thread, in three configurations: as of held-out set 4 (2
metered steps per micro-batch, the 16-micro-batch grid), with 4 metered steps (set 5), and with 4
steps plus the grid's one long sequence of twice the largest token count (set 6, the default now).
Each micro-batch also runs `repeats` timed steps and, for the runner's first one, an unmeasured
step; those are the same in every configuration.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.report import RESULTS_PATH, command_line, markdown_table, write_result  # noqa: E402
from hydraplan.runtime import profiler  # noqa: E402
from hydraplan.runtime.model import ModelConfig  # noqa: E402
from hydraplan.runtime.profiler import FIT_MIXES, MeasureOptions, measure_stage, profile_batches  # noqa: E402

STAGES = ((1, 0), (2, 0))
CONFIGURATIONS = (  # (label, metered steps, long_factor)
    ("set 4: 2 steps, grid", 2, 0),
    ("set 5: 4 steps, grid", 4, 0),
    ("set 6 (default): 4 steps, grid + 1 long", 4, 2),
)


def stage_cpu_s(cfg: ModelConfig, pp: int, stage: int, options: MeasureOptions, steps: int) -> tuple[float, int]:
    """Thread CPU seconds and micro-batches of measuring one stage's profile with `steps` metered steps."""
    kept = profiler.PEAK_STEPS
    profiler.PEAK_STEPS = steps
    try:
        started = time.thread_time()
        count = sum(1 for _ in measure_stage(cfg, pp, stage, profile_batches(options), options))
        return time.thread_time() - started, count
    finally:
        profiler.PEAK_STEPS = kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results", type=Path, default=RESULTS_PATH)
    parser.add_argument("--no-write", action="store_true", help="print only; write no results")
    args = parser.parse_args(argv)
    cfg = ModelConfig.from_catalog("tiny")
    rows, baseline = [], {}
    for pp, stage in STAGES:
        for label, steps, long_factor in CONFIGURATIONS:
            options = MeasureOptions(repeats=args.repeats, mixes=FIT_MIXES, long_factor=long_factor)
            seconds, count = stage_cpu_s(cfg, pp, stage, options, steps)
            baseline.setdefault((pp, stage), seconds)
            ratio = seconds / baseline[(pp, stage)]
            rows.append([f"<1,{pp},1> stage {stage}", label, str(count), f"{seconds:.1f}", f"{ratio:.2f}x"])
            print(f"  <1,{pp},1>/{stage} {label}: {seconds:.1f} s", file=sys.stderr)
    table = markdown_table(["stage", "configuration", "micro-batches", "thread CPU s", "vs set 4"], rows)
    print(table)
    body = (
        f"torch {torch.__version__}, model `tiny` in float32, 1 intra-op thread, {args.repeats} timed repeats "
        "per micro-batch; thread CPU seconds of measuring one stage's profile (one run each, so a few "
        "percent of noise).\n\n" + table + "\n"
    )
    if not args.no_write:
        write_result("memory_peak-cost", command_line(), body, table, args.results, file="memory_peak")
    return 0


if __name__ == "__main__":
    sys.exit(main())
