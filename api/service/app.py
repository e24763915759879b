"""The app factory: `create_app(settings)` builds the FastAPI service over planner + cost_models.

    uvicorn --factory api.service.app:create_app        # or: hydraplan serve

Settings come from the environment (`api.service.settings`) unless given; every app owns its
services (store, solver pool, job runner, metrics registry), so tests can build many apps side by
side.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import metadata

from fastapi import FastAPI, Request
from starlette.responses import Response

from hydraplan.api.service.auth import unguarded_routes
from hydraplan.api.service.dependencies import Services
from hydraplan.api.service.middleware import (
    HeadAsGetMiddleware,
    RequestContextMiddleware,
    RequestGuardMiddleware,
    route_resolver,
)
from hydraplan.api.service.observability import configure_logging
from hydraplan.api.service.openapi import build_openapi
from hydraplan.api.service.problems import install_handlers, problem_response
from hydraplan.api.service.routes import ROUTERS
from hydraplan.api.service.settings import Settings
from hydraplan.api.service.store import StoreUnavailable
from hydraplan.api.service.tenants import TokenBook
from hydraplan.planner.schemas import SolverBackend
from hydraplan.planner.solve import load_backend

DESCRIPTION = """\
Plans large-Transformer training steps on variable-length batches with heterogeneous
`<TP,PP,CP>` pipelines. Training orchestrators call it every step: `POST /v1/plans` for one batch,
or a session (`POST /v1/sessions`, then `POST /v1/sessions/{id}/plans` per step) so that the
previous plan is taken into account. Long work (large clusters, what-if sweeps) goes to
`/v1/jobs`.

Every error is an RFC 9457 `application/problem+json` document whose `detail` names the offending
field or value; validation errors list every field in `errors`. When the server is saturated it
answers 503 with `Retry-After` instead of queueing. When the server sets `HYDRAPLAN_API_TOKEN`,
every call except /healthz, /readyz, /metrics, the OpenAPI document and the web page's static
files (`/`, `/ui`) needs `Authorization: Bearer <token>`.
"""
TAGS = [
    {"name": "plans", "description": "Solve, check and estimate plans."},
    {"name": "catalog", "description": "Models, GPUs and runnable schemes."},
    {"name": "profiles", "description": "Uploaded cost profiles."},
    {
        "name": "sessions",
        "description": "Per-training-job planning with the previous plan as context.",
    },
    {"name": "jobs", "description": "Background plans and sweeps."},
    {"name": "operations", "description": "Health, readiness and metrics."},
]


def _version() -> str:
    try:
        return metadata.version("hydraplan")
    except metadata.PackageNotFoundError:
        return "0.0.0+local"


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the service; `settings` default to `Settings.from_env()`."""
    settings = settings or Settings.from_env()
    configure_logging(settings.log_level)
    services = Services.build(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # the solver libraries and the planner's compiled kernels load once, off the event loop,
        # before the first request: a first plan then pays none of it (a few seconds when Numba's
        # on-disk cache is cold)
        await asyncio.to_thread(load_backend, SolverBackend.AUTO)
        gc.freeze()  # what is loaded now lives as long as the worker: the collector skips it
        yield
        services.close()

    app = FastAPI(
        title="hydraplan",
        version=_version(),
        description=DESCRIPTION,
        openapi_tags=TAGS,
        lifespan=lifespan,
        docs_url=None,  # served from the package, not a CDN: api/service/routes/docs.py
        redoc_url=None,
    )
    app.state.services = services
    app.state.tokens = TokenBook.build(settings.api_token, settings.api_tokens_file)
    for router in ROUTERS:
        app.include_router(router)
    unguarded = unguarded_routes(ROUTERS)
    assert not unguarded, f"routes without the token dependency: {unguarded}"
    install_handlers(app)
    app.add_exception_handler(StoreUnavailable, _store_unavailable)
    app.openapi = lambda: build_openapi(app)  # type: ignore[method-assign]
    # Added last = outermost: the context wraps the guard, so rejections are logged and counted.
    app.add_middleware(HeadAsGetMiddleware)
    app.add_middleware(RequestGuardMiddleware, settings=settings, solver=services.solver)
    routes = [route for router in ROUTERS for route in router.routes]
    app.add_middleware(RequestContextMiddleware, metrics=services.metrics, route_of=route_resolver(routes))
    return app


async def _store_unavailable(request: Request, exc: Exception) -> Response:
    return problem_response(request.url.path, 503, str(exc), slug="store-unavailable", headers={"Retry-After": "1"})
