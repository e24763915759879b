"""The web page: `/` (and `/ui`) serve one static page whose script calls the /v1 API.

The page and its two assets are deliberately public (`auth.UI_PATHS`): they hold no data, and
every call the script makes carries the token the user types, so a server with a token set still
refuses every /v1 request without it. They are not part of the OpenAPI document.
"""

from __future__ import annotations

from functools import cache
from html import escape
from importlib import resources

from fastapi import APIRouter, Request
from starlette.responses import Response

router = APIRouter(include_in_schema=False)
# The page loads only its own script and style, and talks only to its own server.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
        "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
ASSETS = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}


@cache
def _asset(name: str) -> str:
    return resources.files("hydraplan.api.service").joinpath("web", name).read_text(encoding="utf-8")


def _page(request: Request) -> Response:
    """index.html with the root path a proxy strips (`--root-path`) in its links."""
    root = escape(request.scope.get("root_path", "").rstrip("/"), quote=True)
    return Response(_asset("index.html").replace("{{ROOT}}", root), media_type="text/html", headers=HEADERS)


@router.get("/")
def index(request: Request) -> Response:
    return _page(request)


@router.get("/ui")
def ui(request: Request) -> Response:
    return _page(request)


@router.get("/ui/app.js")
def script() -> Response:
    return Response(_asset("app.js"), media_type=ASSETS["app.js"], headers=HEADERS)


@router.get("/ui/style.css")
def style() -> Response:
    return Response(_asset("style.css"), media_type=ASSETS["style.css"], headers=HEADERS)
