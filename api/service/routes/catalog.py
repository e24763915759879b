"""GET /v1/models, /v1/gpus and /v1/schemes: what can be planned, and with which schemes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from hydraplan.api.service.auth import TOKEN_REQUIRED
from hydraplan.api.service.dependencies import ServicesDep
from hydraplan.api.service.planning import Cancel, Planning
from hydraplan.api.service.problems import unprocessable
from hydraplan.api.service.schemas import GpuList, ModelList, SchemeInfo, SchemeList
from hydraplan.planner import limits
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.schemas import GpuSpec, ModelSpec

router = APIRouter(prefix="/v1", tags=["catalog"], dependencies=TOKEN_REQUIRED)


@router.get("/models", response_model=ModelList, summary="Catalog models")
def list_models(services: ServicesDep) -> ModelList:
    return ModelList(models=list(services.planning.models.values()))


@router.get("/gpus", response_model=GpuList, summary="Catalog GPUs")
def list_gpus(services: ServicesDep) -> GpuList:
    return GpuList(gpus=list(services.planning.gpus.values()))


@router.get(
    "/schemes",
    response_model=SchemeList,
    summary="Runnable schemes of a model on a cluster",
    description="Every <tp,pp,cp> the analytic cost model finds runnable, with its costs.",
)
async def list_schemes(
    services: ServicesDep,
    model: Annotated[str, Query(max_length=128, description="Catalog model name.", examples=["tiny"])],
    gpu: Annotated[str, Query(max_length=128, description="Catalog GPU name.", examples=["h100-sxm-80gb"])],
    num_gpus: Annotated[int, Query(ge=1, le=limits.MAX_NUM_GPUS, description="GPUs in the cluster.", examples=[8])],
    gpus_per_node: Annotated[int, Query(ge=1, le=limits.MAX_GPUS_PER_NODE, description="GPUs per node.")] = 8,
) -> SchemeList:
    """Building the profile is CPU work: it runs in the solver pool (503 when saturated)."""
    planning = services.planning
    if num_gpus > services.settings.max_num_gpus:
        raise unprocessable(
            f"num_gpus {num_gpus} exceeds this server's limit of {services.settings.max_num_gpus}",
            ("query", "num_gpus"),
        )
    if num_gpus > gpus_per_node and num_gpus % gpus_per_node:
        raise unprocessable(
            f"num_gpus {num_gpus} is not a multiple of gpus_per_node {gpus_per_node}",
            ("query", "num_gpus"),
        )
    spec, gpu_spec = planning.model(model), planning.gpu(gpu)
    return await services.solver.run(_schemes, planning, spec, gpu_spec, num_gpus, gpus_per_node)


def _schemes(
    planning: Planning, spec: ModelSpec, gpu_spec: GpuSpec, num_gpus: int, gpus_per_node: int, cancel: Cancel
) -> SchemeList:
    profile = planning.analytic_profile(spec, gpu_spec, num_gpus, gpus_per_node)
    cost = ProfileCostModel(profile)
    unit = profile.seconds_per_unit
    schemes = [
        SchemeInfo(
            scheme=str(entry.scheme),
            tp=entry.tp,
            pp=entry.pp,
            cp=entry.cp,
            num_gpus=entry.tp * entry.pp * entry.cp,
            capacity_tokens=cost.capacity_tokens(entry.scheme),
            a=entry.a * unit,
            b=entry.b * unit,
            c=entry.c * unit,
            static_bytes=entry.static_bytes,
        )
        for entry in profile.schemes
    ]
    return SchemeList(
        model=spec.name,
        gpu=gpu_spec.name,
        num_gpus=num_gpus,
        gpus_per_node=gpus_per_node,
        schemes=schemes,
    )
