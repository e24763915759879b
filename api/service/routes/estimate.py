"""POST /v1/estimate: step time and memory of a fixed strategy (or a baseline's), no search."""

from __future__ import annotations

from fastapi import APIRouter

from hydraplan.api.service.auth import TOKEN_REQUIRED
from hydraplan.api.service.dependencies import Services, ServicesDep
from hydraplan.api.service.planning import Cancel, pipeline_estimates
from hydraplan.api.service.schemas import EstimateBody, EstimateResult

router = APIRouter(prefix="/v1", tags=["plans"], dependencies=TOKEN_REQUIRED)


@router.post(
    "/estimate",
    response_model=EstimateResult,
    summary="Cost a fixed strategy on a batch",
    description=(
        "Dispatches and packs the batch onto the given strategy (or the named baseline's) without "
        "searching, and returns its step time, per-pipeline time and an upper bound on per-GPU "
        "memory, with the full plan."
    ),
)
async def estimate(body: EstimateBody, services: ServicesDep) -> EstimateResult:
    services.planning.check_limits(len(body.lengths), body.num_gpus, body.options)
    return await services.solver.run(_estimate, services, body)


def _estimate(services: Services, body: EstimateBody, cancel: Cancel) -> EstimateResult:
    planning = services.planning
    request = body.plan_request()
    profile = planning.profile_for(body, body.num_gpus, body.gpus_per_node)
    plan = planning.estimate(request, profile, body.strategy, body.baseline)
    return EstimateResult(
        strategy=plan.strategy,
        step_time_s=plan.step_time_s,
        grad_sync_s=plan.grad_sync_s,
        num_gpus=plan.num_gpus,
        pipelines=pipeline_estimates(plan),
        plan=plan,
    )
