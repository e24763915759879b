"""The OpenAPI document: FastAPI's, plus the problem+json error responses every operation can
give, the bearer-token security scheme, and no trace of FastAPI's default validation-error body
(the service never sends it)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from hydraplan.api.service.problems import PROBLEM_MEDIA_TYPE, Problem

REF_TEMPLATE = "#/components/schemas/{model}"
SECURITY_SCHEME = "bearerToken"
BODY_METHODS = {"post", "put", "patch"}
CONFLICT_OPERATIONS = {
    ("post", "/v1/sessions/{session_id}/plans"),
    ("post", "/v1/sessions/{session_id}/measurements"),
    ("delete", "/v1/jobs/{job_id}"),
}
STORAGE_OPERATIONS = {("post", "/v1/sessions"), ("post", "/v1/profiles"), ("post", "/v1/jobs")}

ERROR_DESCRIPTIONS = {
    "400": "The body is not valid JSON.",
    "401": "The bearer token is missing or wrong (only when the server sets HYDRAPLAN_API_TOKEN).",
    "404": "An unknown model, GPU, profile, session or job (the detail names it).",
    "409": "The resource is busy or already finished.",
    "413": "The body or the number of sequences exceeds the server's limit.",
    "415": "The body is not application/json.",
    "422": "A field is invalid or the request cannot be planned; `errors` lists the fields.",
    "500": "An internal error (reported in the server log with the request id).",
    "503": "Saturated (retry after Retry-After seconds) or the store is unavailable.",
    "507": "The server keeps as many sessions, profiles or jobs as it is configured to.",
}
ERROR_HEADERS = {
    "401": {"WWW-Authenticate": "Bearer challenge."},
    "503": {"Retry-After": "Seconds to wait before retrying (when saturated)."},
}


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """Generate (once) and return the app's OpenAPI document."""
    if app.openapi_schema:
        return app.openapi_schema
    document = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
        tags=app.openapi_tags,
    )
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    _add_problem_schemas(schemas)
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    document["components"]["securitySchemes"] = {
        SECURITY_SCHEME: {
            "type": "http",
            "scheme": "bearer",
            "description": "Required on /v1 when the server sets HYDRAPLAN_API_TOKEN.",
        }
    }
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            _document_errors(path, method, operation)
    app.openapi_schema = document
    return document


def _add_problem_schemas(schemas: dict[str, Any]) -> None:
    problem = Problem.model_json_schema(ref_template=REF_TEMPLATE)
    for name, definition in problem.pop("$defs", {}).items():
        schemas.setdefault(name, definition)
    schemas.setdefault("Problem", problem)


def _document_errors(path: str, method: str, operation: dict[str, Any]) -> None:
    responses = operation.setdefault("responses", {})
    responses.pop("422", None)  # FastAPI's HTTPValidationError; ours is problem+json
    statuses = {"500"}
    if path.startswith("/v1"):
        statuses |= {"401", "404", "422", "503"}
        operation["security"] = [{SECURITY_SCHEME: []}]
    if path == "/readyz":
        statuses.add("503")
    if method in BODY_METHODS:
        statuses |= {"400", "413", "415"}
    if (method, path) in CONFLICT_OPERATIONS:
        statuses.add("409")
    if (method, path) in STORAGE_OPERATIONS:
        statuses.add("507")
    for status in sorted(statuses):
        responses[status] = _problem_response(status)


def _problem_response(status: str) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": ERROR_DESCRIPTIONS[status],
        "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }
    headers = ERROR_HEADERS.get(status)
    if headers:
        response["headers"] = {
            name: {"description": text, "schema": {"type": "string"}} for name, text in headers.items()
        }
    return response
