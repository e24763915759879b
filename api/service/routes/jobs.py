"""Jobs for long work: POST /v1/jobs (202), GET /v1/jobs/{job_id}, DELETE /v1/jobs/{job_id}."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Request, Response

from hydraplan.api.service.auth import TOKEN_REQUIRED, public_path
from hydraplan.api.service.dependencies import ServicesDep
from hydraplan.api.service.jobs import job_location
from hydraplan.api.service.schemas import JOB_EXAMPLES, JobAccepted, JobBody, JobView

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=TOKEN_REQUIRED)


@router.post(
    "",
    response_model=JobAccepted,
    status_code=202,
    summary="Start a plan or sweep job",
    description=(
        "`kind: plan` solves one request in the background (no synchronous time limit). "
        "`kind: sweep` plans `base` for every combination of the `vary` values. Answers 202 with "
        "the job id and its Location; poll GET /v1/jobs/{job_id}."
    ),
)
def create_job(
    body: Annotated[JobBody, Body(examples=JOB_EXAMPLES)], services: ServicesDep, request: Request, response: Response
) -> JobAccepted:
    view = services.jobs.submit(body)
    location = public_path(request.scope, job_location(view.job_id))
    response.headers["Location"] = location
    return JobAccepted(job_id=view.job_id, status=view.status, location=location)


@router.get("/{job_id}", response_model=JobView, summary="Status and result of a job")
def get_job(job_id: str, services: ServicesDep) -> JobView:
    return services.jobs.get(job_id)


@router.delete(
    "/{job_id}",
    response_model=JobView,
    status_code=202,
    summary="Cancel a job, or delete a finished one",
    description=(
        "A queued or running job is asked to stop: a running solve returns its best plan so far, a "
        "sweep stops after the item in progress; answers 202 with the job's state. A finished job is "
        "deleted with its results and its place in the job cap is free at once: 204."
    ),
    responses={204: {"description": "The finished job and its results are deleted."}},
)
def cancel_or_delete_job(job_id: str, services: ServicesDep) -> JobView | Response:
    view = services.jobs.cancel_or_delete(job_id)
    return Response(status_code=204) if view is None else view
