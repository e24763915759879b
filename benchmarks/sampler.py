"""The workload-balanced sampler against what frameworks do by default.

    python benchmarks/sampler.py [--steps 6] [--quick]

For each bundled dataset, a pool of documents (cut at the context cap) is served by
`hydraplan.integrations.torch.WorkloadBalancedSampler` on a fixed homogeneous layout, and each
step's predicted step time (the exact 1F1B simulation of the analytic cost model) is compared with
arrival-order token packing of the same samples: next-fit micro-batches up to the capacity, dealt
round-robin to the data-parallel ranks (Megatron-LM's and torchtitan's default). The ratio is
arrival-order time / balanced time: above 1 the sampler's steps are shorter.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import geomean, median
from benchmarks.report import command_line, markdown_table, write_result
from hydraplan.api.datasets import sample_batch
from hydraplan.integrations.torch import WorkloadBalancedSampler
from hydraplan.planner.baselines import arrival_order_micro_batches
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.simulate import simulate_1f1b

# (dataset, context cap, layout): llama3-8b on 64 H100s, 1M tokens per step; long-context data
# gets a wider TP x CP grid so that one sequence fits a micro-batch.
SETTINGS = [
    ("wikipedia", 32768, 16, "<4,1,1>"),
    ("lognormal", 8192, 16, "<4,1,1>"),
    ("sft-mix", 32768, 16, "<4,1,1>"),
    ("longalign", 65536, 8, "<8,1,1>"),
]
TOKENS_PER_STEP = 1 << 20


def arrival_order_step_s(sampler: WorkloadBalancedSampler, step: int) -> float:
    samples = sampler.step_samples(step)[1]
    lengths = sampler.lengths[samples]
    coef = ProfileCostModel(sampler.profile).coefficients(sampler.scheme)
    batches = arrival_order_micro_batches(lengths, sampler.capacity_tokens)
    times = [coef.micro_batch_time_s(lengths[batch]) for batch in batches]
    per_rank = [times[rank :: sampler.dp_size] for rank in range(sampler.dp_size)]
    return max(simulate_1f1b(mine, coef.scheme.pp, coef.fwd_fraction) for mine in per_rank) + _sync_s(sampler)


def _sync_s(sampler: WorkloadBalancedSampler) -> float:
    return ProfileCostModel(sampler.profile).grad_sync_s([sampler.scheme] * sampler.dp_size)


def run(num_steps: int, pool_tokens: int) -> list[list[str]]:
    rows = []
    for dataset, cap, dp_size, scheme in SETTINGS:
        lengths = sample_batch(dataset, pool_tokens, seed=0, context_cap=cap)
        sampler = WorkloadBalancedSampler(
            lengths, dp_size=dp_size, scheme=scheme, tokens_per_step=TOKENS_PER_STEP, model="llama3-8b", seed=0
        )
        ratios, planning_s = [], []
        for step in range(min(num_steps, len(sampler))):
            started = time.perf_counter()
            balanced = sampler.step_batches(step)
            planning_s.append(time.perf_counter() - started)
            ratios.append(arrival_order_step_s(sampler, step) / balanced.predicted_step_time_s)
        rows.append(
            [
                dataset,
                f"{dp_size}x{scheme}",
                f"{cap // 1024}K",
                str(len(ratios)),
                f"{geomean(ratios):.3f}x",
                f"{min(ratios):.3f}x",
                f"{max(ratios):.3f}x",
                f"{median(planning_s):.2f}",
            ]
        )
        print(" | ".join(rows[-1]), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="steps per dataset (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="2 steps per dataset, written nowhere")
    args = parser.parse_args()
    steps = 2 if args.quick else args.steps
    rows = run(steps, pool_tokens=(steps + 1) * TOKENS_PER_STEP)
    headers = ["dataset", "layout", "cap", "steps", "geomean", "least", "most", "planning s/step (p50)"]
    table = markdown_table(headers, rows)
    body = "\n".join(
        [
            "llama3-8b on 64 x h100-sxm-80gb (analytic), 1M-token steps. The ratio is the predicted step "
            "time of arrival-order token packing (round-robin to the data-parallel ranks) over the "
            "sampler's balanced packing of the same samples.",
            "",
            table,
        ]
    )
    print(body)
    if not args.quick:
        write_result("sampler", command_line(), body, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
