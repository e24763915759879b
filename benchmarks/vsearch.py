"""The search's choice of the chunk count v (issue 32, item 4): plan quality and search cost with
interleaved schemes offered against plain 1F1B only.

    python benchmarks/vsearch.py                      # 8B / 64 H100 and 70B / 256 H100, 3 batches
    python benchmarks/vsearch.py --batches 1 --real-clock-batches 0 --chunks 2 --no-write

For each setting of `benchmarks/quality.py` named, batches seeded 0..N-1 (as there) are planned by
`planner.solve.solve` (solver `auto`, the setting's budget, oversize `split`) twice: over the
analytic profile of plain schemes, and over the same profile with the interleaved entries
`<tp,pp,cp,v>` for each v of `--chunks` (`cost_models.analytic.build_profile(virtual_stages=...)`:
only where v divides the layers per stage and the schedule fits in memory). The planner's clock
stands still (`quality.clock_standing_still`): the work limits alone end each search, so the plans
are the ones an uncut run gives and the CPU time is the work the search does. Per batch the table
gives the objective and lower bound of both, the change, the interleaved pipelines of the plan and
the CPU seconds of each solve. The first `--real-clock-batches` batches are planned again under the
budget on the wall clock (what a user gets on this machine at its load).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.common import GPUS_PER_NODE, SETTINGS, batch_lengths, fmt, make_request, progress  # noqa: E402
from benchmarks.quality import clock_standing_still  # noqa: E402
from benchmarks.report import command_line, markdown_table, write_result  # noqa: E402
from hydraplan.cost_models.analytic import build_profile  # noqa: E402
from hydraplan.cost_models.catalog import get_gpu, get_model  # noqa: E402
from hydraplan.planner.solve import solve  # noqa: E402

DEFAULT_SETTINGS = ("8b-64xh100", "70b-256xh100")
DEFAULT_CHUNKS = (2, 4)
DATASET = "wikipedia"


def plan_once(profile, lengths: list[int], setting, seed: int, real_clock: bool = False):
    request = make_request(lengths, setting.num_gpus, "auto", setting.time_limit_s, seed)
    started = time.process_time()
    with clock_standing_still(not real_clock):
        plan = solve(request, profile)
    return plan, time.process_time() - started


def interleaved_pipelines(plan) -> str:
    counts: dict[str, int] = {}
    for pipeline in plan.pipelines:
        if pipeline.scheme.v > 1:
            text = f"<{pipeline.scheme.tp},{pipeline.scheme.pp},{pipeline.scheme.cp},{pipeline.scheme.v}>"
            counts[text] = counts.get(text, 0) + 1
    return " + ".join(f"{count}x{text}" for text, count in sorted(counts.items())) or "none"


HEADERS = [
    "setting",
    "seed",
    "schemes (plain)",
    "schemes (with v)",
    "objective plain (s)",
    "objective with v (s)",
    "change",
    "bound plain (s)",
    "bound with v (s)",
    "interleaved pipelines",
    "CPU plain (s)",
    "CPU with v (s)",
]


def compare(settings: list[str], batches: int, chunks: list[int], real_clock: bool) -> str:
    """The table of both plans per batch (see the module docstring)."""
    rows = []
    for name in settings:
        setting = SETTINGS[name]
        model, gpu = get_model(setting.model), get_gpu(setting.gpu)
        plain = build_profile(model, gpu, setting.num_gpus, GPUS_PER_NODE)
        chunked = build_profile(model, gpu, setting.num_gpus, GPUS_PER_NODE, virtual_stages=tuple(chunks))
        offered = sum(1 for entry in chunked.schemes if entry.v > 1)
        for seed in range(batches):
            lengths = batch_lengths(DATASET, setting.num_tokens, seed, setting.context_cap)
            progress(f"{name} seed {seed}: {len(lengths)} sequences, {offered} interleaved entries")
            base, base_cpu = plan_once(plain, lengths, setting, seed, real_clock)
            with_v, v_cpu = plan_once(chunked, lengths, setting, seed, real_clock)
            change = with_v.objective_s / base.objective_s - 1
            rows.append(
                [
                    name,
                    seed,
                    len(plain.schemes),
                    len(chunked.schemes),
                    fmt(base.objective_s, 3),
                    fmt(with_v.objective_s, 3),
                    f"{100 * change:+.2f}%",
                    fmt(base.lower_bound_s, 3),
                    fmt(with_v.lower_bound_s, 3),
                    interleaved_pipelines(with_v),
                    fmt(base_cpu, 2),
                    fmt(v_cpu, 2),
                ]
            )
    return markdown_table(HEADERS, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS), choices=sorted(SETTINGS))
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--real-clock-batches", type=int, default=2, help="batches also planned on the wall clock")
    parser.add_argument("--chunks", type=int, nargs="+", default=list(DEFAULT_CHUNKS))
    parser.add_argument("--no-write", action="store_true", help="print the tables only")
    args = parser.parse_args(argv)
    table = compare(args.settings, args.batches, args.chunks, real_clock=False)
    print(table)
    body = (
        f"Dataset {DATASET}; v offered: {', '.join(map(str, args.chunks))} (where it divides the layers per "
        "stage and fits in memory).\n\nClock standing still (the work limits end each search):\n\n" + table
    )
    if args.real_clock_batches:
        clocked = compare(args.settings, args.real_clock_batches, args.chunks, real_clock=True)
        print(clocked)
        body += f"\n\nOn the wall clock (the setting's budget, at this machine's load):\n\n{clocked}"
    if not args.no_write:
        write_result("vsearch", command_line(), body, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
