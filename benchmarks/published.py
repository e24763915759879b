"""The analytic model against published training runs (issue 13): predicted vs published
tokens/s per GPU for every row of `benchmarks/published_runs.py`, written to RESULTS.md.

    python -m benchmarks.published [--no-write]

Each prediction is the analytic profile of exactly that configuration (model, GPU, GPU count, 8
per node, recipe) evaluated for the run's uniform micro-batches: 1F1B pipeline time
`(m + pp - 1) * stage_time` (exact for equal micro-batches, Narayanan et al. 2021 §2.2) plus the
profile's exposed gradient synchronisation. No parameter is set per row: the per-GPU figures are
those of `cost_models/data/efficiency.json`, and an overlapped recipe exposes the global
`OVERLAPPED_EXPOSED` share of its data-parallel communication.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from benchmarks.published_runs import GPT_MODELS, LLAMA2_70B, RUNS, PublishedRun
from benchmarks.report import write_section
from hydraplan.cost_models.analytic import AnalyticOptions, build_profile
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.schemas import ModelSpec
from hydraplan.planner.scheme import ParallelScheme

GPUS_PER_NODE = 8
# Share of FSDP's gathers / reduce-scatters (or an overlapped all-reduce) left on the critical
# path: the first layer's gather and the last layer's reduce-scatter cannot hide, and
# communication slows the kernels it overlaps (an assumption, one value for every row).
OVERLAPPED_EXPOSED = 0.25
COMMAND = "python -m benchmarks.published"


@dataclass(frozen=True)
class Prediction:
    run: PublishedRun
    tokens_per_s_per_gpu: float
    step_s: float
    grad_sync_s: float
    capacity_tokens: int

    @property
    def ratio(self) -> float:
        return self.tokens_per_s_per_gpu / self.run.published_tokens_per_s_per_gpu

    @property
    def micro_batch_tokens(self) -> int:
        return self.run.micro_batch * self.run.seq_len


def model_of(run: PublishedRun) -> ModelSpec:
    if run.model in GPT_MODELS:
        return GPT_MODELS[run.model]
    if run.model == LLAMA2_70B.name:
        return LLAMA2_70B
    return get_model(run.model)


def recipe_of(run: PublishedRun) -> AnalyticOptions:
    exposed = OVERLAPPED_EXPOSED if run.overlap else 1.0
    return AnalyticOptions(
        recompute=run.recompute,  # type: ignore[arg-type]
        sharding=run.sharding,  # type: ignore[arg-type]
        grad_dtype=run.grad_dtype,  # type: ignore[arg-type]
        grad_reduce_dtype=run.grad_reduce_dtype,  # type: ignore[arg-type]
        dp_sync_exposed=exposed,
        efficiency="catalog",
        min_capacity_tokens=1,
    )


def predict(run: PublishedRun) -> Prediction:
    """The model's tokens/s per GPU for exactly this run; capacity 0 when the scheme does not fit."""
    profile = build_profile(model_of(run), get_gpu(run.gpu), run.num_gpus, GPUS_PER_NODE, recipe_of(run))
    cost = ProfileCostModel(profile)
    scheme = ParallelScheme(run.tp, run.pp, run.cp)
    if scheme not in cost.schemes():
        return Prediction(run, 0.0, float("inf"), 0.0, 0)
    stage_s = cost.stage_time_s(scheme, [run.seq_len] * run.micro_batch)
    sync_s = cost.grad_sync_s([scheme] * run.dp)
    step_s = (run.micro_batches + run.pp - 1) * stage_s + sync_s
    tokens = run.global_batch * run.seq_len / step_s / run.num_gpus
    return Prediction(run, tokens, step_s, sync_s, cost.capacity_tokens(scheme))


def render(predictions: list[Prediction]) -> str:
    lines = [
        "| run | GPUs | layout (TP,PP,CP,DP) | seq | batch / micro | recipe | published | "
        "published tok/s/GPU | predicted tok/s/GPU | ratio | capacity / ran (tokens) | source |",
        "|---|---:|---|---:|---|---|---|---:|---:|---:|---|---|",
    ]
    for item in predictions:
        run = item.run
        recipe = f"{run.recompute} recompute, {run.sharding}, grads {run.grad_dtype}"
        recipe += ", overlapped" if run.overlap else ""
        lines.append(
            f"| {run.name} | {run.num_gpus} x {run.gpu} | {run.tp},{run.pp},{run.cp},{run.dp} | {run.seq_len} | "
            f"{run.global_batch} / {run.micro_batch} | {recipe} | {run.published_as} | "
            f"{run.published_tokens_per_s_per_gpu:,.1f} | {item.tokens_per_s_per_gpu:,.1f} | {item.ratio:.2f} | "
            f"{item.capacity_tokens:,} / {item.micro_batch_tokens:,} | {run.source} |"
        )
    within_15 = sum(abs(item.ratio - 1) <= 0.15 for item in predictions)
    within_30 = sum(abs(item.ratio - 1) <= 0.30 for item in predictions)
    lines.append("")
    lines.append(
        f"Within +-15%: {within_15} of {len(predictions)} rows; within +-30%: {within_30} of {len(predictions)}; "
        f"overlapped recipes expose {OVERLAPPED_EXPOSED:.0%} of their data-parallel communication."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args(argv)
    predictions = [predict(run) for run in RUNS]
    body = render(predictions)
    print(body)
    if not args.no_write:
        write_section("published", COMMAND, body + "\n\n" + OUTLIERS)
    return 0


OUTLIERS = "(outliers: see below)"

if __name__ == "__main__":
    sys.exit(main())
