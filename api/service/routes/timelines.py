"""POST /v1/plans/timeline: the simulated 1F1B schedule of plans, drawn (SVG) or as data.

The same drawing as `hydraplan plan --timeline x.svg` (`api.render.timeline`, `api.render.svg`); the
web page shows what this returns.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from hydraplan.api.render.svg import render_svg
from hydraplan.api.render.timeline import TimelineDocument, timeline_document
from hydraplan.api.service.auth import TOKEN_REQUIRED
from hydraplan.api.service.dependencies import ServicesDep
from hydraplan.api.service.planning import Cancel
from hydraplan.api.service.problems import unprocessable
from hydraplan.api.service.schemas import TimelineBody

router = APIRouter(prefix="/v1/plans", tags=["plans"], dependencies=TOKEN_REQUIRED)
SVG_MEDIA_TYPE = "image/svg+xml"


@router.post(
    "/timeline",
    response_model=TimelineDocument,
    responses={200: {"content": {SVG_MEDIA_TYPE: {"schema": {"type": "string"}}}}},
    summary="Draw the 1F1B timeline of plans",
    description=(
        "Simulates the 1F1B schedule of every pipeline of `plan` (and of the `compare` plans, on the "
        "same time axis) and returns it as an SVG drawing, or with `format: json` as the "
        "`hydraplan.timeline/1` document the drawing embeds (every block's start and end)."
    ),
)
async def draw_timeline(body: TimelineBody, services: ServicesDep) -> Response:
    services.planning.check_schedule_size([body.plan, *(entry.plan for entry in body.compare)])
    return await services.solver.run(_draw, body)


def _draw(body: TimelineBody, cancel: Cancel) -> Response:
    """Simulation and drawing are linear in the blocks drawn: they run in the solver pool."""
    plans = [(body.label, body.plan), *((entry.label, entry.plan) for entry in body.compare)]
    try:
        document = timeline_document(plans, body.pipelines, lower_bounds=[True] + [False] * len(body.compare))
    except ValueError as exc:
        raise unprocessable(" ".join(str(exc).split()), ("body", "pipelines")) from None
    if body.format == "json":
        return Response(document.model_dump_json(), media_type="application/json")
    return Response(render_svg(document), media_type=SVG_MEDIA_TYPE)
