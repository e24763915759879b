"""The real planning service for the runtime's online tests: the FastAPI app in uvicorn, in a
thread of the test process, on a free loopback port, behind a small shim that sheds the first
session plan requests with 503 + `Retry-After` (what a saturated server answers), so the run
must wait them out.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from hydraplan.runtime.launch import free_port

TOKEN = "runtime-test-token"


@dataclass
class Shed503:
    """ASGI wrapper: the first `shed` POSTs to `/v1/sessions/{id}/plans` get 503 + Retry-After."""

    app: object
    shed: int = 1
    retry_after_s: int = 1
    answered_503: int = 0
    plan_requests: list[float] = field(default_factory=list)  # monotonic times of every plan request

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if scope["type"] == "http" and scope["method"] == "POST" and path.startswith("/v1/sessions/"):
            if path.endswith("/plans"):
                self.plan_requests.append(time.monotonic())
                if self.answered_503 < self.shed:
                    self.answered_503 += 1
                    await _problem_503(send, self.retry_after_s)
                    return
        await self.app(scope, receive, send)


async def _problem_503(send, retry_after_s: int) -> None:
    body = json.dumps({"title": "Service Unavailable", "status": 503, "detail": "test shim: saturated"}).encode()
    headers = [
        (b"content-type", b"application/problem+json"),
        (b"retry-after", str(retry_after_s).encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@dataclass
class RunningService:
    url: str
    shim: Shed503


@contextmanager
def running_service(shed: int = 1) -> Iterator[RunningService]:
    """The app (token `TOKEN`) served on 127.0.0.1 until the block ends."""
    import httpx
    import uvicorn

    from hydraplan.api.service.app import create_app
    from hydraplan.api.service.settings import Settings

    settings = Settings(api_token=TOKEN, log_level="WARNING", max_concurrent_solves=2, max_queued_solves=4)
    shim = Shed503(create_app(settings), shed=shed)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(shim, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="runtime-test-service", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the test service did not start"
        time.sleep(0.05)
    try:
        yield RunningService(url, shim)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
