"""A session's closed loop (issue 31): measurements in, a refitted and versioned profile out.

The fit state (`cost_models.online_fit.OnlineFitState`) lives in the store beside the session
record, under its own key with the same idle TTL, so a plan call (which rewrites the record) and a
measurements post (which rewrites the state) never overwrite each other. A plan reads the state
once, at its start, and plans with the profile of that version: a refit never blocks planning,
and planning always uses the last stored, whole version. Two concurrent posts on one session get
409 for the second, as plan calls do (a lease of its own, `session-fit-lock:{id}`).
"""

from __future__ import annotations

from hydraplan.api.service.leases import Heartbeat
from hydraplan.api.service.loop_schemas import MeasurementsBody, SchemeRefit, SessionFit, SharedScales
from hydraplan.api.service.metrics import Metrics
from hydraplan.api.service.problems import conflict, unprocessable
from hydraplan.api.service.settings import Settings
from hydraplan.api.service.store import Store
from hydraplan.cost_models.online_fit import (
    MeasuredMicroBatch,
    MeasuredPipeline,
    OnlineFitState,
    apply_step,
    scheme_name,
    shared_activation_scale,
)
from hydraplan.planner.schemas import CostProfile


def fit_key(session_id: str) -> str:
    return f"session-fit:{session_id}"


def fit_lock_key(session_id: str) -> str:
    return f"session-fit-lock:{session_id}"


class SessionLoop:
    """Read, update and show the fit state of sessions."""

    def __init__(self, settings: Settings, store: Store, metrics: Metrics, locks: Heartbeat) -> None:
        self._settings = settings
        self._store = store
        self._metrics = metrics
        self._locks = locks

    def state(self, session_id: str) -> OnlineFitState:
        """The session's fit state (version 0 before any measurement)."""
        text = self._store.get(fit_key(session_id))
        return OnlineFitState() if text is None else OnlineFitState.model_validate_json(text)

    def renew(self, session_id: str) -> None:
        self._store.expire(fit_key(session_id), self._settings.session_idle_timeout_s)

    def forget(self, session_id: str) -> None:
        self._store.delete(fit_key(session_id))

    def record(self, session_id: str, profile: CostProfile, body: MeasurementsBody) -> OnlineFitState:
        """Apply one step's measurements (CPU: the route runs it in the solver pool). 422 for a
        scheme the profile lacks or an unknown version, 409 while another post on the session runs;
        nothing is stored unless the whole step is accepted."""
        pipelines = measured_pipelines(body, profile)
        lock_key = fit_lock_key(session_id)
        if self._locks.acquire(lock_key) is None:
            raise conflict(f"session {session_id!r} is already recording measurements; retry when it returns")
        try:
            state = self.state(session_id)
            version = state.version if body.profile_version is None else body.profile_version
            try:
                updated = apply_step(state, profile, pipelines, version)
            except ValueError as exc:
                raise unprocessable(f"profile_version: {exc}", ("body", "profile_version")) from None
            self._store.set(fit_key(session_id), updated.model_dump_json(), self._settings.session_idle_timeout_s)
        finally:
            self._locks.release(lock_key)
        self._observe(state, updated)
        return updated

    def _observe(self, before: OnlineFitState, after: OnlineFitState) -> None:
        if after.errors and after.errors[-1].step > before.num_steps:
            self._metrics.session_fit_error.observe(after.errors[-1].median_error)
        for change in after.capacity_changes:
            if change.version > before.version:
                self._metrics.session_capacity_lowered.labels(reason=change.reason).inc()
        self._metrics.session_error_jumps.inc(sum(1 for event in after.drift if event.step > before.num_steps))
        newly_slow = set(after.rank_slowdowns) - set(before.rank_slowdowns)
        if newly_slow:
            self._metrics.session_slow_ranks.inc(len(newly_slow))
        for factor in after.rank_slowdowns.values():
            self._metrics.session_rank_slowdown.observe(factor)


def measured_pipelines(body: MeasurementsBody, profile: CostProfile) -> list[MeasuredPipeline]:
    """The body's pipelines as the refit takes them; 422 naming a scheme the profile lacks."""
    known = {entry.key for entry in profile.schemes}
    pipelines = []
    for index, pipeline in enumerate(body.pipelines):
        scheme = pipeline.scheme
        key = scheme.scheme.key
        if key not in known:
            raise unprocessable(
                f"pipelines[{index}].scheme: {scheme_name(key)} is not a scheme of the session's profile",
                ("body", "pipelines", index, "scheme"),
            )
        micro_batches = tuple(
            MeasuredMicroBatch(float(mb.sum_sq_tokens), float(mb.num_tokens), mb.time_s, mb.fwd_s)
            for mb in pipeline.micro_batches
        )
        peak = None if pipeline.peak_memory_bytes is None else max(pipeline.peak_memory_bytes)
        ranks = tuple(pipeline.ranks or ())
        slowdown = 1.0 if pipeline.slowdown is None else pipeline.slowdown
        computes, work = tuple(pipeline.rank_compute_s or ()), tuple(pipeline.rank_work or ())
        pipelines.append(
            MeasuredPipeline(key, micro_batches, peak, ranks, pipeline.predicted_s, slowdown, computes, work)
        )
    return pipelines


def fit_view(state: OnlineFitState) -> SessionFit:
    """What GET /v1/sessions/{id} shows of the fit."""
    schemes = [
        SchemeRefit(
            scheme=scheme_name(window.current.key),
            a=window.current.a,
            b=window.current.b,
            c=window.current.c,
            fwd_fraction=window.current.fwd_fraction,
            prior_a=window.prior.a,
            prior_b=window.prior.b,
            prior_c=window.prior.c,
            capacity_tokens=window.capacity_tokens,
            activation_scale=window.activation_scale,
            extra_static_bytes=window.extra_static_bytes,
            num_micro_batches=len(window.rows),
        )
        for window in state.schemes
    ]
    return SessionFit(
        version=state.version,
        num_steps=state.num_steps,
        schemes=schemes,
        shared_scales=SharedScales(
            a=state.shared[0], b=state.shared[1], c=state.shared[2], activation_bytes=shared_activation_scale(state)
        ),
        errors=state.errors,
        capacity_changes=state.capacity_changes,
        error_jumps=state.drift,
        last_error_jump=state.drift[-1] if state.drift else None,
        rank_slowdowns=state.rank_slowdowns,
    )
