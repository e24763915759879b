"""hydraplan: plans large-Transformer training steps on variable-length data.

The public Python API is the handful of names in `__all__`; everything else (the layers
`hydraplan.planner`, `hydraplan.cost_models`, `hydraplan.api`, `hydraplan.runtime` and their
modules) is private by convention and may change between versions.

>>> import hydraplan
>>> lengths = [4096, 1024, 512, 8192, 2048, 300, 7000, 128]
>>> plan = hydraplan.plan(lengths, model="tiny", num_gpus=8, time_limit_s=0.3)
>>> hydraplan.check(plan)
[]
>>> sorted(i for p in plan.pipelines for b in p.micro_batches for i in b.sequence_ids)
[0, 1, 2, 3, 4, 5, 6, 7]
>>> fixed = hydraplan.estimate(lengths, "8x<1,1,1>", model="tiny", num_gpus=8)
>>> fixed.strategy, fixed.step_time_s >= plan.lower_bound_s
('8x<1,1,1>', True)

Importing `hydraplan` loads nothing heavy: the planner, pydantic and the solver libraries are
imported on first use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hydraplan.api.client import AsyncClient, Client, ServiceError
    from hydraplan.planner.errors import PlanningError
    from hydraplan.planner.schemas import CostProfile, Plan, PlanRequest, SolverOptions

__version__ = "0.1.0"
__all__ = [
    "AsyncClient",
    "Client",
    "CostProfile",
    "Plan",
    "PlanRequest",
    "PlanningError",
    "ServiceError",
    "SolverOptions",
    "analytic_profile",
    "check",
    "estimate",
    "load_profile",
    "plan",
    "plan_with_profile",
]
_TYPES = {
    "CostProfile": "hydraplan.planner.schemas",
    "Plan": "hydraplan.planner.schemas",
    "PlanRequest": "hydraplan.planner.schemas",
    "SolverOptions": "hydraplan.planner.schemas",
    "PlanningError": "hydraplan.planner.errors",
    # the REST clients need httpx (the service extra)
    "Client": "hydraplan.api.client",
    "AsyncClient": "hydraplan.api.client",
    "ServiceError": "hydraplan.api.client",
}


def __getattr__(name: str) -> Any:
    """The boundary types and the clients, imported on first use."""
    if name in _TYPES:
        import importlib

        return getattr(importlib.import_module(_TYPES[name]), name)
    raise AttributeError(f"module 'hydraplan' has no attribute {name!r}")


def analytic_profile(
    model: str = "llama3-8b", gpu: str = "h100-sxm-80gb", *, num_gpus: int = 64, gpus_per_node: int = 8
) -> CostProfile:
    """The analytic cost profile of a catalog model on a cluster of catalog GPUs.

    Raises `ValueError` naming an unknown model or GPU, or the closest scheme when the model fits
    none.
    """
    from hydraplan.cost_models.analytic import build_profile
    from hydraplan.cost_models.catalog import get_gpu, get_model

    return build_profile(get_model(model), get_gpu(gpu), num_gpus, gpus_per_node)


def load_profile(source: str | Path | Mapping[str, Any]) -> CostProfile:
    """A cost profile from a JSON file (measured, calibrated or hand-written) or a parsed dict;
    `ValueError` naming the file, the field and the problem when it is invalid."""
    from hydraplan.cost_models.profile_io import load_profile as load

    return load(dict(source) if isinstance(source, Mapping) else source)


def plan(
    lengths: Sequence[int],
    *,
    model: str = "llama3-8b",
    gpu: str = "h100-sxm-80gb",
    num_gpus: int = 64,
    gpus_per_node: int = 8,
    previous_strategy: str | None = None,
    baselines: Sequence[str] = (),
    **options: Any,
) -> Plan:
    """Plan one global batch on `num_gpus` catalog GPUs with the analytic cost model.

    `options` are `SolverOptions` fields (`time_limit_s`, `seed`, `max_schemes`, `solver`,
    `oversize`, `strategy_pool`, ...). The plan has passed the independent checker. Raises
    `PlanningError` (a `ValueError`) when the batch cannot be planned and pydantic's
    `ValidationError` (also a `ValueError`) naming the field for a bad value.
    """
    profile = analytic_profile(model, gpu, num_gpus=num_gpus, gpus_per_node=gpus_per_node)
    return plan_with_profile(
        lengths,
        profile,
        num_gpus=num_gpus,
        gpus_per_node=gpus_per_node,
        previous_strategy=previous_strategy,
        baselines=baselines,
        **options,
    )


def plan_with_profile(
    lengths: Sequence[int],
    profile: CostProfile | str | Path,
    *,
    num_gpus: int,
    gpus_per_node: int = 8,
    previous_strategy: str | None = None,
    baselines: Sequence[str] = (),
    **options: Any,
) -> Plan:
    """Plan one global batch with a given cost profile (an object or a profile file)."""
    from hydraplan.planner.solve import solve

    request = _request(lengths, num_gpus, gpus_per_node, previous_strategy, options)
    return solve(request, _profile(profile), baselines=tuple(baselines))


def estimate(
    lengths: Sequence[int],
    strategy: str,
    *,
    model: str = "llama3-8b",
    gpu: str = "h100-sxm-80gb",
    profile: CostProfile | str | Path | None = None,
    num_gpus: int = 64,
    gpus_per_node: int = 8,
    **options: Any,
) -> Plan:
    """The plan of a fixed strategy (e.g. `'1x<8,1,2> + 6x<4,2,1>'`) without searching:
    dispatch, packing and the 1F1B simulation on that strategy, checked; the cost source is
    `profile` when given, else the analytic model of `model` on `gpu`."""
    from hydraplan.planner.solve import evaluate_strategy
    from hydraplan.planner.strategies import check_strategy_fits

    fixed = check_strategy_fits(strategy, num_gpus, gpus_per_node, "strategy")
    costs = (
        _profile(profile)
        if profile is not None
        else analytic_profile(model, gpu, num_gpus=num_gpus, gpus_per_node=gpus_per_node)
    )
    return evaluate_strategy(_request(lengths, num_gpus, gpus_per_node, None, options), costs, fixed)


def check(plan: Plan, profile: CostProfile | str | Path | None = None, request: PlanRequest | None = None) -> list[str]:
    """Every constraint the plan breaks (empty when valid), recomputed by the independent
    checker from `profile` when given, else from the profile embedded in the plan. With
    `request`, the plan must answer it (and, with the profile it was planned with, its
    `request_hash` must be their hash)."""
    from hydraplan.planner.check import check_plan

    return check_plan(plan, _profile(profile) if profile is not None else None, request)


def _profile(profile: CostProfile | str | Path) -> CostProfile:
    return load_profile(profile) if isinstance(profile, str | Path) else profile


def _request(
    lengths: Sequence[int], num_gpus: int, gpus_per_node: int, previous_strategy: str | None, options: dict[str, Any]
) -> PlanRequest:
    from hydraplan.planner.schemas import PlanRequest, SolverOptions, integer_list

    return PlanRequest(
        lengths=integer_list(lengths),
        num_gpus=num_gpus,
        gpus_per_node=gpus_per_node,
        previous_strategy=previous_strategy,
        options=SolverOptions(**options),
    )
