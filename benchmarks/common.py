"""What the planner benchmarks share: cluster settings, seeded batches, request building, statistics."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache

from hydraplan.api.datasets import sample_batch
from hydraplan.cost_models.analytic import AnalyticOptions, build_profile
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.planner.schemas import CostProfile, Plan, PlanRequest, SolverOptions, TrainingRecipe

GPUS_PER_NODE = 8
DEFAULT_TIME_LIMIT_S = SolverOptions().time_limit_s  # the planner's default budget (2 s)
ALL_DATASETS = ("wikipedia", "lognormal", "sft-mix", "longalign")


@dataclass(frozen=True)
class Setting:
    """One cluster and global-batch size of issue 3, section 8."""

    name: str
    model: str
    gpu: str
    num_gpus: int
    context_cap: int
    num_tokens: int
    datasets: tuple[str, ...]
    time_limit_s: float = DEFAULT_TIME_LIMIT_S

    def describe(self) -> str:
        return (
            f"{self.model} on {self.num_gpus} x {self.gpu} ({GPUS_PER_NODE}/node), "
            f"{_tokens(self.context_cap)} cap, {_tokens(self.num_tokens)} tokens per batch"
        )


SETTINGS: dict[str, Setting] = {
    setting.name: setting
    for setting in (
        Setting("8b-64xh100", "llama3-8b", "h100-sxm-80gb", 64, 32 * 1024, 1_000_000, ALL_DATASETS),
        Setting("32b-64xa100", "llama-32b", "a100-80gb", 64, 32 * 1024, 200_000, ALL_DATASETS),
        Setting("70b-256xh100", "llama3-70b", "h100-sxm-80gb", 256, 64 * 1024, 4_000_000, ("wikipedia",)),
        Setting("8b-1024xh100", "llama3-8b", "h100-sxm-80gb", 1024, 32 * 1024, 16_000_000, ("wikipedia",), 10.0),
        Setting("405b-1024xh100", "llama3-405b", "h100-sxm-80gb", 1024, 128 * 1024, 16_000_000, ("wikipedia",)),
    )
}


def _tokens(count: int) -> str:
    if count % 1_000_000 == 0:
        return f"{count // 1_000_000}M"
    if count % 1024 == 0:
        return f"{count // 1024}K"
    if count % 1000 == 0:
        return f"{count // 1000}K"
    return str(count)


@cache
def profile_for(
    model: str, gpu: str, num_gpus: int, recipe: str | None = None, virtual_stages: tuple[int, ...] = ()
) -> CostProfile:
    """The analytic cost profile (built once per process per cluster); `recipe` is a
    `TrainingRecipe` as JSON (None: the default recipe); `virtual_stages`: the interleaved schemes
    of these chunk counts too (`build_profile`)."""
    if recipe is None:
        return build_profile(get_model(model), get_gpu(gpu), num_gpus, GPUS_PER_NODE, virtual_stages=virtual_stages)
    options = AnalyticOptions.from_recipe(TrainingRecipe.model_validate_json(recipe))
    return build_profile(get_model(model), get_gpu(gpu), num_gpus, GPUS_PER_NODE, options, virtual_stages)


def batch_lengths(dataset: str, num_tokens: int, seed: int, context_cap: int) -> list[int]:
    """The seeded batch: the same arguments always give the same lengths (no network)."""
    return sample_batch(dataset, num_tokens, seed, context_cap)


def make_request(lengths: list[int], num_gpus: int, solver: str, time_limit_s: float, seed: int) -> PlanRequest:
    """A request with oversize policy `split` (a chunk longer than every capacity is split)."""
    options = SolverOptions(solver=solver, time_limit_s=time_limit_s, seed=seed, oversize="split")
    return PlanRequest(lengths=lengths, num_gpus=num_gpus, gpus_per_node=GPUS_PER_NODE, options=options)


def distinct_schemes(plan: Plan) -> int:
    return len({(p.scheme.tp, p.scheme.pp, p.scheme.cp) for p in plan.pipelines})


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value with at least q% of the values at or below it."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    """The middle value (mean of the two middle ones for an even count)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def geomean(values: Iterable[float]) -> float:
    values = list(values)
    if not values:
        return math.nan
    return math.exp(sum(math.log(value) for value in values) / len(values))


def fmt(value: float, digits: int = 2, suffix: str = "") -> str:
    """A table cell: `n/a` for a missing figure, else the number with `digits` decimals."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}{suffix}"


def split_names(values: Sequence[str] | None, valid: Iterable[str], what: str) -> list[str] | None:
    """Flatten `a,b c` style CLI lists and check every name; None stays None (= the default)."""
    if values is None:
        return None
    valid = list(valid)
    names = [name for value in values for name in value.split(",") if name]
    unknown = [name for name in names if name not in valid]
    if unknown:
        raise SystemExit(f"unknown {what} {', '.join(unknown)}; valid: {', '.join(valid)}")
    return list(dict.fromkeys(names))


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
