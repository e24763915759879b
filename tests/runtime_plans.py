"""Plans for the runtime tests: a fixed strategy on a tiny cost profile (`evaluate_strategy`).

The profile is a user profile of the catalog's `tiny` model with small capacities, so sequences are
split (`oversize="split"`) and deep pipelines get several micro-batches; its coefficients are
arbitrary (the runtime does not time against them here), its `grad_bytes_per_gpu` are the tiny
model's bf16 gradient shard per GPU.
"""

from __future__ import annotations

import json

from hydraplan.planner.schemas import CostProfile, Plan, PlanRequest, SchemeCost, SolverOptions
from hydraplan.planner.solve import evaluate_strategy
from hydraplan.planner.strategies import parse_strategy

SCHEMES = ((1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (1, 2, 2), (2, 1, 2), (1, 4, 1))
CAPACITY_TOKENS = 24


# A smaller catalog entry than `tiny` for the distributed tests (uneven TP shards: 25 MLP rows of
# 50, 32/33 vocabulary rows of 65), given to the runtime with `--models-file`.
MINI_MODEL = {
    "name": "rt-mini",
    "num_layers": 2,
    "hidden_size": 32,
    "ffn_hidden_size": 50,
    "num_heads": 4,
    "num_kv_heads": 2,
    "vocab_size": 65,
    "source": "hydraplan runtime test model",
}


def write_models_file(path) -> str:
    """The catalog file holding `MINI_MODEL`; returns its path as text."""
    path.write_text(json.dumps({"models": [MINI_MODEL]}), encoding="utf-8")
    return str(path)


def tiny_profile(capacity_tokens: int = CAPACITY_TOKENS, model: str = "tiny", num_layers: int = 4) -> CostProfile:
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
        if num_layers % pp == 0
    ]
    return CostProfile(
        model=model, num_layers=num_layers, schemes=schemes, grad_sync_bandwidth_bytes_per_s=1e9, source="user"
    )


def fixed_plan(
    strategy: str, lengths: list[int], num_gpus: int, seed: int = 0, model: str = "tiny", previous: str | None = None
) -> Plan:
    """The planner's plan of `lengths` on the fixed `strategy` (checked by the planner itself);
    `previous`: the previous step's strategy (the plan then costs the switch)."""
    request = PlanRequest(
        lengths=lengths,
        num_gpus=num_gpus,
        gpus_per_node=num_gpus,
        previous_strategy=previous,
        options=SolverOptions(solver="greedy", time_limit_s=1.0, seed=seed, oversize="split"),
    )
    num_layers = MINI_MODEL["num_layers"] if model == MINI_MODEL["name"] else 4
    return evaluate_strategy(request, tiny_profile(model=model, num_layers=num_layers), parse_strategy(strategy))


class FailingPlanner:
    """A step planner that plans step 0 with `inner` and refuses every later step (picklable)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def plan(self, lengths, previous):
        if previous is not None:
            raise RuntimeError("422 from the test planner")
        return self.inner.plan(lengths, previous)
