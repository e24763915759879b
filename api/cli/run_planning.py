"""What `hydraplan run` hands its rank 0 when no plan file is given: a batch source and a planner.

The runtime asks them step after step (`runtime/plan_feed.py`): `next_lengths(step)` gives the
step's global batch, `planner.plan(lengths, previous)` its plan. Both are small picklable values
(they travel to a spawned rank 0) that build what they need when called.

- `SyntheticLengths`: deterministic long-tailed batch lengths by (seed, step); the tokens then
  come from the runtime's synthetic data (`runtime/step_data.py`).
- `LocalPlanner`: `planner.solve` in rank 0's process, the previous plan as the switch context;
  `record(body)` refits its profile in-process with each step's measurements
  (`cost_models.online_fit.apply_step`, the session's refit), so the next plan uses the new
  version and says, as a session's plans do, which capacities were lowered and which error jumps
  came since the previous plan (`plan.session_feedback`).
- `SessionPlanner`: a planning session of `hydraplan serve` (`POST /v1/sessions/{id}/plans`,
  which keeps the previous plan's strategy as the switch context itself; `record(body)` posts a
  step's measurements to `/v1/sessions/{id}/measurements`, at most `MEASUREMENT_RETRIES` 503s
  waited out), through
  `api.client.Client`: a 503's `Retry-After` waited out at most `max_retries` times, each wait
  capped at `max_retry_wait_s`, each request at `timeout_s`, so rank 0 never waits unboundedly;
  every other answer than a plan becomes one line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hydraplan.planner.schemas import CostProfile, Plan, PlanRequest, SolverOptions

__all__ = [
    "LocalPlanner",
    "SessionPlanner",
    "SyntheticLengths",
    "close_session",
    "measured_pipelines",
    "open_session",
]

MEASUREMENT_RETRIES = 2  # a step's measurements wait out fewer 503s than a plan: training goes on
KEEP_GOING_STATUSES = (409, 429)  # a busy session or tenant: skip this step's measurements, no bug


@dataclass(frozen=True)
class SyntheticLengths:
    """`num_sequences` lengths per step, log-uniform in [1, max_length] (a long tail: most
    sequences short, a few near the maximum), drawn from `(seed, step)` alone."""

    num_sequences: int
    max_length: int
    seed: int = 0

    def __call__(self, step: int) -> list[int]:
        import numpy as np

        generator = np.random.default_rng([self.seed, step])
        draws = generator.uniform(0.0, math.log(self.max_length + 1), self.num_sequences)
        return [int(min(self.max_length, max(1, math.floor(math.exp(x))))) for x in draws]


@dataclass(frozen=True)
class DocumentLengths:
    """With `--data`: step k's batch is the `num_sequences` documents from `start + k *
    num_sequences` of the token directory at `path` (a document of n tokens is a sequence of n - 1),
    the same documents the ranks then train on (`runtime.data_feed.StepFeed`)."""

    path: str
    start: int
    num_sequences: int

    def __call__(self, step: int) -> list[int]:
        from hydraplan.runtime.token_data import TokenDirectory

        data = TokenDirectory.open(self.path)
        first = self.start + step * self.num_sequences
        if first + self.num_sequences > data.num_documents:
            raise ValueError(
                f"--data {self.path}: step {step} needs documents {first}..{first + self.num_sequences - 1}, "
                f"it holds {data.num_documents}"
            )
        return data.sequence_lengths(first, self.num_sequences)


@dataclass
class LocalPlanner:
    """The planner run where rank 0 runs; `profile_json` and `options_json` are the JSON of a
    `CostProfile` and `SolverOptions`. `fit` is its closed loop's state (`record`)."""

    profile_json: str
    num_gpus: int
    gpus_per_node: int
    options_json: str
    fit: Any = field(default=None, compare=False, repr=False)  # an `OnlineFitState` once recorded

    def plan(self, lengths: Sequence[int], previous: Plan | None) -> Plan:
        from hydraplan.cost_models.online_fit import OnlineFitState, feedback, profile_at
        from hydraplan.planner.build import identified
        from hydraplan.planner.solve import solve

        request = PlanRequest(
            lengths=list(lengths),
            num_gpus=self.num_gpus,
            gpus_per_node=self.gpus_per_node,
            options=SolverOptions.model_validate_json(self.options_json),
            previous_strategy=previous.strategy if previous is not None else None,
            # the slow ranks the in-process fit holds, as a session's plans carry them
            rank_slowdowns={r: f for r, f in self.fit.rank_slowdowns.items() if r < self.num_gpus} or None
            if self.fit is not None
            else None,
        )
        state = self.fit or OnlineFitState()
        plan = solve(request, profile_at(state, CostProfile.model_validate_json(self.profile_json)))
        if self.fit is None:  # never measured: the plan the planner alone makes
            return plan
        # as a session's plans: the capacities lowered and error jumps since the previous plan's version
        since = previous.session_feedback.profile_version if previous and previous.session_feedback else 0
        return identified(plan.model_copy(update={"session_feedback": feedback(state, since)}))

    def record(self, body: dict) -> dict:
        """Refit the profile with one step's measurements (a `runtime.step_measurements` body);
        the fit as the service shows it (`version`, `num_steps`, `errors`)."""
        from hydraplan.cost_models.online_fit import OnlineFitState, apply_step

        state = self.fit or OnlineFitState()
        profile = CostProfile.model_validate_json(self.profile_json)
        version = body.get("profile_version", state.version)
        self.fit = apply_step(state, profile, measured_pipelines(body), version)
        return {
            "version": self.fit.version,
            "num_steps": self.fit.num_steps,
            "errors": [error.model_dump(mode="json") for error in self.fit.errors[-1:]],
        }


def measured_pipelines(body: dict) -> list:
    """The refit's pipelines (`cost_models.online_fit.MeasuredPipeline`) of a measurements body."""
    from hydraplan.cost_models.online_fit import MeasuredMicroBatch, MeasuredPipeline

    pipelines = []
    for pipeline in body["pipelines"]:
        scheme = pipeline["scheme"]
        micro_batches = tuple(
            MeasuredMicroBatch(float(mb["sum_sq_tokens"]), float(mb["num_tokens"]), mb["time_s"], mb.get("fwd_s"))
            for mb in pipeline["micro_batches"]
        )
        peaks = pipeline.get("peak_memory_bytes")
        pipelines.append(
            MeasuredPipeline(
                (scheme["tp"], scheme["pp"], scheme["cp"]),
                micro_batches,
                max(peaks) if peaks else None,
                tuple(pipeline.get("ranks") or ()),
                pipeline.get("predicted_s"),
                pipeline.get("slowdown") or 1.0,
                tuple(pipeline.get("rank_compute_s") or ()),
                tuple(pipeline.get("rank_work") or ()),
            )
        )
    return pipelines


@dataclass(frozen=True)
class SessionPlanner:
    """One session of a planning service at `url` (`open_session` made it)."""

    url: str
    session_id: str
    token: str | None = None
    timeout_s: float = 60.0
    max_retries: int = 5
    max_retry_wait_s: float = 30.0

    def plan(self, lengths: Sequence[int], previous: Plan | None) -> Plan:
        """The session's plan of `lengths` (`previous` is already the session's context)."""
        from hydraplan.api.client import ServiceError, Session

        with self._client() as client:
            try:
                return Session(client, self.session_id).plan(lengths)
            except ServiceError as exc:
                raise RuntimeError(f"{self.url}: {describe_service_error(exc)}") from None

    def record(self, body: dict) -> dict:
        """POST one step's measurements (a `runtime.step_measurements` body); the session's fit.
        A 4xx other than 409/429 raises `MeasurementsRefused` (a malformed body: a bug to show);
        anything else that is not a fit raises `RuntimeError` (the run reports and goes on)."""
        from hydraplan.api.client import ServiceError, Session
        from hydraplan.runtime.plan_feed import MeasurementsRefused

        with self._client(max_retries=min(self.max_retries, MEASUREMENT_RETRIES)) as client:
            try:
                return Session(client, self.session_id).post_measurements(
                    body["pipelines"], profile_version=body.get("profile_version"), collectives=body["collectives"]
                )
            except ServiceError as exc:
                line = f"{self.url}: {describe_service_error(exc)}"
                if exc.status and 400 <= exc.status < 500 and exc.status not in KEEP_GOING_STATUSES:
                    raise MeasurementsRefused(line) from None
                raise RuntimeError(line) from None

    def _client(self, max_retries: int | None = None):
        from hydraplan.api.client import Client

        return Client(
            self.url,
            token=self.token,
            timeout_s=self.timeout_s,
            max_retries=self.max_retries if max_retries is None else max_retries,
            max_retry_wait_s=self.max_retry_wait_s,
        )


def describe_service_error(exc) -> str:
    """One line of a `ServiceError`: status, title, detail and the field the service named."""
    text = " ".join(str(exc).split()) if exc.status else f"no answer: {' '.join(exc.detail.split())}"
    return f"{text} (field {exc.field})" if exc.field else text


def open_session(planner: SessionPlanner, body: dict[str, Any]) -> SessionPlanner:
    """`POST /v1/sessions` with `body` (cluster, cost source, options); the planner of the new
    session. A refusal raises `ValueError` with one line naming the server."""
    from hydraplan.api.client import ServiceError

    with planner._client() as client:
        try:
            session = client.open_session(**body)
        except ServiceError as exc:
            raise ValueError(f"--server {planner.url}: {describe_service_error(exc)}") from None
    return SessionPlanner(
        planner.url, session.session_id, planner.token, planner.timeout_s, planner.max_retries, planner.max_retry_wait_s
    )


def close_session(planner: SessionPlanner) -> None:
    """`DELETE` the session (best effort: an expired or unreachable session is left to its TTL)."""
    from hydraplan.api.client import ServiceError, Session

    with planner._client() as client:
        try:
            Session(client, planner.session_id).close()
        except ServiceError:
            pass
