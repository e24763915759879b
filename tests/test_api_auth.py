"""The bearer token guards every route of the OpenAPI document (deny by default), under a root
path too, and twice: in the request guard and as a dependency of every /v1 router."""

from __future__ import annotations

import re
from typing import Any

import pytest
from api_support import assert_problem, plan_body, test_settings
from fastapi import APIRouter
from fastapi.testclient import TestClient

from hydraplan.api.service.app import create_app
from hydraplan.api.service.auth import OPEN_PATHS, route_path, unguarded_routes
from hydraplan.api.service.middleware import RequestGuardMiddleware
from hydraplan.api.service.routes import ROUTERS

pytestmark = pytest.mark.service
TOKEN = "s3cret-token"


def operations(client: TestClient) -> list[tuple[str, str]]:
    """(method, path) of every operation of the OpenAPI document, path parameters filled in."""
    document = client.get("/openapi.json").json()
    found = []
    for path, entries in document["paths"].items():
        for method in entries:
            found.append((method.upper(), re.sub(r"\{[^}]+\}", "some-id", path)))
    assert len(found) >= 15, found
    return found


def call(client: TestClient, method: str, path: str, **kwargs: Any):
    if method in ("POST", "PUT", "PATCH"):
        kwargs.setdefault("json", {})
    return client.request(method, path, **kwargs)


@pytest.mark.parametrize("root_path", ["", "/api"])
def test_every_operation_needs_the_token(root_path: str) -> None:
    app = create_app(test_settings(api_token=TOKEN))
    with TestClient(app, root_path=root_path, raise_server_exceptions=False) as client:
        guarded = [(m, p) for m, p in operations(client) if p not in OPEN_PATHS]
        assert {p for _, p in guarded} >= {"/v1/plans", "/v1/jobs", "/v1/sessions/some-id/plans"}
        for method, path in guarded:
            for url in (path, root_path + path) if root_path else (path,):
                response = call(client, method, url)
                assert_problem(response, 401)
                wrong = call(client, method, url, headers={"Authorization": "Bearer wrong"})
                assert_problem(wrong, 401, "invalid")
        for path in sorted(OPEN_PATHS & {"/healthz", "/readyz", "/metrics", "/openapi.json"}):
            assert client.get(root_path + path).status_code == 200, path
        ok = client.post(root_path + "/v1/plans", json=plan_body(), headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200, ok.text


def test_unknown_paths_are_denied_too() -> None:
    with TestClient(create_app(test_settings(api_token=TOKEN)), raise_server_exceptions=False) as client:
        assert_problem(client.get("/v2/plans"), 401)
        assert_problem(client.get("/V1/plans"), 401)
        assert client.get("/v2/plans", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 404


def test_the_router_dependency_guards_without_the_middleware() -> None:
    """Defence in depth: with the request guard taken out, every /v1 route still answers 401."""
    app = create_app(test_settings(api_token=TOKEN))
    app.user_middleware = [entry for entry in app.user_middleware if entry.cls is not RequestGuardMiddleware]
    with TestClient(app, raise_server_exceptions=False) as client:
        for method, path in operations(client):
            if path not in OPEN_PATHS:
                assert_problem(call(client, method, path), 401)
        assert client.get("/v1/models", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_a_route_without_the_dependency_is_found() -> None:
    assert unguarded_routes(ROUTERS) == []
    stray = APIRouter(prefix="/v1")
    stray.add_api_route("/stray", lambda: {}, methods=["GET"])
    assert unguarded_routes([*ROUTERS, stray]) == ["/v1/stray"]


@pytest.mark.parametrize(
    ("path", "root", "expected"),
    [
        ("/api/v1/plans", "/api", "/v1/plans"),
        ("/v1/plans", "/api", "/v1/plans"),
        ("/api", "/api", "/"),
        ("/apiv1/plans", "/api", "/apiv1/plans"),
        ("/healthz", "", "/healthz"),
    ],
)
def test_route_path_strips_only_the_root_path(path: str, root: str, expected: str) -> None:
    assert route_path({"path": path, "root_path": root}) == expected


@pytest.mark.parametrize("sent", [TOKEN + "x", TOKEN[:-1], TOKEN.upper(), " " + TOKEN + "x", "", TOKEN + " extra"])
def test_only_the_exact_token_passes(sent: str) -> None:
    """A token that merely starts with the real one (or is a prefix of it) is refused."""
    with TestClient(create_app(test_settings(api_token=TOKEN)), raise_server_exceptions=False) as client:
        assert_problem(client.get("/v1/models", headers={"Authorization": f"Bearer {sent}"}), 401)
        assert client.get("/v1/models", headers={"Authorization": f"bearer {TOKEN}"}).status_code == 200


@pytest.mark.parametrize("scheme", ["Token", "Basic", "Bearerx", "Digest", ""])
def test_only_the_bearer_scheme_carries_the_token(scheme: str) -> None:
    """The right token under another scheme (or none) is refused."""
    with TestClient(create_app(test_settings(api_token=TOKEN)), raise_server_exceptions=False) as client:
        assert_problem(client.get("/v1/models", headers={"Authorization": f"{scheme} {TOKEN}".strip()}), 401)


def test_routes_after_an_open_one_are_still_examined() -> None:
    from hydraplan.api.service.routes import health

    stray = APIRouter(prefix="/v1")
    stray.add_api_route("/stray", lambda: {}, methods=["GET"])
    assert unguarded_routes([health.router, stray]) == ["/v1/stray"]
    mixed = APIRouter()  # an open path first, then an unguarded one, in one router
    mixed.add_api_route("/healthz", lambda: {}, methods=["GET"])
    mixed.add_api_route("/v1/other", lambda: {}, methods=["GET"])
    assert unguarded_routes([mixed]) == ["/v1/other"]


def test_route_path_compares_values_not_identities() -> None:
    root = "".join(["/", "api"])  # not the interned literal
    assert route_path({"path": "".join(["/ap", "i"]), "root_path": root}) == "/"
    assert route_path({"path": "/ap", "root_path": "/api"}) == "/ap"
    assert route_path({"path": "/apiv1", "root_path": "/api"}) == "/apiv1"
