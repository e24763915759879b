"""POST /v1/plans (solve a batch) and POST /v1/plans/check (validate a plan)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import ValidationError
from starlette.responses import Response

from hydraplan.api.service.auth import TOKEN_REQUIRED
from hydraplan.api.service.dependencies import Services, ServicesDep
from hydraplan.api.service.planning import Cancel, server_timing_header, start_solve_timing
from hydraplan.api.service.problems import unprocessable
from hydraplan.api.service.schemas import CheckBody, CheckResult, PlanBody
from hydraplan.planner.check import check_plan
from hydraplan.planner.schemas import Plan, PlanRequest
from hydraplan.planner.verify_bound import verify_bound

router = APIRouter(prefix="/v1/plans", tags=["plans"], dependencies=TOKEN_REQUIRED)


def json_response(text: str, timings: list[float]) -> Response:
    """JSON text serialised off the event loop (a plan of 2M sequences is tens of MB), with the
    planner's own time in a Server-Timing header."""
    return Response(text, media_type="application/json", headers=server_timing_header(timings))


@router.post(
    "",
    response_model=Plan,
    summary="Plan one global batch",
    description=(
        "Solves the batch on the cluster with the given cost source (exactly one of model+gpu, "
        "profile or profile_id) and returns the checked plan. The same request with the same "
        "`options.seed` gets the same `plan_id`. The solve runs off the event loop; when every "
        "solver slot and queue place is taken the answer is 503 with Retry-After."
    ),
)
async def create_plan(body: PlanBody, services: ServicesDep) -> Response:
    services.planning.check_limits(len(body.lengths), body.num_gpus, body.options)
    timings = start_solve_timing()
    return json_response(await services.solver.run(_plan_json, services, body), timings)


def _plan_json(services: Services, body: PlanBody, cancel: Cancel) -> str:
    """The plan JSON exactly as `hydraplan plan --json` prints it (serialised once, by pydantic,
    in the solver thread)."""
    return services.planning.plan(body, cancel).model_dump_json()


@router.post(
    "/check",
    response_model=CheckResult,
    summary="Check a plan",
    description=(
        "Runs the independent plan checker. With `lengths` / `num_gpus` / `gpus_per_node` the "
        "plan must also answer that request; with `options` (and `previous_strategy`) too, the body is "
        "the whole request: its gap tolerance decides the status and, with a cost source, the plan's "
        "`request_hash` must be its hash. With a cost source the times are recomputed from that "
        "profile instead of the plan's own. With `bound` (and a cost source) the plan's `lower_bound_s` must "
        "also verify from its bound certificate (`planner.verify_bound`; `verified_bound_s` is what it proved). "
        "An invalid plan is a 200 with `valid: false`. A plan "
        "whose 1F1B schedule has more operations than the server simulates per request is a 422."
    ),
)
async def check(body: CheckBody, services: ServicesDep) -> CheckResult:
    services.planning.check_schedule_size([body.plan])
    return await services.solver.run(_check, services, body)


def _check(services: Services, body: CheckBody, cancel: Cancel) -> CheckResult:
    """The checker is linear in the plan's size: it runs in the solver pool like a solve."""
    plan = body.plan
    request = _plan_request(body)
    violations = [] if request is not None else _request_mismatches(body)  # the checker compares a request
    profile = None
    if body.source_kind() is not None:
        num_gpus = body.num_gpus or plan.num_gpus
        gpus_per_node = body.gpus_per_node or plan.gpus_per_node
        profile = services.planning.profile_for(body, num_gpus, gpus_per_node)
    try:
        violations += check_plan(plan, profile, request)
    except (ArithmeticError, IndexError, KeyError, ValueError) as exc:
        raise unprocessable(f"plan is inconsistent and cannot be checked: {exc}", ("body", "plan")) from None
    verified_s = None
    if body.bound and profile is not None and not violations:  # the verifier reads a valid plan's items
        verification = verify_bound(plan, profile, request)
        violations = verification.violations
        verified_s = verification.verified_bound_s if plan.bound_certificate is not None else None
    return CheckResult(plan_id=plan.plan_id, valid=not violations, violations=violations, verified_bound_s=verified_s)


def _plan_request(body: CheckBody) -> PlanRequest | None:
    """The whole request the plan claims to answer, when the body gives one (options included)."""
    if body.options is None or body.lengths is None or body.num_gpus is None:
        return None
    try:
        return PlanRequest(
            lengths=body.lengths,
            num_gpus=body.num_gpus,
            gpus_per_node=body.gpus_per_node or 8,
            options=body.options,
            previous_strategy=body.previous_strategy,
        )
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "options"
        raise unprocessable(f"not a plan request: {error['msg']}", ("body", field)) from None


def _request_mismatches(body: CheckBody) -> list[str]:
    """Where the plan does not answer the request given alongside it."""
    plan = body.plan
    found = []
    if body.lengths is not None and body.lengths != plan.input_lengths:
        if len(body.lengths) != len(plan.input_lengths):
            found.append(f"plan covers {len(plan.input_lengths)} sequences, the request has {len(body.lengths)}")
        else:
            pairs = zip(body.lengths, plan.input_lengths, strict=True)
            index = next(i for i, (asked, planned) in enumerate(pairs) if asked != planned)
            found.append(
                f"sequence {index}: the plan has length {plan.input_lengths[index]}, the request {body.lengths[index]}"
            )
    if body.num_gpus is not None and body.num_gpus != plan.num_gpus:
        found.append(f"plan uses {plan.num_gpus} GPUs, the request has {body.num_gpus}")
    if body.gpus_per_node is not None and body.gpus_per_node != plan.gpus_per_node:
        found.append(f"plan assumes {plan.gpus_per_node} GPUs per node, the request {body.gpus_per_node}")
    return found
