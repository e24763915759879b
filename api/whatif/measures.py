"""The figures of a what-if row: model FLOPs for MFU, strategy mix, prices, status order."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from hydraplan.api.whatif.schemas import RowStatus, WhatifRow
from hydraplan.planner.schemas import ModelSpec, Plan

STATUS_ORDER = ("optimal", "feasible", "timeout_incumbent")  # best to worst
SECONDS_PER_HOUR = 3600.0
TOKENS_PER_MILLION = 1e6


def model_flops_coefficients(model: ModelSpec) -> tuple[float, float]:
    """`(per_token, per_sq_token)`: a sequence of length l costs `per_token*l + per_sq_token*l^2`
    model FLOPs per training step.

    Model FLOPs count no recomputation (the MFU of Chowdhery et al. 2022, PaLM, Appendix B: 6N per
    token plus the attention scores), forward+backward = 3x forward (Narayanan et al. 2021 §5.1),
    causal attention computing half the score matrix. `training_flops_per_token` gives the per-token
    FLOPs of sequences of length 0 (no attention) and 1 (one unit of attention).
    """
    from hydraplan.cost_models.analytic import training_flops_per_token

    per_token = training_flops_per_token(model, 0, recompute="none", causal=True, flash_attention=False)
    per_sq_token = training_flops_per_token(model, 1, recompute="none", causal=True, flash_attention=False) - per_token
    return per_token, per_sq_token


def model_flops(model: ModelSpec, plan: Plan) -> float:
    """Model FLOPs of one planned step, over the entries the plan trains (chunks count alone)."""
    per_token, per_sq_token = model_flops_coefficients(model)
    total = 0.0
    for pipeline in plan.pipelines:
        for batch in pipeline.micro_batches:
            total += per_token * batch.num_tokens + per_sq_token * sum(length * length for length in batch.lengths)
    return total


def strategy_mix(plans: Sequence[Plan], num_gpus: int) -> dict[str, float]:
    """Share of GPU-steps each scheme runs on, over all plans (sums to 1)."""
    gpus: dict[str, int] = {}
    for plan in plans:
        for pipeline in plan.pipelines:
            scheme = pipeline.scheme
            name = f"<{scheme.tp},{scheme.pp},{scheme.cp}>"
            gpus[name] = gpus.get(name, 0) + scheme.tp * scheme.pp * scheme.cp
    total = num_gpus * len(plans)
    return {name: count / total for name, count in sorted(gpus.items())}


def worst_status(statuses: Sequence[str]) -> str:
    return max(statuses, key=STATUS_ORDER.index)


def geometric_mean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(value) for value in values) / len(values))


ANY_GPU = "*"  # a price key for every GPU type without its own


def price_of(prices: Mapping[str, float], gpu: str | None) -> float | None:
    """The price per GPU-hour of `gpu`: its own, else the `*` one, else None."""
    if gpu is not None and gpu in prices:
        return prices[gpu]
    return prices.get(ANY_GPU)


def priced(rows: Sequence[WhatifRow], prices: Mapping[str, float]) -> list[WhatifRow]:
    """Rows with their cost per hour and per 1M tokens from each GPU type's price per GPU-hour
    (`cost per 1M tokens = price * num_gpus / 3600 / tokens_per_s * 1e6`)."""
    result = []
    for row in rows:
        price = price_of(prices, row.gpu)
        if price is None:
            result.append(row)
            continue
        cost_per_hour = price * row.num_gpus
        per_million = None
        if row.status == RowStatus.OK and row.tokens_per_s:
            per_million = cost_per_hour / SECONDS_PER_HOUR / row.tokens_per_s * TOKENS_PER_MILLION
        update = {"price_per_gpu_hour": price, "cost_per_hour": cost_per_hour, "cost_per_1m_tokens": per_million}
        result.append(row.model_copy(update=update))
    return result
