"""Operations: liveness, readiness and Prometheus metrics (open even when a token is set)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from hydraplan.api.service.dependencies import ServicesDep
from hydraplan.api.service.problems import saturated
from hydraplan.api.service.schemas import Health, Readiness

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health, summary="Liveness")
async def healthz() -> Health:
    return Health()


@router.get(
    "/readyz",
    response_model=Readiness,
    summary="Readiness",
    description="Ready when the store answers and the solver pool admits work; 503 otherwise.",
)
def readyz(services: ServicesDep) -> Readiness:
    services.store.ping()
    solver = services.solver
    if solver.admitted >= solver.max_admitted:
        raise saturated(
            f"not ready: all {solver.max_running} solver slots and their queue are taken",
            services.settings.retry_after_s,
        )
    return Readiness(
        store=services.store.backend,
        solves_running=services.solver.running,
        solve_slots=services.solver.max_running,
    )


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
def metrics(services: ServicesDep) -> Response:
    return Response(services.metrics.render(), media_type=services.metrics.content_type)
