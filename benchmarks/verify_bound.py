"""The bound certificate and its verifier on the benchmark settings: certificate bytes, the
verifier's CPU time, and whether the verified bound reaches the claimed one.

For each setting and dataset, plan one seeded batch (the planner's default solver and the setting's
budget), then verify `lower_bound_s` from the plan's certificate (`planner.verify_bound`) against the
profile it was made with. Prints a table and writes its section of benchmarks/RESULTS.md and
benchmarks/results/verify_bound.md.

    python benchmarks/verify_bound.py [--settings 8b-64xh100,...] [--seeds 2]

With `--interleaved` the profiles also price each model's recipe interleaved scheme at every depth
(as `benchmarks/quality.py` does with its default baselines), so the plans and bounds rest on the
interleaved floors too; `--time-limit-s` and `--clockless` then reproduce a quality run's plans
(`--section` names the results section, default `verify_bound`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

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
from benchmarks.report import command_line, markdown_table, write_result  # noqa: E402
from hydraplan.planner.solve import solve  # noqa: E402
from hydraplan.planner.verify_bound import verify_bound  # noqa: E402

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
    "raised by",
)
SHORT_KINDS = {  # `BoundVerification.raised_by`'s kinds, as the table names them
    "set: capped area": "set capped",
    "set: LP-priced area": "set LP",
    "set: replica split": "set split",
    "set: set packing": "set packing",
    "strategy: bubble dual (LP floors)": "LP dual",
    "strategy: packing": "packing",
    "strategy: assignment": "assignment",
}


def measure(
    setting_name: str,
    dataset: str,
    seed: int,
    interleaved: bool = False,
    time_limit_s: float | None = None,
    clockless: bool = False,
) -> dict:
    setting = SETTINGS[setting_name]
    if interleaved:
        from benchmarks.quality import BASELINES, setting_profile

        profile = setting_profile(setting, None, list(BASELINES))
    else:
        profile = profile_for(setting.model, setting.gpu, setting.num_gpus)
    lengths = batch_lengths(dataset, setting.num_tokens, seed, setting.context_cap)
    request = make_request(lengths, setting.num_gpus, "auto", time_limit_s or setting.time_limit_s, seed)
    if clockless:
        from benchmarks.quality import clock_standing_still

        with clock_standing_still(True):
            plan = solve(request, profile)
    else:
        plan = solve(request, profile)
    certificate = plan.bound_certificate
    started = time.process_time()
    verification = verify_bound(plan, profile, request)
    cpu_s = time.process_time() - started
    raised = verification.raised_by.items()  # parts the costlier kinds lifted to the claim
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
        "raised by": ", ".join(f"{SHORT_KINDS.get(k, k)} {n}" for k, n in sorted(raised)) or "-",
        "first violation": verification.violations[0] if verification.violations else "",
    }


def tables(rows: list[dict]) -> tuple[str, str]:
    """The full output (every row, then the first violation of each plan that did not verify) and
    the summary (the table and the share verified)."""
    table = markdown_table(list(COLUMNS), [[str(row[column]) for column in COLUMNS] for row in rows])
    verified = sum(1 for row in rows if not row["first violation"])
    share = f"Verified: {verified} of {len(rows)} plans (the verified bound reaches the claimed one within 1e-6)."
    failing = [
        f"- {r['setting']} {r['dataset']} seed {r['seed']}: {r['first violation']}"
        for r in rows
        if r["first violation"]
    ]
    full = "\n\n".join(
        [table, share, *(["First violation of each plan that did not verify:", "\n".join(failing)] if failing else [])]
    )
    return full, f"{table}\n\n{share}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", help="comma-separated setting names (default: all)")
    parser.add_argument("--datasets", help="comma-separated datasets (default: each setting's)")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument(
        "--interleaved", action="store_true", help="price the recipes' interleaved schemes too (as quality.py)"
    )
    parser.add_argument("--time-limit-s", type=float, help="the planner's budget (default: the setting's)")
    parser.add_argument("--clockless", action="store_true", help="the work limits alone end the search")
    parser.add_argument("--section", default="verify_bound", help="results section and file (default: %(default)s)")
    args = parser.parse_args()
    names = split_names(args.settings.split(",") if args.settings else None, SETTINGS, "setting") or list(SETTINGS)
    rows = []
    for name in names:
        datasets = args.datasets.split(",") if args.datasets else SETTINGS[name].datasets
        for dataset in datasets:
            for seed in range(args.seeds):
                progress(f"{name} {dataset} seed {seed}")
                row = measure(name, dataset, seed, args.interleaved, args.time_limit_s, args.clockless)
                rows.append(row)
                print(" | ".join(str(row[column]) for column in COLUMNS), flush=True)
    full, summary = tables(rows)
    write_result(args.section, command_line(), full, summary)


if __name__ == "__main__":
    main()
