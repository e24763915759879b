"""Strategy switches: the bytes the runtime re-shards vs what the planner's `switch_cost_s` charges.

    python benchmarks/switch_bytes.py

One `hydraplan run --plans DIR` on 4 gloo ranks (the tiny model, float32) whose plans change
strategy every step (`STRATEGIES`); each plan is made for its fixed strategy with the previous
step's as `previous_strategy` (`planner.solve.evaluate_strategy`, the bundled `tiny-cpu` profile),
so it carries the planner's switch cost. The runtime (`runtime/reshard.py`) sends each rank only
the cells of its new shard that it did not hold (weights and both AdamW moments); the planner
(`planner/switching.py`) charges every GPU of a pipeline whose (scheme, ranks) block is new the
load of its whole weight shard (`grad_bytes_per_gpu`, optimizer states not moved). The table sets
them side by side; the section `runtime_switch_bytes` of benchmarks/RESULTS.md is rewritten.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.report import RESULTS_PATH, command_line, markdown_table, write_section  # noqa: E402

STRATEGIES = (
    "4x<1,1,1>",
    "2x<2,1,1>",  # every new shard is part of what each rank held: nothing needs to move
    "4x<1,1,1>",  # each rank lacks the other TP half
    "1x<2,1,1> + 1x<1,2,1>",
    "1x<1,1,2> + 2x<1,1,1>",
    "1x<2,1,1> + 1x<1,2,1>",  # switching back: every rank held the whole model (CP and <1,1,1>)
)
LENGTHS = [40, 90, 20, 70, 120, 30, 80, 60]


def make_plans(folder: Path) -> list:
    from hydraplan.cost_models.profile_io import bundled_profile
    from hydraplan.planner.schemas import PlanRequest, SolverOptions
    from hydraplan.planner.solve import evaluate_strategy
    from hydraplan.planner.strategies import parse_strategy

    profile = bundled_profile("tiny-cpu")
    plans, previous = [], None
    for step, strategy in enumerate(STRATEGIES):
        request = PlanRequest(
            lengths=LENGTHS,
            num_gpus=4,
            gpus_per_node=4,
            previous_strategy=previous,
            options=SolverOptions(solver="greedy", time_limit_s=1.0),
        )
        plan = evaluate_strategy(request, profile, parse_strategy(strategy))
        (folder / f"{step:02d}.json").write_text(plan.model_dump_json())
        plans.append(plan)
        previous = plan.strategy
    return plans


def main() -> int:
    from hydraplan.api.cli import main as hydraplan_main

    folder = Path(tempfile.mkdtemp(prefix="switch_bytes-"))
    plans_dir = folder / "plans"
    plans_dir.mkdir()
    plans = make_plans(plans_dir)
    report = folder / "run.json"
    with contextlib.redirect_stdout(io.StringIO()):
        code = hydraplan_main(["run", "--plans", str(plans_dir), "--report", str(report)])
    if code:
        raise SystemExit(f"hydraplan run failed ({code})")
    ranks = json.loads(report.read_text())["ranks"]
    rows = []
    for step in range(1, len(plans)):
        switches = [rank["steps"][step]["switch"] for rank in ranks]
        same = switches[0] is None
        weight = [0 if same else s["weight_bytes"] for s in switches]
        rows.append(
            [
                step,
                plans[step - 1].strategy,
                plans[step].strategy,
                "kept (same placement)" if same else f"{sum(weight):,}",
                "-" if same else f"{max(weight):,}",
                "-" if same else f"{max(s['seconds'] for s in switches) * 1e3:.0f}",
                f"{plans[step].switch_cost_s * 1e3:.2f}",
                "-" if same else f"{max(s['planned_weight_bytes'] for s in switches):,.0f}",
            ]
        )
    table = markdown_table(
        [
            "step",
            "from",
            "to",
            "runtime weight bytes sent (all ranks)",
            "most by one rank",
            "runtime wall ms (slowest rank)",
            "planner switch_cost_s ms",
            "planner shard bytes per moved GPU",
        ],
        rows,
    )
    body = "\n\n".join(
        [
            "4 gloo ranks, the tiny model in float32, one plan per step (`hydraplan run --plans`), 8 short "
            "sequences; plans of the bundled `tiny-cpu` profile (fp32 gradient shards, measured gloo bandwidth). "
            "Runtime bytes: the weight part of what `runtime/reshard.py` sent (a third of it: each cell travels "
            "with its two AdamW moments). Planner: `switch_cost_s` of the plan and the shard it charges.",
            table,
        ]
    )
    print(body)
    write_section("runtime_switch_bytes", command_line(), body, RESULTS_PATH)
    return 0


if __name__ == "__main__":
    sys.exit(main())
