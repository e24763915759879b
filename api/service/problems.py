"""RFC 9457 problem details: the body of every error the service returns.

Routes raise `ProblemError` (or a domain error mapped below); the handlers turn each into an
`application/problem+json` response whose `detail` names the offending field or value. Request
validation errors list every failing field in `errors`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from hydraplan.api.service.observability import current_request_id
from hydraplan.planner.errors import PlanningError

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:hydraplan:problem:"


class FieldError(BaseModel):
    """One failing field of a request."""

    model_config = ConfigDict(extra="forbid")

    loc: list[str | int] = Field(description="Where the error is, e.g. ['body', 'lengths', 3].")
    msg: str = Field(description="What is wrong with it.")
    type: str = Field(description="Machine-readable error kind (pydantic's error type).")


class Problem(BaseModel):
    """An RFC 9457 problem details object."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "type": "urn:hydraplan:problem:not-found",
                    "title": "Not Found",
                    "status": 404,
                    "detail": "model 'llama-9000' is unknown; valid: llama3-8b, tiny",
                    "instance": "/v1/plans",
                    "request_id": "5f0c2a0e8f6a4d47",
                }
            ]
        },
    )

    type: str = Field(description="URI identifying the kind of problem.")
    title: str = Field(description="Short summary of the kind of problem.")
    status: int = Field(description="HTTP status code.")
    detail: str = Field(description="What went wrong this time, naming the offending value.")
    instance: str = Field(description="The request path that failed.")
    request_id: str | None = Field(None, description="X-Request-ID of the failed request.")
    errors: list[FieldError] | None = Field(None, description="Every failing field (validation errors only).")


class ProblemError(Exception):
    """An error a route raises on purpose; rendered as problem+json with `status`."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        slug: str | None = None,
        headers: Mapping[str, str] | None = None,
        errors: Sequence[FieldError] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.slug = slug or _default_slug(status)
        self.headers = dict(headers or {})
        self.errors = list(errors) if errors is not None else None


def not_found(detail: str) -> ProblemError:
    return ProblemError(404, detail, slug="not-found")


def unprocessable(detail: str, loc: Sequence[str | int] = ("body",)) -> ProblemError:
    """422 for a value that is well-formed but cannot be served; `loc` names the field."""
    error = FieldError(loc=list(loc), msg=detail, type="value_error")
    return ProblemError(422, detail, slug="unprocessable", errors=[error])


def too_large(detail: str) -> ProblemError:
    return ProblemError(413, detail, slug="too-large")


def storage_full(detail: str) -> ProblemError:
    """507: the server keeps as many sessions, profiles or jobs as it is configured to."""
    return ProblemError(507, detail, slug="storage-full")


def conflict(detail: str) -> ProblemError:
    return ProblemError(409, detail, slug="conflict")


def saturated(detail: str, retry_after_s: int) -> ProblemError:
    return ProblemError(503, detail, slug="saturated", headers={"Retry-After": str(retry_after_s)})


def problem_response(
    request_path: str,
    status: int,
    detail: str,
    *,
    slug: str | None = None,
    headers: Mapping[str, str] | None = None,
    errors: Sequence[FieldError] | None = None,
) -> Response:
    """The problem+json response; used by the handlers and by middleware outside the router."""
    body = make_problem(status, detail, request_path, slug=slug, errors=errors)
    return Response(
        body.model_dump_json(exclude_none=True),
        status_code=status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=dict(headers or {}),
    )


def make_problem(
    status: int,
    detail: str,
    instance: str,
    *,
    slug: str | None = None,
    errors: Sequence[FieldError] | None = None,
) -> Problem:
    return Problem(
        type=TYPE_PREFIX + (slug or _default_slug(status)),
        title=_title(status),
        status=status,
        detail=detail,
        instance=instance,
        request_id=current_request_id(),
        errors=list(errors) if errors is not None else None,
    )


def problem_from_exception(exc: Exception, instance: str) -> Problem:
    """The problem a request would have got for `exc` (for errors recorded in a job)."""
    if isinstance(exc, ProblemError):
        return make_problem(exc.status, exc.detail, instance, slug=exc.slug, errors=exc.errors)
    if isinstance(exc, ValidationError):
        errors = field_errors(exc.errors(include_url=False))
        return make_problem(422, describe_errors(errors), instance, slug="validation", errors=errors)
    if isinstance(exc, ValueError):  # PlanningError and the cost models' errors
        return make_problem(422, " ".join(str(exc).split()), instance, slug="unprocessable")
    return make_problem(500, "internal error; see the server log", instance)


# the tag pydantic puts in an error's location for the union member that refused the value
UNION_MEMBER_TAG = re.compile(r"constrained-\w+|literal\[.*\]|function-[a-z]+\[.*\]")


def field_errors(raw_errors: Sequence[Any]) -> list[FieldError]:
    """pydantic error dicts without their (possibly huge) inputs, one per field: a value every
    member of a union refused (`time_limit_s` 0: not a number > 0, not 'auto') is reported by the
    first member, without the member's tag (`constrained-float`) in its location."""
    errors: dict[tuple[int | str, ...], FieldError] = {}
    for error in raw_errors:
        loc = tuple(part if isinstance(part, int) else str(part) for part in error.get("loc", ()))
        field_loc = tuple(part for part in loc if not (isinstance(part, str) and UNION_MEMBER_TAG.fullmatch(part)))
        errors.setdefault(
            field_loc,
            FieldError(
                loc=list(field_loc),
                msg=str(error.get("msg", "")).removeprefix("Value error, "),
                type=str(error.get("type", "value_error")),
            ),
        )
    return list(errors.values())


