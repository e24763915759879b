"""Determinism at the defaults: the same request, twice, in fresh processes, with the CPU busy.

    python benchmarks/determinism.py [--settings 8b-64xh100,32b-64xa100] [--seeds 3] [--burners 1]
                                     [--quick]

For each setting and seed, the Wikipedia batch of `benchmarks/quality.py` is planned with every
solver option at its default (`auto`, the setting's budget: 2 s, 10 s at 1,024 GPUs) in two fresh
Python processes (different hash seeds) while `--burners` CPU-bound processes compete for the cores.
Reported: whether the two plan files are byte-identical, whether the clock cut either search
(`solver.cut_by_clock`: then the plan says `timeout_incumbent`, whatever its gap, and nothing is
promised), and the wall time of each solve. Determinism is promised exactly where
the clock did not cut.
"""

from __future__ import annotations

import argparse
import json
import os
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


def solve_once(setting_name: str, seed: int, out: Path) -> float:
    """Worker: plan one batch at the defaults, write the plan's JSON; returns the solve's wall time."""
    from hydraplan.planner.schemas import PlanRequest, SolverOptions
    from hydraplan.planner.solve import load_backend, solve

    setting = SETTINGS[setting_name]
    lengths = batch_lengths(DATASET, setting.num_tokens, seed, setting.context_cap)
    profile = profile_for(setting.model, setting.gpu, setting.num_gpus)
    options = SolverOptions(time_limit_s=setting.time_limit_s, seed=seed, oversize="split")
    request = PlanRequest(lengths=lengths, num_gpus=setting.num_gpus, gpus_per_node=8, options=options)
    load_backend(options.solver)
    started = time.perf_counter()
    plan = solve(request, profile)
    wall_s = time.perf_counter() - started
    out.write_text(plan.model_dump_json(indent=2) + "\n")
    return wall_s


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
    parser.add_argument("--worker", nargs=3, metavar=("SETTING", "SEED", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(solve_once(args.worker[0], int(args.worker[1]), Path(args.worker[2])))
        return 0
    names = split_names(args.settings.split(","), SETTINGS, "setting") or list(DEFAULT_SETTINGS)
    if args.quick:
        names, args.seeds = names[:1], 1
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
