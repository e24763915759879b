"""How long drawing a plan's timeline takes, and how large the drawing is.

    python benchmarks/timeline.py [--repeats 5] [--quick] [--results FILE] [--no-write]

For each setting a plan is made once (analytic model, Wikipedia lengths, 2 s budget), then its
timeline is built and drawn in each format, `--repeats` times: the table gives the median time
(simulation + drawing + writing the file, after one warm-up draw), the file size and the blocks drawn, for the default
grouped drawing and for `--pipelines all`. The full table goes to benchmarks/results/timeline.md,
one row per drawing (a column per format) to the `timeline` section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import median
from benchmarks.report import RESULTS_PATH, command_line, markdown_table, pivot_table, write_result
from hydraplan.api.cli.timeline import write_timeline
from hydraplan.api.datasets import sample_batch
from hydraplan.api.render.timeline import timeline_document
from hydraplan.cost_models.analytic import build_profile
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.planner.schemas import Plan, PlanRequest, SolverOptions
from hydraplan.planner.solve import solve

# (label, model, GPU, GPUs, tokens): the CLI's default, a 70B plan with deep pipelines (pp 2-4 in
# the runs so far; the strategy column says which), and the latency benchmark's 1,024 GPUs.
SETTINGS = [
    ("8B / 64 H100 / 1M", "llama3-8b", "h100-sxm-80gb", 64, 1_000_000),
    ("70B / 128 H100 / 2M", "llama3-70b", "h100-sxm-80gb", 128, 2_000_000),
    ("8B / 1024 H100 / 16M", "llama3-8b", "h100-sxm-80gb", 1024, 16_000_000),
]
QUICK_SETTINGS = [("tiny / 8 H100 / 20K", "tiny", "h100-sxm-80gb", 8, 20_000)]
FORMATS = ("svg", "html", "png")


def make_plan(model: str, gpu: str, num_gpus: int, num_tokens: int, time_limit_s: float) -> Plan:
    profile = build_profile(get_model(model), get_gpu(gpu), num_gpus=num_gpus, gpus_per_node=8)
    lengths = sample_batch("wikipedia", num_tokens, seed=0)
    options = SolverOptions(time_limit_s=time_limit_s, seed=0)
    return solve(PlanRequest(lengths=lengths, num_gpus=num_gpus, gpus_per_node=8, options=options), profile)


def measure(plan: Plan, kind: str, pipelines: str, repeats: int, folder: Path) -> tuple[float, int]:
    """Median seconds to write the timeline file, and its size in bytes."""
    path = folder / f"timeline.{kind}"
    write_timeline(str(path), [("hydraplan", plan)], pipelines, [True])  # warm-up: imports, caches
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        write_timeline(str(path), [("hydraplan", plan)], pipelines, [True])
        times.append(time.perf_counter() - started)
    return median(times), path.stat().st_size


def run(settings: list[tuple], repeats: int, time_limit_s: float) -> list[list[str]]:
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for label, model, gpu, num_gpus, num_tokens in settings:
            plan = make_plan(model, gpu, num_gpus, num_tokens, time_limit_s)
            for pipelines in ("grouped", "all"):
                document = timeline_document([("hydraplan", plan)], pipelines)
                num_blocks = sum(len(group.blocks) for group in document.plans[0].groups)
                for kind in FORMATS:
                    if kind == "png" and pipelines == "all" and len(plan.pipelines) > 64:
                        continue  # a picture of hundreds of rows is not what anyone reads
                    seconds, size = measure(plan, kind, pipelines, repeats, Path(folder))
                    rows.append(
                        [
                            label,
                            plan.strategy,
                            str(len(plan.pipelines)),
                            pipelines,
                            kind,
                            str(num_blocks),
                            f"{seconds * 1e3:.0f}",
                            f"{size / 1024:.0f}",
                        ]
                    )
                    print(" | ".join(rows[-1]), flush=True)
    return rows


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="draws per format (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="one tiny plan (smoke test)")
    parser.add_argument(
        "--results", type=Path, default=RESULTS_PATH, help="summary file; the full output goes to results/ beside it"
    )
    parser.add_argument("--no-write", action="store_true", help="print only; write no results")
    args = parser.parse_args(argv)
    settings = QUICK_SETTINGS if args.quick else SETTINGS
    rows = run(settings, args.repeats, 0.3 if args.quick else 2.0)
    headers = ["setting", "strategy", "pipelines", "drawn", "format", "blocks", "median ms", "KiB"]
    table = markdown_table(headers, rows)
    print(table)
    if not args.no_write:
        body = (
            f"Median of {args.repeats} draws of one plan's timeline (build the `hydraplan.timeline/1` "
            "document from the planner's 1F1B simulation, draw, write the file); `grouped` draws identical "
            "schedules once and the slowest 8 groups with a histogram of the rest, `all` every pipeline. "
            f"PNG through matplotlib {_version('matplotlib')}'s Agg backend.\n\n" + table
        )
        keys = ["setting", "strategy", "pipelines", "drawn", "blocks"]
        summary = pivot_table(headers, rows, keys, across="format", value="median ms")
        write_result("timeline", command_line(), body, summary, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
