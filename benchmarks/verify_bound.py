"""The bound certificate and its verifier on the benchmark settings: certificate bytes, the
verifier's CPU time, and whether the verified bound reaches the claimed one.

For each setting and dataset, plan one seeded batch (the planner's default solver and the setting's
budget), then verify `lower_bound_s` from the plan's certificate (`planner.verify_bound`) against the
profile it was made with. Prints a table and writes benchmarks/results/verify-bound.md.

    python benchmarks/verify_bound.py [--settings 8b-64xh100,...] [--seeds 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    SETTINGS,
    batch_lengths,
    make_request,
    profile_for,
    progress,
    split_names,
)
from hydraplan.planner.solve import solve  # noqa: E402
from hydraplan.planner.verify_bound import verify_bound  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "verify-bound.md"
COLUMNS = (
    "setting",
    "dataset",
    "seed",
    "sequences",
    "claimed ms",
    "verified ms",
    "ok",
    "sets",
    "expanded",
    "strategies",
    "certificate KB",
    "plan KB",
    "verify CPU s",
)


def measure(setting_name: str, dataset: str, seed: int) -> dict:
    setting = SETTINGS[setting_name]
    profile = profile_for(setting.model, setting.gpu, setting.num_gpus)
    lengths = batch_lengths(dataset, setting.num_tokens, seed, setting.context_cap)
    request = make_request(lengths, setting.num_gpus, "auto", setting.time_limit_s, seed)
    plan = solve(request, profile)
    certificate = plan.bound_certificate
    started = time.process_time()
    verification = verify_bound(plan, profile, request)
    cpu_s = time.process_time() - started
    return {
        "setting": setting_name,
        "dataset": dataset,
        "seed": seed,
        "sequences": len(lengths),
        "claimed ms": f"{plan.lower_bound_s * 1e3:.2f}",
        "verified ms": f"{verification.verified_bound_s * 1e3:.2f}",
        "ok": "yes" if verification.ok else f"no ({verification.verified_bound_s / plan.lower_bound_s:.4f}x)",
        "sets": verification.num_sets,
        "expanded": verification.num_expanded_sets,
        "strategies": verification.num_strategies,
        "certificate KB": f"{len(certificate.model_dump_json()) / 1024:.1f}" if certificate else "-",
        "plan KB": f"{len(plan.model_dump_json()) / 1024:.0f}",
        "verify CPU s": f"{cpu_s:.2f}",
        "first violation": verification.violations[0] if verification.violations else "",
    }


def markdown(rows: list[dict], command: str) -> str:
    lines = [
        "# Bound certificates and their verifier",
        "",
        f"Command: `{command}`",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs (shared with other agents: CPU times, not wall "
        f"times), Python {platform.python_version()}, numpy {np.__version__}.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(str(row[column]) for column in COLUMNS) + " |" for row in rows]
    failing = [row for row in rows if row["first violation"]]
    if failing:
        lines += ["", "First violation of each plan whose bound did not verify:", ""]
        lines += [
            f"- {row['setting']} {row['dataset']} seed {row['seed']}: {row['first violation']}" for row in failing
        ]
    verified = sum(1 for row in rows if not row["first violation"])
    lines += ["", f"Verified: {verified} of {len(rows)} plans.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", help="comma-separated setting names (default: all)")
    parser.add_argument("--datasets", help="comma-separated datasets (default: each setting's)")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    names = split_names(args.settings.split(",") if args.settings else None, SETTINGS, "setting") or list(SETTINGS)
    rows = []
    for name in names:
        datasets = args.datasets.split(",") if args.datasets else SETTINGS[name].datasets
        for dataset in datasets:
            for seed in range(args.seeds):
                progress(f"{name} {dataset} seed {seed}")
                row = measure(name, dataset, seed)
                rows.append(row)
                print(" | ".join(str(row[column]) for column in COLUMNS), flush=True)
    command = (
        "python benchmarks/verify_bound.py "
        + " ".join(
            f"--{key} {value}" for key, value in (("settings", args.settings), ("datasets", args.datasets)) if value
        )
        + f" --seeds {args.seeds}"
    )
    Path(args.out).write_text(markdown(rows, command))


if __name__ == "__main__":
    main()
