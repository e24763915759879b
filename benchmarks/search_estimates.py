"""How few solves the search needs to reach its uncut plan, by the estimate that orders its solves
(issue 27, item 2: reach the good strategies fast).

    python benchmarks/search_estimates.py                    # 70B / 256, 32B / 64, 8B / 64, 2 batches a dataset
    python benchmarks/search_estimates.py --settings 70b-256xh100 --batches 2 --no-write

A search cut by the clock solves only the strategies at the head of its queue, in the order of
their estimates (`planner.search._bubble_inflation`, `planner.fluid`). This replays that cut without
a clock: for each batch, the planner's clock stands still (`quality.clock_standing_still`) and the
search may solve only k strategies past its first incumbents (`max_strategies_solved`; k = 1, 2, 4),
then polishes as it always does. Each row gives the objective at each k and uncut (k = all), for
the estimate's share of the long-item bubble as shipped (`LONG_ITEM_BUBBLE_SHARE`) and as it was
before (1.0), side by side on the same batches. The numbers are plan objectives, not times: they do
not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.common import SETTINGS, batch_lengths, fmt, make_request, profile_for, progress  # noqa: E402
from benchmarks.quality import clock_standing_still  # noqa: E402
from benchmarks.report import command_line, markdown_table, write_result  # noqa: E402
from hydraplan.planner import search as search_module  # noqa: E402
from hydraplan.planner.solve import solve  # noqa: E402

DEFAULT_SETTINGS = ("70b-256xh100", "32b-64xa100", "8b-64xh100")
SOLVES = (1, 2, 4)
BEFORE_SHARE = 1.0  # the estimate's long-item share before issue 27's session 5


def first_incumbents(request, profile) -> int:
    """How many strategies the search solves before its queue (homogeneous and pinned ones)."""
    counted: list[int] = []
    original = search_module._initial_incumbents

    def counting(*args, **kwargs):
        solved, done = original(*args, **kwargs)
        counted.append(len(done))
        return solved, done

    search_module._initial_incumbents = counting
    try:
        solve(
            request.model_copy(update={"options": request.options.model_copy(update={"max_strategies_solved": 1})}),
            profile,
        )
    finally:
        search_module._initial_incumbents = original
    return counted[0]


def objectives(request, profile, share: float) -> list[float]:
    """The plan's objective after k solves past the first incumbents, for each k of SOLVES, then uncut."""
    shipped = search_module.LONG_ITEM_BUBBLE_SHARE
    search_module.LONG_ITEM_BUBBLE_SHARE = share
    try:
        first = first_incumbents(request, profile)
        values = []
        for solves in (*SOLVES, None):
            options = request.options
            if solves is not None:
                options = options.model_copy(update={"max_strategies_solved": first + solves})
            values.append(solve(request.model_copy(update={"options": options}), profile).objective_s)
        return values
    finally:
        search_module.LONG_ITEM_BUBBLE_SHARE = shipped


def compare(settings: list[str], batches: int) -> tuple[str, str]:
    """(table, summary) of both estimates per batch."""
    shipped = search_module.LONG_ITEM_BUBBLE_SHARE
    headers = ["setting", "dataset", "seed"]
    for share in (BEFORE_SHARE, shipped):
        headers += [f"share {share:g}, k={k}" for k in SOLVES] + [f"share {share:g}, uncut"]
    rows, better, worse, reached = [], 0, 0, {BEFORE_SHARE: 0, shipped: 0}
    count = 0
    with clock_standing_still(True):
        for name in settings:
            setting = SETTINGS[name]
            profile = profile_for(setting.model, setting.gpu, setting.num_gpus)
            for dataset in setting.datasets:
                for seed in range(batches):
                    lengths = batch_lengths(dataset, setting.num_tokens, seed, setting.context_cap)
                    progress(f"{name} {dataset} seed {seed}: {len(lengths)} sequences")
                    request = make_request(lengths, setting.num_gpus, "auto", setting.time_limit_s, seed)
                    before = objectives(request, profile, BEFORE_SHARE)
                    after = objectives(request, profile, shipped)
                    rows.append([name, dataset, seed, *(fmt(v, 4) for v in before), *(fmt(v, 4) for v in after)])
                    count += 1
                    # at two solves (what MIN_SEARCH_SOLVES grants a search the clock cuts)
                    better += after[1] < before[1] - 1e-9
                    worse += after[1] > before[1] + 1e-9
                    for share, values in ((BEFORE_SHARE, before), (shipped, after)):
                        reached[share] += values[1] <= values[-1] + 1e-9
    summary = (
        f"{count} batches. After 2 solves past the first incumbents, share {shipped:g} is better on "
        f"{better} and worse on {worse}; it reaches its own uncut objective (or better) on "
        f"{reached[shipped]} batches, share {BEFORE_SHARE:g} on {reached[BEFORE_SHARE]}."
    )
    return markdown_table(headers, rows), summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS), choices=sorted(SETTINGS))
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    table, summary = compare(args.settings, args.batches)
    print(table)
    print(summary)
    legend = "Objectives in seconds (clock standing still; k: strategies solved past the first incumbents)."
    body = f"{legend}\n\n{table}\n\n{summary}"
    if not args.no_write:
        write_result("search_estimates", command_line(), body, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
