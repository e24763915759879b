"""Pure ASGI middleware: request context (id, log line, metrics, last-resort 500) and the guard
(bearer token, body size, content type) that runs before any route reads the body. The token is
also required by a dependency on every /v1 router (`api.service.auth`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Sequence

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hydraplan.api.service.auth import needs_token, refusal, route_path
from hydraplan.api.service.metrics import Metrics
from hydraplan.api.service.observability import (
    REQUEST_ID_HEADER,
    access_logger,
    request_id_from,
    reset_request_id,
    set_request_id,
)
from hydraplan.api.service.problems import ProblemError, problem_response
from hydraplan.api.service.settings import Settings
from hydraplan.api.service.solving import SolverPool
from hydraplan.api.service.tenants import TokenBook

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
UNMATCHED_ROUTE = "<unmatched>"
logger = logging.getLogger("hydraplan.errors")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


class RequestContextMiddleware:
    """Request id in and out, one JSON access-log line, request metrics, and a problem+json 500
    for any exception no handler took."""

    def __init__(self, app: ASGIApp, metrics: Metrics, route_of: Callable[[Scope], str]) -> None:
        self.app = app
        self.metrics = metrics
        self.route_of = route_of
        self.access = access_logger()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_from(_header(scope, REQUEST_ID_HEADER.encode()))
        token = set_request_id(request_id)
        started = time.perf_counter()
        status = 500
        response_started = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                response_started = True
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((REQUEST_ID_HEADER.encode(), request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            logger.exception("unhandled error on %s %s", scope["method"], scope["path"])
            if not response_started:
                response = problem_response(scope["path"], 500, "internal error; see the server log")
                await response(scope, receive, send_with_id)
        finally:
            self.metrics.in_flight.dec()
            self._record(scope, status, time.perf_counter() - started)
            reset_request_id(token)

    def _record(self, scope: Scope, status: int, duration_s: float) -> None:
        route = self.route_of(scope)
        method = scope["method"]
        self.metrics.requests.labels(route=route, method=method, status=str(status)).inc()
        self.metrics.latency.labels(route=route, method=method).observe(duration_s)
        self.access.info(
            "request",
            extra={
                "method": method,
                "path": scope["path"],
                "route": route,
                "status": status,
                "duration_ms": round(duration_s * 1e3, 3),
                "client": (scope.get("client") or ("", 0))[0],
            },
        )


class HeadAsGetMiddleware:
    """HEAD on a GET route answers as GET does (status and headers, Content-Length included)
    without the body (RFC 9110, 9.3.2); FastAPI routes only the methods they declare."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def without_body(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, without_body)


def route_resolver(routes: Sequence[BaseRoute]) -> Callable[[Scope], str]:
    """The route template of a request (`/v1/jobs/{job_id}`), for bounded metric labels.

    Routed requests carry their route in the scope; requests the guard rejected before routing
    (401, 413, 415) are matched against `routes` here.
    """

    def route_of(scope: Scope) -> str:
        route = scope.get("route")
        if route is not None:
            return getattr(route, "path", UNMATCHED_ROUTE)
        for candidate in routes:
            match, _ = candidate.matches(scope)
            if match != Match.NONE:
                return getattr(candidate, "path", UNMATCHED_ROUTE)
        return UNMATCHED_ROUTE

    return route_of


