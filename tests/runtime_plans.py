"""Plans for the runtime tests: a fixed strategy on a tiny cost profile (`evaluate_strategy`).

The profile is a user profile of the catalog's `tiny` model with small capacities, so sequences are
split (`oversize="split"`) and deep pipelines get several micro-batches; its coefficients are
arbitrary (the runtime does not time against them here), its `grad_bytes_per_gpu` are the tiny
model's bf16 gradient shard per GPU.
"""

from __future__ import annotations

from hydraplan.planner.schemas import CostProfile, Plan, PlanRequest, SchemeCost, SolverOptions
from hydraplan.planner.solve import evaluate_strategy
from hydraplan.planner.strategies import parse_strategy

SCHEMES = ((1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (1, 2, 2), (2, 1, 2), (1, 4, 1))
CAPACITY_TOKENS = 24


def tiny_profile(capacity_tokens: int = CAPACITY_TOKENS) -> CostProfile:
    schemes = [
        SchemeCost(
            tp=tp,
            pp=pp,
            cp=cp,
            a=1e-6 / (tp * cp),
            b=1e-3 / (tp * pp * cp),
            c=1e-3,
            capacity_tokens=capacity_tokens,
            grad_bytes_per_gpu=2.0 * 3_200_000 / (tp * pp),
        )
        for tp, pp, cp in SCHEMES
    ]
    return CostProfile(model="tiny", num_layers=4, schemes=schemes, grad_sync_bandwidth_bytes_per_s=1e9, source="user")


def fixed_plan(strategy: str, lengths: list[int], num_gpus: int, seed: int = 0) -> Plan:
    request = PlanRequest(
        lengths=lengths,
        num_gpus=num_gpus,
        gpus_per_node=num_gpus,
        options=SolverOptions(solver="greedy", time_limit_s=1.0, seed=seed, oversize="split"),
    )
    return evaluate_strategy(request, tiny_profile(), parse_strategy(strategy))
