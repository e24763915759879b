"""Typed clients of the REST service: `Client` (blocking) and `AsyncClient` (asyncio), over httpx.

Both speak the same protocol (`_Protocol`: the request of each call and the reading of its
answer); only the sending differs. A 503 with `Retry-After` (a saturated server, a store outage)
is retried after the time the server asks, capped at `max_retry_wait_s` a wait, at most
`max_retries` times; any other error, and a 503 past its retries, raises `ServiceError` with the
problem+json fields, the offending field's location first. Results are the planner's own types
(`Plan`, `CostProfile`), validated as they arrive.

    from hydraplan import Client

    with Client("http://127.0.0.1:8000", token="...") as client:
        session = client.open_session(num_gpus=8, model="tiny", gpu="h100-sxm-80gb")
        plan = session.plan([4096, 1024, 512])
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from hydraplan.planner.schemas import CostProfile, Plan, integer_list

DEFAULT_URL = "http://127.0.0.1:8000"
PROBLEM_MEDIA_TYPE = "application/problem+json"


class ServiceError(Exception):
    """An error answer of the service (RFC 9457 problem+json), or no answer at all (status 0)."""

    def __init__(self, status: int, detail: str, problem: dict[str, Any] | None = None) -> None:
        problem = problem or {}
        self.status = status
        self.detail = detail
        self.title = str(problem.get("title", ""))
        self.type = str(problem.get("type", ""))
        self.request_id = problem.get("request_id")
        self.errors: list[dict[str, Any]] = list(problem.get("errors") or [])
        super().__init__(f"{status} {self.title}: {detail}" if self.title else f"{status}: {detail}")

    @property
    def field(self) -> str | None:
        """The first offending field, dotted (`body.lengths.3`), when the service named one."""
        if not self.errors:
            return None
        return ".".join(str(part) for part in self.errors[0].get("loc", ()))


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    body: Any = None
    params: dict[str, Any] | None = None


@dataclass
class _Protocol:
    """What both clients share: headers, retry policy, and the reading of answers."""

    token: str | None
    max_retries: int
    max_retry_wait_s: float
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.token:
            self.headers["Authorization"] = f"Bearer {self.token}"

    def retry_after_s(self, response: httpx.Response, attempt: int) -> float | None:
        """Seconds to wait before the next attempt, or None when the answer is final."""
        if response.status_code != 503 or attempt >= self.max_retries:
            return None
        try:
            asked = float(response.headers.get("Retry-After", "1"))
        except ValueError:
            asked = 1.0
        return min(max(asked, 0.0), self.max_retry_wait_s)

    @staticmethod
    def read(response: httpx.Response) -> Any:
        """The JSON body of a success (None for 204), or `ServiceError` for an error."""
        if response.is_success:
            return None if response.status_code == 204 or not response.content else response.json()
        problem: dict[str, Any] = {}
        if response.headers.get("content-type", "").startswith(PROBLEM_MEDIA_TYPE):
            problem = response.json()
        detail = str(problem.get("detail") or response.text[:200] or response.reason_phrase)
        raise ServiceError(response.status_code, detail, problem)


def _plan_body(lengths: Sequence[int], config: dict[str, Any]) -> dict[str, Any]:
    return {"lengths": integer_list(lengths), **_without_none(config)}


def _without_none(values: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def _as_json(value: Any) -> Any:
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


class _ClientBase:
    """The settings both clients take; `http` replaces the httpx client they would make."""

    _http_class: type[httpx.Client] | type[httpx.AsyncClient]

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 5,
        max_retry_wait_s: float = 30.0,
        http: httpx.Client | httpx.AsyncClient | None = None,
    ) -> None:
        self._protocol = _Protocol(token, max_retries, max_retry_wait_s)
        self._http: Any = http or self._http_class(base_url=base_url, timeout=timeout_s)


class Client(_ClientBase):
    """The blocking client; use it as a context manager or call `close()`."""

    _http_class = httpx.Client

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: _Call) -> Any:
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    call.method, call.path, json=call.body, params=call.params, headers=self._protocol.headers
                )
            except httpx.HTTPError as exc:
                raise ServiceError(0, f"{call.method} {call.path}: {exc}") from exc
            wait_s = self._protocol.retry_after_s(response, attempt)
            if wait_s is None:
                return self._protocol.read(response)
            time.sleep(wait_s)
            attempt += 1

    # -- plans --------------------------------------------------------------------------------

    def plan(self, lengths: Sequence[int], **config: Any) -> Plan:
        """POST /v1/plans: `config` holds the body's other fields (num_gpus, model, gpu or
        profile / profile_id, gpus_per_node, options, previous_strategy, baselines)."""
        return Plan.model_validate(self._send(_Call("POST", "/v1/plans", _plan_body(lengths, _jsonable(config)))))

    def check(self, plan: Plan | dict[str, Any], **request: Any) -> dict[str, Any]:
        """POST /v1/plans/check: `{"valid": ..., "violations": [...]}`."""
        return self._send(_Call("POST", "/v1/plans/check", {"plan": _as_json(plan), **_jsonable(request)}))

    def estimate(self, lengths: Sequence[int], **config: Any) -> dict[str, Any]:
        """POST /v1/estimate (give `strategy` or `baseline` in `config`)."""
        return self._send(_Call("POST", "/v1/estimate", _plan_body(lengths, _jsonable(config))))

    def upload_profile(self, profile: CostProfile | dict[str, Any]) -> str:
        """POST /v1/profiles; the id to give as `profile_id`."""
        return self._send(_Call("POST", "/v1/profiles", _as_json(profile)))["profile_id"]

    # -- sessions and jobs ----------------------------------------------------------------------

    def open_session(self, **config: Any) -> Session:
        """POST /v1/sessions with the training job's cluster, cost source and options."""
        view = self._send(_Call("POST", "/v1/sessions", _without_none(_jsonable(config))))
        return Session(self, view["session_id"])

    def submit_job(self, body: dict[str, Any]) -> str:
        """POST /v1/jobs (`{"kind": "plan", "request": ...}` or a sweep); the job id."""
        return self._send(_Call("POST", "/v1/jobs", _jsonable(body)))["job_id"]

    def job(self, job_id: str) -> dict[str, Any]:
        return self._send(_Call("GET", f"/v1/jobs/{job_id}"))

    def cancel_job(self, job_id: str) -> dict[str, Any] | None:
        """DELETE the job: a queued or running one is cancelled (its view comes back, a running
        solve keeps its best plan); a finished one is deleted with its results (None)."""
        return self._send(_Call("DELETE", f"/v1/jobs/{job_id}"))

    def wait_for_job(self, job_id: str, *, timeout_s: float = 600.0, poll_s: float = 0.5) -> dict[str, Any]:
        """Poll until the job has finished; `TimeoutError` after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            view = self.job(job_id)
            if view["status"] in ("succeeded", "failed", "cancelled"):
                return view
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {view['status']} after {timeout_s:g} s")
            time.sleep(poll_s)


@dataclass(frozen=True)
class Session:
    """A planning session of a training job: the previous plan is the next one's context."""

    client: Client
    session_id: str

    @property
    def path(self) -> str:
        return f"/v1/sessions/{self.session_id}"

    def plan(self, lengths: Sequence[int]) -> Plan:
        body = {"lengths": integer_list(lengths)}
        return Plan.model_validate(self.client._send(_Call("POST", f"{self.path}/plans", body)))

    def plan_batches(self, batches: Sequence[Sequence[int]]) -> list[Plan]:
        body = {"batches": [integer_list(batch) for batch in batches]}
        answer = self.client._send(_Call("POST", f"{self.path}/plans", body))
        return [Plan.model_validate(plan) for plan in answer["plans"]]

    def view(self) -> dict[str, Any]:
        return self.client._send(_Call("GET", self.path))

    def post_measurements(
        self,
        pipelines: Sequence[dict[str, Any]],
        *,
        profile_version: int | None = None,
        collectives: Sequence[dict[str, Any]] = (),
    ) -> dict[str, Any]:
        """POST /v1/sessions/{id}/measurements: one step's measurements (`pipelines` as the
        service documents them; `measured_micro_batch` builds a micro-batch's entry), with the
        `profile_version` of the plan the step ran (`plan.session_feedback.profile_version`).
        The session's fit comes back (`version`, `errors`, `capacity_changes`, ...), as the
        `fit` of `view()`."""
        body = _measurements_body(pipelines, profile_version, collectives)
        return self.client._send(_Call("POST", f"{self.path}/measurements", body))

    def close(self) -> None:
        self.client._send(_Call("DELETE", self.path))


