"""Planning with worker processes beside the search: wall time with 1, 2, ... processes.

    python benchmarks/workers.py                         # 8B / 64, 70B / 256, 8B / 1,024 H100
    python benchmarks/workers.py --repeats 5 --settings 70b-256xh100 --workers 1 2 3

For each setting's seed-0 batch, `planner.solve.solve` runs with each process count in turn, side
by side, `--repeats` times each: 1 is the search alone; N > 1 adds a fork pool of N - 1 workers
(created before the timing, as `hydraplan plan --workers N` does), which make the baselines' own
plans (`planner.portfolio`) and, from two workers on, compute the search's next solves,
expansions and polishes ahead of it (`planner.speculation`). The clock stands still
(`benchmarks.quality.clock_standing_still`): every run makes the plan an uncut run makes, and the
table checks that they are the same plan.
Reported: median wall time of each count, the speed-up over one process, and how many of the
tasks the search asked for (solves, expansions, polishes) a worker had computed.

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
from hydraplan.planner.speculation import SpeculativeSolver  # noqa: E402

DEFAULT_SETTINGS = ("8b-64xh100", "70b-256xh100", "8b-1024xh100")


def measure(name: str, repeats: int, pools: dict[int, ProcessPoolExecutor | None]) -> list[str]:
    setting = SETTINGS[name]
    lengths = batch_lengths(setting.datasets[0], setting.num_tokens, 0, setting.context_cap)
    profile = profile_for(setting.model, setting.gpu, setting.num_gpus)
    request = make_request(lengths, setting.num_gpus, "auto", setting.time_limit_s, 0)
    walls: dict[int, list[float]] = {count: [] for count in pools}
    plans: dict[int, str] = {}
    taken: dict[int, list[tuple[int, int]]] = {count: [] for count in pools}
    close = SpeculativeSolver.close
    with clock_standing_still(True):
        for count, pool in pools.items():  # caches here and in the workers
            solve(request, profile, executor=pool, executor_workers=count - 1)
        for _ in range(repeats):
            for count, pool in pools.items():

                def counted(solver, count=count):
                    taken[count].append((solver.hits, solver.local))
                    close(solver)

                SpeculativeSolver.close = counted
                try:
                    started = time.perf_counter()
                    plans[count] = solve(request, profile, executor=pool, executor_workers=count - 1).model_dump_json()
                    walls[count].append(time.perf_counter() - started)
                finally:
                    SpeculativeSolver.close = close
    same = len(set(plans.values())) == 1
    one = median(walls[1]) if 1 in walls else None
    row = [name]
    for count in pools:
        wall = median(walls[count])
        row.append(f"{wall:.2f}" + ("" if one is None or count == 1 else f" ({one / wall:.2f}x)"))
    for count in pools:
        if count > 1:
            hits = sum(h for h, _ in taken[count])
            row.append(f"{hits}/{hits + sum(n for _, n in taken[count])}")
    return [*row, "yes" if same else "NO"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS), choices=sorted(SETTINGS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="process counts to compare")
    parser.add_argument("--results", type=Path, default=RESULTS_PATH)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    counts = sorted(set(args.workers))
    context = multiprocessing.get_context("fork")
    pools = {
        count: ProcessPoolExecutor(max_workers=count - 1, mp_context=context) if count > 1 else None for count in counts
    }
    rows = []
    try:
        for name in args.settings:
            rows.append(measure(name, args.repeats, pools))
            print(" | ".join(rows[-1]), file=sys.stderr)
    finally:
        for pool in pools.values():
            if pool is not None:
                pool.shutdown()
    headers = ["setting", *(f"{count} process{'es' if count > 1 else ''} s (median)" for count in counts)]
    headers += [f"tasks from workers, {count} processes" for count in counts if count > 1]
    headers.append("same plan")
    table = markdown_table(headers, rows)
    print(table)
    if not args.no_write:
        body = f"{args.repeats} repeats of each count, side by side; the clock standing still.\n\n{table}"
        write_result("workers", command_line(), body, table, path=args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
