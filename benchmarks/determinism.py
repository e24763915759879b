"""Determinism at the defaults: the same request, twice, in fresh processes, with the CPU busy.

    python benchmarks/determinism.py [--settings 8b-64xh100,32b-64xa100] [--seeds 3] [--burners 1]
                                     [--quick]
    python benchmarks/determinism.py --settings 70b-256xh100 --seeds 2 --burners 3 --side-by-side 3

For each setting and seed, the Wikipedia batch of `benchmarks/quality.py` is planned with every
solver option at its default (`auto`, the setting's budget: 2 s, 10 s at 1,024 GPUs) in two fresh
Python processes (different hash seeds) while `--burners` CPU-bound processes compete for the cores.
Reported: whether the two plan files are byte-identical, whether the clock cut either search
(`solver.cut_by_clock`: then the plan says `timeout_incumbent`, whatever its gap, and nothing is
promised), and the wall time of each solve. Determinism is promised exactly where
the clock did not cut.

`--side-by-side N` asks instead whether a loaded machine still gets the uncut plan: each batch is
first planned with the clock standing still (`benchmarks.quality.clock_standing_still`, before the
burners start: the uncut plan), then N times with the search as it is ("after") and N times as it
searched before probes ("before": `benchmarks.search_profile.VARIANTS`, probes and so polishes
ahead off; the cheaper kernels are in both), alternating, each
in a fresh process under the burners. Reported per variant: the runs that reached the uncut step
time (or better), cut by the clock, and the median wall and CPU seconds of the solve.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SETTINGS, batch_lengths, profile_for, split_names
from benchmarks.report import command_line, markdown_table, write_result

DEFAULT_SETTINGS = ("8b-64xh100", "32b-64xa100")
DATASET = "wikipedia"


@dataclass(frozen=True)
class Pair:
    setting: str
    seed: int
    identical: bool
    cut: tuple[bool, bool]
    wall_s: tuple[float, float]
    status: str


def default_request(setting_name: str, seed: int):
    """(request, profile) of one batch of a setting at the defaults, its solver backend loaded."""
    from hydraplan.planner.schemas import PlanRequest, SolverOptions
    from hydraplan.planner.solve import load_backend

    setting = SETTINGS[setting_name]
    lengths = batch_lengths(DATASET, setting.num_tokens, seed, setting.context_cap)
    profile = profile_for(setting.model, setting.gpu, setting.num_gpus)
    options = SolverOptions(time_limit_s=setting.time_limit_s, seed=seed, oversize="split")
    request = PlanRequest(lengths=lengths, num_gpus=setting.num_gpus, gpus_per_node=8, options=options)
    load_backend(options.solver)
    return request, profile


def solve_once(setting_name: str, seed: int, out: Path) -> float:
    """Worker: plan one batch at the defaults, write the plan's JSON; returns the solve's wall time."""
    from hydraplan.planner.solve import solve

    request, profile = default_request(setting_name, seed)
    started = time.perf_counter()
    plan = solve(request, profile)
    wall_s = time.perf_counter() - started
    out.write_text(plan.model_dump_json(indent=2) + "\n")
    return wall_s


def solve_variant(setting_name: str, seed: int, variant_name: str, clockless: bool) -> dict:
    """Worker: plan one batch at the defaults with the search of `variant_name`, the clock
    standing still if `clockless`; returns step time, cut, strategy, wall and CPU seconds."""
    from benchmarks.quality import clock_standing_still
    from benchmarks.search_profile import variant
    from hydraplan.planner.solve import solve

    request, profile = default_request(setting_name, seed)
    with variant(variant_name), clock_standing_still(clockless):
        started, cpu = time.perf_counter(), time.process_time()
        plan = solve(request, profile)
        wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    return {
        "step_s": plan.step_time_s,
        "cut": plan.solver.cut_by_clock,
        "strategy": str(plan.strategy),
        "wall_s": wall_s,
        "cpu_s": cpu_s,
    }


def run_variant(setting: str, seed: int, variant_name: str, clockless: bool = False) -> dict:
    worker = [sys.executable, str(Path(__file__).resolve()), "--variant-worker", setting, str(seed), variant_name]
    if clockless:
        worker.append("clockless")
    done = subprocess.run(worker, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def side_by_side(names: list[str], seeds: int, burners: int, rounds: int) -> tuple[str, str]:
    """(table, body): per batch and variant, how many of `rounds` loaded runs reached the uncut plan."""
    from benchmarks.search_profile import VARIANTS

    uncut = {(name, seed): run_variant(name, seed, "after", clockless=True) for name in names for seed in range(seeds)}
    processes = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burners)]
    runs: dict[tuple[str, int, str], list[dict]] = {}
    try:
        for name in names:
            for seed in range(seeds):
                for _ in range(rounds):
                    for variant_name in VARIANTS:
                        result = run_variant(name, seed, variant_name)
                        runs.setdefault((name, seed, variant_name), []).append(result)
                        print(f"{name} seed {seed} {variant_name}: {result}", file=sys.stderr)
    finally:
        for process in processes:
            process.kill()
            process.wait()
    rows = []
    for (name, seed), reference in uncut.items():
        for variant_name in VARIANTS:
            results = runs[(name, seed, variant_name)]
            reached = sum(r["step_s"] <= reference["step_s"] * (1 + 1e-9) for r in results)
            rows.append(
                [
                    name,
                    str(seed),
                    variant_name,
                    f"{reference['step_s']:.3f}",
                    f"{reached} of {len(results)}",
                    ", ".join(f"{r['step_s']:.3f}" for r in results),
                    f"{sum(r['cut'] for r in results)} of {len(results)}",
                    f"{statistics.median(r['wall_s'] for r in results):.2f}",
                    f"{statistics.median(r['cpu_s'] for r in results):.2f}",
                    f"{reference['cpu_s']:.2f}",
                ]
            )
    headers = [
        "setting",
        "seed",
        "search",
        "uncut step s",
        "reached the uncut plan",
        "step s of each run",
        "cut by clock",
        "wall s (median)",
        "CPU s (median)",
        "CPU s uncut, quiet",
    ]
    table = markdown_table(headers, rows)
    body = "\n".join(
        [
            f"Wikipedia batches, every option at its default, each solved {rounds} times per variant (alternating, "
            f"fresh processes) while {burners} CPU-bound process(es) compete for the cores. before: "
            "the search's order before probes (`benchmarks.search_profile.VARIANTS`: probes and polishes ahead "
            "off; this session's cheaper kernels in both); after: as it is. "
            "The uncut plan: the same request with the clock standing still, before the burners started.",
            "",
            table,
        ]
    )
    return table, body


def run_pair(setting: str, seed: int, workdir: Path) -> Pair:
    walls, texts = [], []
    for run in range(2):
        out = workdir / f"{setting}-{seed}-{run}.json"
        env = {**os.environ, "PYTHONHASHSEED": str(run + 1)}
        worker = [sys.executable, str(Path(__file__).resolve()), "--worker", setting, str(seed), str(out)]
        done = subprocess.run(worker, check=True, capture_output=True, text=True, env=env)
        walls.append(float(done.stdout.strip().splitlines()[-1]))
        texts.append(out.read_bytes())
    plans = [json.loads(text) for text in texts]
    return Pair(
        setting=setting,
        seed=seed,
        identical=texts[0] == texts[1],
        cut=(plans[0]["solver"]["cut_by_clock"], plans[1]["solver"]["cut_by_clock"]),
        wall_s=(walls[0], walls[1]),
        status=plans[0]["status"],
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default=",".join(DEFAULT_SETTINGS), help="comma-separated settings")
    parser.add_argument("--seeds", type=int, default=3, help="batches per setting (default: %(default)s)")
    parser.add_argument("--burners", type=int, default=1, help="competing CPU-bound processes (default: 1)")
    parser.add_argument("--quick", action="store_true", help="one seed of the first setting, written nowhere")
    parser.add_argument("--section", default="determinism", help="results section and file name (default: %(default)s)")
    parser.add_argument(
        "--side-by-side", type=int, default=0, metavar="N", help="N loaded runs per variant, before / after"
    )
    parser.add_argument("--worker", nargs=3, metavar=("SETTING", "SEED", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--variant-worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(solve_once(args.worker[0], int(args.worker[1]), Path(args.worker[2])))
        return 0
    if args.variant_worker:
        name, seed, variant_name, *clockless = args.variant_worker
        print(json.dumps(solve_variant(name, int(seed), variant_name, bool(clockless))))
        return 0
    names = split_names(args.settings.split(","), SETTINGS, "setting") or list(DEFAULT_SETTINGS)
    if args.quick:
        names, args.seeds = names[:1], 1
    if args.side_by_side:
        table, body = side_by_side(names, args.seeds, args.burners, args.side_by_side)
        print(body)
        if not args.quick:
            write_result(args.section, command_line(), body, table)
        return 0
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"hydraplan-determinism-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)]
    try:
        pairs = []
        for name in names:
            for seed in range(args.seeds):
                pair = run_pair(name, seed, workdir)
                pairs.append(pair)
                print(f"{name} seed {seed}: identical {pair.identical}, cut {pair.cut}", file=sys.stderr)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    rows = [
        [
            p.setting,
            str(p.seed),
            "yes" if p.identical else "NO",
            "/".join("cut" if c else "-" for c in p.cut),
            p.status,
            " / ".join(f"{w:.2f}" for w in p.wall_s),
        ]
        for p in pairs
    ]
    uncut = [p for p in pairs if not any(p.cut)]
    summary = (
        f"{sum(p.identical for p in uncut)} of {len(uncut)} pairs the clock did not cut are byte-identical; "
        f"{len(pairs) - len(uncut)} of {len(pairs)} pairs had a search cut by the clock "
        f"({sum(p.identical for p in pairs if any(p.cut))} of those identical anyway)."
    )
    table = markdown_table(["setting", "seed", "byte-identical", "cut by clock", "status", "solve wall s"], rows)
    body = "\n".join(
        [
            f"Wikipedia batches of `benchmarks/quality.py`, every option at its default, each solved in two fresh "
            f"processes (hash seeds 1 and 2) while {args.burners} CPU-bound process(es) compete for the cores. "
            "`cut` is `solver.cut_by_clock` of each run: the time limit, not the work limits, ended part of "
            "that search, and no determinism is promised.",
            "",
            table,
            "",
            summary,
        ]
    )
    print(body)
    if not args.quick:
        write_result(args.section, command_line(), body, f"{table}\n\n{summary}")
    return 0 if all(p.identical for p in uncut) else 1


if __name__ == "__main__":
    sys.exit(main())