class AsyncClient(_ClientBase):
    """The asyncio client (the same calls, awaited); `async with` it or `await aclose()`."""

    _http_class = httpx.AsyncClient

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: _Call) -> Any:
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    call.method, call.path, json=call.body, params=call.params, headers=self._protocol.headers
                )
            except httpx.HTTPError as exc:
                raise ServiceError(0, f"{call.method} {call.path}: {exc}") from exc
            wait_s = self._protocol.retry_after_s(response, attempt)
            if wait_s is None:
                return self._protocol.read(response)
            await asyncio.sleep(wait_s)
            attempt += 1

    async def plan(self, lengths: Sequence[int], **config: Any) -> Plan:
        body = _plan_body(lengths, _jsonable(config))
        return Plan.model_validate(await self._send(_Call("POST", "/v1/plans", body)))

    async def check(self, plan: Plan | dict[str, Any], **request: Any) -> dict[str, Any]:
        return await self._send(_Call("POST", "/v1/plans/check", {"plan": _as_json(plan), **_jsonable(request)}))

    async def estimate(self, lengths: Sequence[int], **config: Any) -> dict[str, Any]:
        return await self._send(_Call("POST", "/v1/estimate", _plan_body(lengths, _jsonable(config))))

    async def upload_profile(self, profile: CostProfile | dict[str, Any]) -> str:
        return (await self._send(_Call("POST", "/v1/profiles", _as_json(profile))))["profile_id"]

    async def open_session(self, **config: Any) -> str:
        """POST /v1/sessions; the session id (plan in it with `session_plan`)."""
        return (await self._send(_Call("POST", "/v1/sessions", _without_none(_jsonable(config)))))["session_id"]

    async def session_plan(self, session_id: str, lengths: Sequence[int]) -> Plan:
        body = {"lengths": integer_list(lengths)}
        return Plan.model_validate(await self._send(_Call("POST", f"/v1/sessions/{session_id}/plans", body)))

    async def session_measurements(
        self,
        session_id: str,
        pipelines: Sequence[dict[str, Any]],
        *,
        profile_version: int | None = None,
        collectives: Sequence[dict[str, Any]] = (),
    ) -> dict[str, Any]:
        """As `Session.post_measurements`."""
        body = _measurements_body(pipelines, profile_version, collectives)
        return await self._send(_Call("POST", f"/v1/sessions/{session_id}/measurements", body))

    async def close_session(self, session_id: str) -> None:
        await self._send(_Call("DELETE", f"/v1/sessions/{session_id}"))

    async def submit_job(self, body: dict[str, Any]) -> str:
        return (await self._send(_Call("POST", "/v1/jobs", _jsonable(body))))["job_id"]

    async def job(self, job_id: str) -> dict[str, Any]:
        return await self._send(_Call("GET", f"/v1/jobs/{job_id}"))

    async def cancel_job(self, job_id: str) -> dict[str, Any] | None:
        """As `Client.cancel_job`."""
        return await self._send(_Call("DELETE", f"/v1/jobs/{job_id}"))


