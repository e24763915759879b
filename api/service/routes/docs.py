"""/docs and /redoc: the interactive API documentation, with no third-party origin involved.

FastAPI's pages load Swagger UI and ReDoc from a CDN: blank offline, and third-party script on the
origin that serves the web page (whose users type the token into it). Here the pages load the
bundles shipped in the `fastapi-offline` wheel, pinned in pyproject.toml, from this server
(`/docs/assets/...`), under a Content-Security-Policy that allows this server's own assets and
the Swagger page's one inline bootstrap script, by its hash. Like the web page they are public
(`auth.OPERATIONS_PATHS`): the OpenAPI document they render is public too.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.responses import Response

router = APIRouter(include_in_schema=False)
ASSETS_PATH = "/docs/assets"
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}
ASSET_PATHS = frozenset(f"{ASSETS_PATH}/{name}" for name in ASSETS)
INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


@cache
def _asset(name: str) -> bytes:
    return resources.files("fastapi_offline").joinpath("static", name).read_bytes()


def _policy(html: str) -> str:
    """Own assets only; inline script only by hash; styles inline too (both UIs set them);
    ReDoc renders in a blob worker; requests (Swagger's "try it out") to this server only."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"
        for script in INLINE_SCRIPT.findall(html)
    )
    return (
        f"default-src 'none'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    )


def _page(html: str) -> Response:
    headers = {"Content-Security-Policy": _policy(html), "X-Content-Type-Options": "nosniff"}
    return Response(html, media_type="text/html", headers=headers)


def _root(request: Request) -> str:
    return request.scope.get("root_path", "").rstrip("/")


@router.get("/docs")
def swagger_ui(request: Request) -> Response:
    root = _root(request)
    html = get_swagger_ui_html(
        openapi_url=f"{root}/openapi.json",
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
    )
    return _page(bytes(html.body).decode())


@router.get("/redoc")
def redoc(request: Request) -> Response:
    root = _root(request)
    html = get_redoc_html(
        openapi_url=f"{root}/openapi.json",
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{root}{ASSETS_PATH}/redoc.standalone.js",
        redoc_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
        with_google_fonts=False,
    )
    return _page(bytes(html.body).decode())


def _asset_route(name: str) -> None:
    def serve() -> Response:
        headers = {"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"}
        return Response(_asset(name), media_type=ASSETS[name], headers=headers)

    router.add_api_route(f"{ASSETS_PATH}/{name}", serve, methods=["GET"], name=f"docs-asset-{name}")


for _name in ASSETS:
    _asset_route(_name)
