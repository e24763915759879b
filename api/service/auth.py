"""The bearer token: checked twice, by the request guard before any body is read and by a
dependency on every `/v1` router, so no route is left open by a path the guard did not foresee.

Deny by default: with a token set, every path needs it except the operations paths and the web
page's static files in `OPEN_PATHS`, compared after removing the ASGI `root_path` (a server mounted under
`--root-path /api` sees `/api/v1/plans`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response
from starlette.types import Scope

from hydraplan.api.service.problems import ProblemError, problem_response
from hydraplan.api.service.tenants import ANONYMOUS, Tenant, TokenBook, current_tenant_var

# Liveness, readiness, metrics and the API's own description stay open (docs/service.md), with the
# documentation pages' own assets (api/service/routes/docs.py).
OPERATIONS_PATHS = frozenset(
    {"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/redoc"}
    | {
        f"/docs/assets/{name}"
        for name in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")
    }
)
# The web page and its assets (api/service/routes/web.py): static, no data; its /v1 calls carry the token.
UI_PATHS = frozenset({"/", "/ui", "/ui/app.js", "/ui/style.css"})
OPEN_PATHS = OPERATIONS_PATHS | UI_PATHS
MISSING = "Authorization header is missing: send 'Bearer <token>'"
INVALID = "Authorization bearer token is invalid"


def route_path(scope: Scope) -> str:
    """The request path relative to the app: `scope["path"]` without the `root_path` prefix."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and (path == root or path.startswith(root + "/")):
        return path[len(root) :] or "/"
    return path


def public_path(scope: Scope, path: str) -> str:
    """`path` of the app as a client behind the proxy reaches it: under the ASGI root path
    (`--root-path /api`: `/api/v1/jobs/...`), for Location headers."""
    return scope.get("root_path", "").rstrip("/") + path


def needs_token(scope: Scope) -> bool:
    return route_path(scope) not in OPEN_PATHS


def authenticate(authorization: str | None, tokens: TokenBook) -> Tenant | tuple[str, str]:
    """The tenant whose token `authorization` carries, else (detail, WWW-Authenticate challenge)."""
    scheme, _, credentials = (authorization or "").partition(" ")
    if scheme.lower() == "bearer":
        tenant = tokens.tenant_of(credentials.strip())
        if tenant is not None:
            return tenant
    if authorization is None:
        return MISSING, 'Bearer realm="hydraplan"'
    return INVALID, 'Bearer realm="hydraplan", error="invalid_token"'


def refusal(scope: Scope, authorization: str | None, tokens: TokenBook) -> Response | None:
    """The 401 problem response for a request without a known token, or None to let it through."""
    found = authenticate(authorization, tokens)
    if isinstance(found, Tenant):
        return None
    detail, challenge = found
    return problem_response(scope["path"], 401, detail, headers={"WWW-Authenticate": challenge})


async def require_token(request: Request) -> Tenant:
    """Router dependency: the request's tenant (`tenants.ANONYMOUS` on a server without tokens),
    also kept in `tenants.current_tenant_var` for the code the route calls; 401 without a known
    token. Async, so that the context variable is set in the route's own context."""
    tokens: TokenBook | None = request.app.state.tokens
    if tokens is None:
        tenant = ANONYMOUS
    else:
        found = authenticate(request.headers.get("authorization"), tokens)
        if not isinstance(found, Tenant):
            detail, challenge = found
            raise ProblemError(401, detail, headers={"WWW-Authenticate": challenge})
        tenant = found
    current_tenant_var.set(tenant)
    return tenant


def unguarded_routes(routers: Iterable[APIRouter]) -> list[str]:
    """Paths of the routers' routes outside `OPEN_PATHS` that lack the `require_token` dependency."""
    missing = []
    for router in routers:
        for route in router.routes:
            path = getattr(route, "path", "")
            dependant = getattr(route, "dependant", None)
            if path in OPEN_PATHS:
                continue
            calls = {dependency.call for dependency in dependant.dependencies} if dependant else set()
            if require_token not in calls:
                missing.append(path)
    return missing


# The dependencies of every /v1 router, and the tenant for a route that needs it (resolved once).
TOKEN_REQUIRED = [Depends(require_token)]
TenantDep = Annotated[Tenant, Depends(require_token)]
