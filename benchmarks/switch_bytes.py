"""Strategy switches: the bytes the runtime re-shards vs what the planner's `switch_cost_s` charges.

    python benchmarks/switch_bytes.py

One `hydraplan run --plans DIR` on 4 gloo ranks (the tiny model, float32) whose plans change
strategy every step (`STRATEGIES`); each plan is made for its fixed strategy with the previous
step's as `previous_strategy` (`planner.solve.evaluate_strategy`, the bundled `tiny-cpu` profile),
so it carries the planner's switch cost. The runtime (`runtime/reshard.py`) sends each rank only
the cells of its new shard that it did not hold (weights and both AdamW moments), each cell from
its least busy old holder; the planner (`planner/switching.py`) charges each GPU the share of its
new (layer x TP-slice) shard its old one lacks, of `grad_bytes_per_gpu`, times the profile's
`switch_bytes_per_weight_byte` (3 in profiles measured on the runtime), the busiest GPU setting
the time. The table sets them side by side, per rank and for the busiest one; it goes to
benchmarks/results/runtime_switch_bytes.md and to the section `runtime_switch_bytes` of
benchmarks/RESULTS.md.
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

from benchmarks.report import command_line, markdown_table, write_result  # noqa: E402

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


def planned_loads(plan) -> list[float]:
    """The planner's bytes to load per rank for the switch into `plan` (0 without one)."""
    from hydraplan.planner.strategies import parse_strategy
    from hydraplan.planner.switching import gpu_load_fraction

    loads = [0.0] * sum(len(pipeline.ranks) for pipeline in plan.pipelines)
    if plan.previous_strategy is None:
        return loads
    previous = parse_strategy(plan.previous_strategy)
    shard = {(e.tp, e.pp, e.cp): e.grad_bytes_per_gpu for e in plan.cost_profile.schemes}
    for pipeline in plan.pipelines:
        scheme = pipeline.scheme.scheme
        for position, rank in enumerate(pipeline.ranks):
            share = float(gpu_load_fraction(previous, scheme, position, rank))
            loads[rank] = (
                share * shard[scheme.tp, scheme.pp, scheme.cp] * plan.cost_profile.switch_bytes_per_weight_byte
            )
    return loads


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
        received = [0 if same else s["received_bytes"] for s in switches]
        sent = [0 if same else s["sent_bytes"] for s in switches]
        planned = planned_loads(plans[step])
        rows.append(
            [
                step,
                plans[step - 1].strategy,
                plans[step].strategy,
                "kept (same placement)" if same else " / ".join(f"{value / 1e6:.2f}" for value in received),
                " / ".join(f"{value / 1e6:.2f}" for value in planned),
                "-" if same else f"{max(received) / 1e6:.2f}",
                f"{max(planned) / 1e6:.2f}",
                "-" if same else f"{max(sent) / 1e6:.2f}",
                "-" if same else f"{max(s['seconds'] for s in switches) * 1e3:.0f}",
                f"{plans[step].switch_cost_s * 1e3:.2f}",
            ]
        )
    table = markdown_table(
        [
            "step",
            "from",
            "to",
            "runtime MB received, ranks 0-3",
            "planner MB to load, ranks 0-3",
            "runtime most received",
            "planner most to load",
            "runtime most sent",
            "runtime wall ms (slowest rank)",
            "planner switch_cost_s ms",
        ],
        rows,
    )
    body = "\n\n".join(
        [
            "4 gloo ranks, the tiny model in float32, one plan per step (`hydraplan run --plans`), 8 short "
            "sequences; plans of the bundled `tiny-cpu` profile (fp32 gradient shards, measured gloo bandwidth, "
            "`switch_bytes_per_weight_byte` 3). Runtime: the bytes `runtime/reshard.py` moved (weights and both "
            "AdamW moments); planner: each GPU's share of its new shard it did not hold, of `grad_bytes_per_gpu`, "
            "times 3 (`planner/switching.py`), and the plan's `switch_cost_s` (the busiest GPU's load over the "
            "profile's bandwidth). The planner takes layers as equally heavy, and `grad_bytes_per_gpu` is the "
            "largest stage's shard: the tiny model's embedding and head weigh more than its layers, which "
            "sets the rows apart where a GPU loads part of a pipeline stage.",
            table,
        ]
    )
    print(body)
    write_result("runtime_switch_bytes", command_line(), body, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