def describe_errors(errors: Sequence[FieldError]) -> str:
    """One line naming the first failing field, e.g. `body.lengths.3: Input should be ...`."""
    if not errors:
        return "the request is invalid"
    first = errors[0]
    location = ".".join(str(part) for part in first.loc)
    text = f"{location}: {first.msg}" if location else first.msg
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more)"
    return text


def install_handlers(app: FastAPI) -> None:
    """Map every error the routes can raise onto problem+json."""
    app.add_exception_handler(ProblemError, _problem_error)
    app.add_exception_handler(RequestValidationError, _request_validation_error)
    app.add_exception_handler(ValidationError, _pydantic_validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_exception)
    app.add_exception_handler(PlanningError, _unprocessable_value)
    # ValueError is how the planner and the cost models report a user's mistake (STYLE.md); one
    # that escapes without being a PlanningError still names the offending value.
    app.add_exception_handler(ValueError, _unprocessable_value)


async def _problem_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProblemError)
    return problem_response(
        request.url.path,
        exc.status,
        exc.detail,
        slug=exc.slug,
        headers=exc.headers,
        errors=exc.errors,
    )


async def _request_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    raw = list(exc.errors())
    if any(error.get("type") == "json_invalid" for error in raw):
        return problem_response(request.url.path, 400, _json_error_detail(raw), slug="malformed-json")
    errors = field_errors(raw)
    return problem_response(request.url.path, 422, describe_errors(errors), slug="validation", errors=errors)


async def _pydantic_validation_error(request: Request, exc: Exception) -> Response:
    """A model built inside a route (e.g. the planner's PlanRequest) rejected a value."""
    assert isinstance(exc, ValidationError)
    errors = field_errors(exc.errors(include_url=False))
    for error in errors:
        error.loc = ["body", *error.loc]
    return problem_response(request.url.path, 422, describe_errors(errors), slug="validation", errors=errors)


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Routing errors (unknown path 404, wrong method 405) and framework HTTP errors."""
    assert isinstance(exc, StarletteHTTPException)
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no route {request.url.path}"
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        detail = f"method {request.method} is not allowed on {request.url.path}; allowed: {allowed}"
    return problem_response(request.url.path, exc.status_code, detail, headers=exc.headers or {})


async def _unprocessable_value(request: Request, exc: Exception) -> Response:
    """The planner cannot plan the request as asked (its message names the value)."""
    assert isinstance(exc, ValueError)
    detail = " ".join(str(exc).split())
    return problem_response(
        request.url.path,
        422,
        detail,
        slug="unprocessable",
        errors=[FieldError(loc=["body"], msg=detail, type="planning_error")],
    )


def _json_error_detail(raw_errors: Sequence[Any]) -> str:
    error = next(error for error in raw_errors if error.get("type") == "json_invalid")
    loc = error.get("loc", ())
    position = loc[1] if len(loc) > 1 else "?"
    reason = (error.get("ctx") or {}).get("error", "invalid JSON")
    return f"body is not valid JSON: {reason} at character {position}"


def _title(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _default_slug(status: int) -> str:
    return _title(status).lower().replace(" ", "-")
