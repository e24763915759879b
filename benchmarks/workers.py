"""Planning with a worker process beside the search: wall time alone and with one worker.

    python benchmarks/workers.py                         # 8B / 64, 70B / 256, 8B / 1,024 H100
    python benchmarks/workers.py --repeats 5 --settings 70b-256xh100

For each setting's seed-0 batch, `planner.solve.solve` runs alternately without an executor and
with a one-process fork pool (created before the timing, as `hydraplan plan --workers 2` does),
`--repeats` times each, side by side so both see the same machine. The clock stands still
(`benchmarks.quality.clock_standing_still`): both make the plan an uncut run makes, and the
table checks that they are the same plan. Reported: median wall time of each and their ratio.
What a worker can take over today is the baselines' plans (`planner.portfolio`); the expected
speed-up is therefore at most 1 / (1 - their share of the solve), on a machine with a core free
for the worker.

The results go to the `workers` section of benchmarks/RESULTS.md (`--results` for another file).
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.common import SETTINGS, batch_lengths, make_request, median, profile_for  # noqa: E402
from benchmarks.quality import clock_standing_still  # noqa: E402
from benchmarks.report import RESULTS_PATH, command_line, markdown_table, write_result  # noqa: E402
from hydraplan.planner.solve import solve  # noqa: E402

DEFAULT_SETTINGS = ("8b-64xh100", "70b-256xh100", "8b-1024xh100")


def measure(name: str, repeats: int, executor: ProcessPoolExecutor) -> list[str]:
    setting = SETTINGS[name]
    lengths = batch_lengths(setting.datasets[0], setting.num_tokens, 0, setting.context_cap)
    profile = profile_for(setting.model, setting.gpu, setting.num_gpus)
    request = make_request(lengths, setting.num_gpus, "auto", setting.time_limit_s, 0)
    walls: dict[str, list[float]] = {"alone": [], "worker": []}
    plans = {}
    with clock_standing_still(True):
        solve(request, profile, executor=executor)  # caches here and in the worker
        for _ in range(repeats):
            for mode in walls:
                started = time.perf_counter()
                plans[mode] = solve(request, profile, executor=executor if mode == "worker" else None)
                walls[mode].append(time.perf_counter() - started)
    same = plans["alone"].model_dump_json() == plans["worker"].model_dump_json()
    alone, helped = median(walls["alone"]), median(walls["worker"])
    return [name, f"{alone:.2f}", f"{helped:.2f}", f"{alone / helped:.2f}x", "yes" if same else "NO"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS), choices=sorted(SETTINGS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results", type=Path, default=RESULTS_PATH)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork")) as executor:
        for name in args.settings:
            rows.append(measure(name, args.repeats, executor))
            print(" | ".join(rows[-1]), file=sys.stderr)
    headers = ["setting", "alone s (median)", "with a worker s (median)", "speed-up", "same plan"]
    table = markdown_table(headers, rows)
    print(table)
    if not args.no_write:
        body = f"{args.repeats} repeats of each, alternating; the clock standing still.\n\n{table}"
        write_result("workers", command_line(), body, table, path=args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