class RequestGuardMiddleware:
    """Rejects, before any parsing: a missing or wrong bearer token outside the open operations
    paths (401, deny by default, relative to the root path), a body over `max_body_bytes` by
    Content-Length or by streamed count (413), a body the worker has no room for (503: the bodies
    it holds, from their first byte until their response is sent, stay within
    `max_body_bytes_in_flight`), a solver-pool request when the pool has no place (503), a body
    that has not arrived within `max_body_read_s` (408) and a non-JSON body (415). None of these
    reads more of the body it refuses."""

    def __init__(self, app: ASGIApp, settings: Settings, solver: SolverPool | None = None) -> None:
        self.app = app
        self.tokens = TokenBook.build(settings.api_token, settings.api_tokens_file)
        self.max_body_bytes = settings.max_body_bytes
        self.budget_bytes = settings.body_bytes_in_flight
        self.retry_after_s = settings.retry_after_s
        self.read_timeout_s = settings.max_body_read_s
        self.solver = solver
        self.in_flight_bytes = 0  # only the event loop's thread touches it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if self.tokens is not None and needs_token(scope):
            refused = refusal(scope, _header(scope, b"authorization"), self.tokens)
            if refused is not None:
                await refused(scope, receive, send)
                return
        if scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        declared_bytes = int(declared) if declared is not None and declared.isdigit() else 0
        if declared_bytes > self.max_body_bytes:
            await self._too_large(path, f"{declared} bytes")(scope, receive, send)
            return
        if self.solver is not None and uses_solver(scope):
            try:
                self.solver.check_room()
            except ProblemError as full:
                refused = problem_response(path, full.status, full.detail, slug=full.slug, headers=full.headers)
                await refused(scope, receive, send)
                return
        reserved = _Reservation(self)
        try:
            if not reserved.grow(declared_bytes):
                await self._no_room(path, declared_bytes)(scope, receive, send)
                return
            await self._guarded(scope, receive, send, reserved)
        finally:
            reserved.release()

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, reserved: _Reservation) -> None:
        path = scope["path"]
        body = await self._read_body(receive, reserved)
        if body is _DISCONNECTED:
            return
        if body is _NO_ROOM:
            await self._no_room(path, reserved.bytes)(scope, receive, send)
            return
        if body is _TIMED_OUT:
            detail = f"body: not received within {self.read_timeout_s:g} s; send it at once, or a smaller one"
            await problem_response(path, 408, detail, headers={"Connection": "close"})(scope, receive, send)
            return
        if body is None:
            await self._too_large(path, "more bytes")(scope, receive, send)
            return
        content_type = _header(scope, b"content-type")
        if body and not _is_json(content_type):
            detail = (
                f"content-type {content_type!r} is not supported; send application/json"
                if content_type
                else "the body has no content-type; send application/json"
            )
            response = problem_response(path, 415, detail)
            await response(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    def _too_large(self, path: str, size: str):
        return problem_response(path, 413, f"body: {size} exceed this server's limit of {self.max_body_bytes} bytes")

    def _no_room(self, path: str, size: int):
        return self._saturated(
            path,
            f"body: {size} bytes do not fit in this worker's budget of {self.budget_bytes} bytes of request "
            f"bodies in flight ({self.in_flight_bytes} held now)",
        )

    def _saturated(self, path: str, why: str):
        detail = f"{why}; retry in {self.retry_after_s} s"
        headers = {"Retry-After": str(self.retry_after_s)}
        return problem_response(path, 503, detail, slug="saturated", headers=headers)

    async def _read_body(self, receive: Receive, reserved: _Reservation) -> bytes | object | None:
        """The whole body; None as soon as it grows past the limit, `_NO_ROOM` when it outgrows
        its reservation and the budget has no more, `_DISCONNECTED` when the client left,
        `_TIMED_OUT` when it has not all come within `read_timeout_s` (a client that declares a
        body and sends it slowly, or never, would hold its share of the budget)."""
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + self.read_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return _TIMED_OUT
            if message["type"] != "http.request":  # client went away
                return _DISCONNECTED
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            if size > reserved.bytes and not reserved.grow(size - reserved.bytes):
                return _NO_ROOM
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


_DISCONNECTED = object()
_NO_ROOM = object()
_TIMED_OUT = object()


class _Reservation:
    """Bytes of one request's body counted against its worker's in-flight budget."""

    def __init__(self, guard: RequestGuardMiddleware) -> None:
        self.guard = guard
        self.bytes = 0

    def grow(self, more: int) -> bool:
        guard = self.guard
        if more and guard.in_flight_bytes + more > guard.budget_bytes:
            return False
        guard.in_flight_bytes += more
        self.bytes += more
        return True

    def release(self) -> None:
        self.guard.in_flight_bytes -= self.bytes
        self.bytes = 0


# POST routes whose work runs in the solver pool: refused while it has no place, body unread.
SOLVER_ROUTES = re.compile(r"/v1/(plans(/check|/timeline)?|estimate|sessions(/[^/]+/(plans|measurements))?)/?")


def uses_solver(scope: Scope) -> bool:
    return SOLVER_ROUTES.fullmatch(route_path(scope)) is not None


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json" or (media_type.startswith("application/") and media_type.endswith("+json"))


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive callable that yields the buffered body once, then defers to the server."""
    delivered = False

    async def replay() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
