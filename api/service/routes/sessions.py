"""Sessions: fix cluster, costs and options once, then plan each training step's batch."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from hydraplan.api.service.auth import TOKEN_REQUIRED, public_path
from hydraplan.api.service.dependencies import Services, ServicesDep
from hydraplan.api.service.loop_schemas import MeasurementsBody, SessionFit
from hydraplan.api.service.planning import Cancel, start_solve_timing
from hydraplan.api.service.problems import too_large, unprocessable
from hydraplan.api.service.routes.plans import json_response
from hydraplan.api.service.schemas import SessionBody, SessionPlans, SessionPlansBody, SessionView
from hydraplan.api.service.sessions import session_location
from hydraplan.planner.schemas import Plan

router = APIRouter(prefix="/v1/sessions", tags=["sessions"], dependencies=TOKEN_REQUIRED)


@router.post(
    "",
    response_model=SessionView,
    status_code=201,
    summary="Start a planning session",
    description=(
        "Validates and stores the cluster, cost source and options of a training job. The session "
        "expires after `idle_timeout_s` without a request. Its plans' time limit is `auto` unless "
        "`options.time_limit_s` is given: a share of each batch's step, planned while the step before trains."
    ),
)
async def create_session(body: SessionBody, services: ServicesDep, request: Request, response: Response) -> SessionView:
    """Resolving the cost source is CPU work: it runs in the solver pool (503 when saturated);
    storing the session is I/O: it runs in the ordinary thread pool, so a slow store never holds
    a solver slot."""
    await services.solver.run(_check, services, body)
    record = await run_in_threadpool(services.sessions.create, body)
    response.headers["Location"] = public_path(request.scope, session_location(record.session_id))
    return services.sessions.view(record)


def _check(services: Services, body: SessionBody, cancel: Cancel) -> None:
    services.sessions.check(body)


@router.get("/{session_id}", response_model=SessionView, summary="Read a session")
def get_session(session_id: str, services: ServicesDep) -> SessionView:
    return services.sessions.view(services.sessions.get(session_id))


@router.delete("/{session_id}", status_code=204, summary="End a session")
def delete_session(session_id: str, services: ServicesDep) -> Response:
    services.sessions.delete(session_id)
    return Response(status_code=204)


@router.post(
    "/{session_id}/plans",
    response_model=Plan | SessionPlans,
    summary="Plan the next batch (or the next k batches) of a session",
    description=(
        "With `lengths`: plans one batch and returns its Plan. With `batches`: plans them in "
        "order, each with the previous plan as strategy-switch context, and returns "
        '`{"plans": [...]}`. The session keeps the last plan for the next call. A second call '
        "on the same session while one is running gets 409."
    ),
)
async def plan_in_session(
    session_id: str,
    body: SessionPlansBody,
    services: ServicesDep,
) -> Response:
    batches = body.all_batches()
    settings = services.settings
    if len(batches) > settings.max_session_batches:
        raise unprocessable(
            f"batches: {len(batches)} batches exceed this server's limit of {settings.max_session_batches} per call",
            ("body", "batches"),
        )
    num_sequences = sum(len(batch) for batch in batches)
    if num_sequences > settings.max_sequences:
        raise too_large(f"{num_sequences} sequences exceed this server's limit of {settings.max_sequences} per request")
    timings = start_solve_timing()
    return json_response(await services.solver.run(_plans_json, services, session_id, body, batches), timings)


def _plans_json(
    services: Services, session_id: str, body: SessionPlansBody, batches: list[list[int]], cancel: Cancel
) -> str:
    """The plan (for `lengths`) or `{"plans": [...]}` (for `batches`), serialised in the solver thread."""
    plans = services.sessions.plan(session_id, batches, cancel)
    if body.lengths is not None:
        return plans[0].model_dump_json()
    return SessionPlans(plans=plans).model_dump_json()


@router.post(
    "/{session_id}/measurements",
    response_model=SessionFit,
    summary="Post one training step's measurements; the session refits its profile",
    description=(
        "Per pipeline: its scheme, each micro-batch's tokens, sum of squared lengths and measured stage time "
        "(forward+backward on its slowest stage), and its ranks' measured peak memory. The session refits the "
        "stage-time coefficients of the measured schemes (robust, recent-weighted, at most 20% a step, blended with "
        "the original profile) into a new profile version, and lowers a scheme's capacity at once when a peak comes "
        "within 5% of the usable device memory or exceeds the predicted peak. The next plan names the version and "
        "says what changed (`session_feedback`). Answers the session's fit (as `fit` of GET). Runs in the solver "
        "pool; nothing is stored for a refused body; a second concurrent post on one session gets 409."
    ),
)
async def post_measurements(session_id: str, body: MeasurementsBody, services: ServicesDep) -> SessionFit:
    return await services.solver.run(_record_measurements, services, session_id, body)


def _record_measurements(services: Services, session_id: str, body: MeasurementsBody, cancel: Cancel) -> SessionFit:
    return services.sessions.record_measurements(session_id, body)
