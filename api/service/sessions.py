"""Planning sessions of a training job: fixed cluster, costs and options; one call per step.

A session remembers its last plan's id and strategy; the strategy is the planner's
`previous_strategy`, so a strategy switch is costed. The record lives in the store with an idle
TTL that every request on the session restarts, and in the `sessions` registry that caps how many
are live (507 when full). A per-session lock (a lease, `api.service.leases`) makes concurrent
plan calls on one session a 409 instead of a race on "the previous plan"; it lives as long as its
request, plus at most `lease_ttl_s` if the worker holding it dies.

The closed loop (issue 31, `api.service.session_loop`): measurements posted on a session refit its
profile into a new version; each plan is made with the version current when it starts and names
it (`Plan.session_feedback`), with the capacities lowered and error jumps since the previous plan.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

from hydraplan.api.service.leases import Heartbeat
from hydraplan.api.service.loop_schemas import MeasurementsBody, SessionFit
from hydraplan.api.service.planning import Cancel, Planning
from hydraplan.api.service.problems import conflict, not_found, storage_full, unprocessable
from hydraplan.api.service.schemas import SessionBody, SessionRecord, SessionView
from hydraplan.api.service.session_loop import SessionLoop, fit_view
from hydraplan.api.service.settings import Settings
from hydraplan.api.service.store import Store, StoreUnavailable
from hydraplan.api.service.tenants import admit, current_tenant_var, forget, tenant_registry
from hydraplan.cost_models.online_fit import OnlineFitState, feedback, profile_at
from hydraplan.planner.build import identified
from hydraplan.planner.errors import PlanningError
from hydraplan.planner.schemas import Plan, PlanRequest

SESSIONS_REGISTRY = "sessions"


def session_key(session_id: str) -> str:
    return f"session:{session_id}"


def session_lock_key(session_id: str) -> str:
    return f"session-lock:{session_id}"


def session_location(session_id: str) -> str:
    return f"/v1/sessions/{session_id}"


class Sessions:
    """Create, read, delete and plan within sessions."""

    def __init__(self, settings: Settings, store: Store, planning: Planning) -> None:
        self._settings = settings
        self._store = store
        self._planning = planning
        self._locks = Heartbeat(store, settings.lease_ttl_s, "hydraplan-session-locks")
        self._loop = SessionLoop(settings, store, planning.metrics, self._locks)

    def check(self, body: SessionBody) -> None:
        """Validate a new session's configuration: the cost source resolves now (404/422). CPU
        work (an analytic profile), so the route runs it in the solver pool."""
        planning = self._planning
        planning.check_limits(0, body.num_gpus, body.options)
        planning.check_baselines(body.baselines)
        PlanRequest(
            lengths=[1],
            num_gpus=body.num_gpus,
            gpus_per_node=body.gpus_per_node,
            options=body.options,
        )
        planning.profile_for(body, body.num_gpus, body.gpus_per_node)

    def create(self, body: SessionBody) -> SessionRecord:
        """Store a new session (configuration passed by `check`); 507 when `max_sessions` live."""
        now = datetime.now(UTC)
        record = SessionRecord(
            session_id="ses-" + secrets.token_hex(12),
            created_at=now,
            last_used_at=now,
            config=body,
            owner=current_tenant_var.get().name,
        )
        settings = self._settings
        refused = admit(
            self._store,
            current_tenant_var.get(),
            SESSIONS_REGISTRY,
            record.session_id,
            settings.session_idle_timeout_s,
            settings.max_sessions,
            settings.max_sessions_per_tenant,
        )
        if refused is not None:
            holder = (
                f"tenant {record.owner!r} keeps at most {settings.max_sessions_per_tenant}"
                if refused == "tenant"
                else f"this server keeps at most {settings.max_sessions}"
            )
            raise storage_full(
                f"{holder} live sessions; delete finished ones (DELETE /v1/sessions/{{id}}) or wait for idle "
                "ones to expire"
            )
        try:
            self._save(record)
        except StoreUnavailable:  # not created: it takes no place in the cap
            forget(self._store, record.owner, SESSIONS_REGISTRY, record.session_id)
            raise
        return record

    def get(self, session_id: str) -> SessionRecord:
        """The session (its idle timer restarts); 404 when unknown or expired, or another
        tenant's (unless the caller is an admin)."""
        text = self._store.get(session_key(session_id))
        record = None if text is None else SessionRecord.model_validate_json(text)
        if record is None or not current_tenant_var.get().may_see(record.owner):
            raise not_found(f"session {session_id!r} is unknown or expired")
        idle_s = self._settings.session_idle_timeout_s
        self._store.expire(session_key(session_id), idle_s)
        self._loop.renew(session_id)
        self._store.admit(SESSIONS_REGISTRY, session_id, idle_s, self._settings.max_sessions)  # renews it
        if record.owner is not None and self._settings.max_sessions_per_tenant is not None:
            own = tenant_registry(SESSIONS_REGISTRY, record.owner)
            self._store.admit(own, session_id, idle_s, self._settings.max_sessions_per_tenant)
        return record

    def delete(self, session_id: str) -> None:
        record = self.get(session_id)  # 404 for another tenant's
        forget(self._store, record.owner, SESSIONS_REGISTRY, session_id)
        self._loop.forget(session_id)
        if not self._store.delete(session_key(session_id)):
            raise not_found(f"session {session_id!r} is unknown or expired")

    def close(self) -> None:
        """Stop renewing session locks (a request still running keeps its lock for lease_ttl_s)."""
        self._locks.stop()

    def view(self, record: SessionRecord) -> SessionView:
        return SessionView(
            session_id=record.session_id,
            created_at=record.created_at,
            last_used_at=record.last_used_at,
            idle_timeout_s=self._settings.session_idle_timeout_s,
            num_plans=record.num_plans,
            last_plan_id=record.last_plan_id,
            last_strategy=record.last_strategy,
            config=record.config,
            fit=fit_view(self._loop.state(record.session_id)),
        )

    def record_measurements(self, session_id: str, body: MeasurementsBody) -> SessionFit:
        """Refit the session's profile with one step's measurements (CPU: in the solver pool)."""
        config = self.get(session_id).config
        profile = self._planning.profile_for(config, config.num_gpus, config.gpus_per_node)
        return fit_view(self._loop.record(session_id, profile, body))

    def plan(self, session_id: str, batches: list[list[int]], cancel: Cancel | None = None) -> list[Plan]:
        """Plan `batches` in order, each with the previous plan as context; store the last."""
        self.get(session_id)
        lock_key = session_lock_key(session_id)
        if self._locks.acquire(lock_key) is None:
            raise conflict(f"session {session_id!r} is already planning a batch; retry when it returns")
        try:
            record = self.get(session_id)  # re-read under the lock: the previous plan is current
            state = self._loop.state(session_id)  # the last stored version plans, whatever is refitting
            plans = self._plan_batches(record, state, batches, cancel)
            self._save(
                record.model_copy(
                    update={
                        "num_plans": record.num_plans + len(plans),
                        "last_plan_id": plans[-1].plan_id,
                        "last_strategy": plans[-1].strategy,
                        "last_profile_version": state.version,
                        "last_used_at": datetime.now(UTC),
                    }
                )
            )
            return plans
        finally:
            self._locks.release(lock_key)

    def _plan_batches(
        self, record: SessionRecord, state: OnlineFitState, batches: list[list[int]], cancel: Cancel | None
    ) -> list[Plan]:
        config = record.config
        profile = profile_at(state, self._planning.profile_for(config, config.num_gpus, config.gpus_per_node))
        since_version = record.last_profile_version
        previous = record.last_strategy
        plans: list[Plan] = []
        for index, lengths in enumerate(batches):
            request = PlanRequest(
                lengths=lengths,
                num_gpus=config.num_gpus,
                gpus_per_node=config.gpus_per_node,
                options=config.options,
                previous_strategy=previous,
                rank_slowdowns=session_slowdowns(state, config.num_gpus),
            )
            try:
                plan = self._planning.solve(request, profile, config.baselines, cancel=cancel, origin="session")
            except PlanningError as exc:
                where = ("body", "batches", index) if len(batches) > 1 else ("body", "lengths")
                prefix = f"batches[{index}]: " if len(batches) > 1 else ""
                raise unprocessable(prefix + " ".join(str(exc).split()), where) from None
            plans.append(identified(plan.model_copy(update={"session_feedback": feedback(state, since_version)})))
            previous = plan.strategy
            since_version = state.version  # the next batch's plan reports only what is newer
        return plans

    def _save(self, record: SessionRecord) -> None:
        self._store.set(
            session_key(record.session_id),
            record.model_dump_json(),
            self._settings.session_idle_timeout_s,
        )


def session_slowdowns(state: OnlineFitState, num_gpus: int) -> dict[int, float] | None:
    """The slow ranks the session's fit holds (of this cluster), as a request's `rank_slowdowns`;
    None when there are none (the plan is then the one made without any)."""
    slow = {rank: factor for rank, factor in state.rank_slowdowns.items() if rank < num_gpus}
    return slow or None