def measured_micro_batch(lengths: Sequence[int], time_s: float, fwd_s: float | None = None) -> dict[str, Any]:
    """One micro-batch's entry of a measurements body: the stage-time model's features of its
    sequence `lengths` (tokens, sum of squared lengths) and its measured stage time (seconds)."""
    lengths = integer_list(lengths)
    entry: dict[str, Any] = {
        "num_tokens": sum(lengths),
        "sum_sq_tokens": sum(length * length for length in lengths),
        "time_s": float(time_s),
    }
    if fwd_s is not None:
        entry["fwd_s"] = float(fwd_s)
    return entry


def _measurements_body(
    pipelines: Sequence[dict[str, Any]], profile_version: int | None, collectives: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    body: dict[str, Any] = {  # a pipeline's values may be the planner's types (its plan's scheme)
        "pipelines": [
            _jsonable(pipeline) if isinstance(pipeline, dict) else _as_json(pipeline) for pipeline in pipelines
        ]
    }
    if profile_version is not None:
        body["profile_version"] = profile_version
    if collectives:
        body["collectives"] = [_as_json(collective) for collective in collectives]
    return body


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    """Pydantic values (a Plan as previous_plan, a CostProfile, SolverOptions) as JSON data."""
    return {key: _as_json(value) for key, value in values.items()}
