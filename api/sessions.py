"""Planning sessions of a training job: fixed cluster, costs and options; one call per step.

A session remembers its last plan, which the planner receives as `previous_plan` to cost a
strategy switch. The record lives in the store with an idle TTL that every request on the session
restarts. A per-session lock in the store (set-if-absent) makes concurrent plan calls on one
session a 409 instead of a race on "the previous plan".
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

from hydraplan.api.planning import Cancel, Planning
from hydraplan.api.problems import conflict, not_found, unprocessable
from hydraplan.api.schemas import SessionBody, SessionRecord, SessionView
from hydraplan.api.settings import Settings
from hydraplan.api.store import Store
from hydraplan.planner.errors import PlanningError
from hydraplan.planner.schemas import Plan, PlanRequest

# A lock outlives its call by this much at most if the worker holding it dies.
LOCK_MARGIN_S = 60.0


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

    def create(self, body: SessionBody) -> SessionRecord:
        """Validate the configuration (the cost source resolves now: 404/422) and store it."""
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
        now = datetime.now(UTC)
        record = SessionRecord(session_id="ses-" + secrets.token_hex(12), created_at=now, last_used_at=now, config=body)
        self._save(record)
        return record

    def get(self, session_id: str) -> SessionRecord:
        """The session (its idle timer restarts); 404 when unknown or expired."""
        text = self._store.get(session_key(session_id))
        if text is None:
            raise not_found(f"session {session_id!r} is unknown or expired")
        self._store.expire(session_key(session_id), self._settings.session_idle_timeout_s)
        return SessionRecord.model_validate_json(text)

    def delete(self, session_id: str) -> None:
        if not self._store.delete(session_key(session_id)):
            raise not_found(f"session {session_id!r} is unknown or expired")

    def view(self, record: SessionRecord) -> SessionView:
        last = record.last_plan
        return SessionView(
            session_id=record.session_id,
            created_at=record.created_at,
            last_used_at=record.last_used_at,
            idle_timeout_s=self._settings.session_idle_timeout_s,
            num_plans=record.num_plans,
            last_plan_id=last.plan_id if last else None,
            last_strategy=last.strategy if last else None,
            config=record.config,
        )

    def plan(self, session_id: str, batches: list[list[int]], cancel: Cancel | None = None) -> list[Plan]:
        """Plan `batches` in order, each with the previous plan as context; store the last."""
        record = self.get(session_id)
        config = record.config
        lock_ttl_s = config.options.time_limit_s * len(batches) + LOCK_MARGIN_S
        lock_key, owner = session_lock_key(session_id), secrets.token_hex(8)
        if not self._store.set(lock_key, owner, lock_ttl_s, only_if_absent=True):
            raise conflict(f"session {session_id!r} is already planning a batch; retry when it returns")
        try:
            record = self.get(session_id)  # re-read under the lock: the previous plan is current
            plans = self._plan_batches(record, batches, cancel)
            self._save(
                record.model_copy(
                    update={
                        "num_plans": record.num_plans + len(plans),
                        "last_plan": plans[-1],
                        "last_used_at": datetime.now(UTC),
                    }
                )
            )
            return plans
        finally:
            self._store.delete_if_equal(lock_key, owner)

    def _plan_batches(self, record: SessionRecord, batches: list[list[int]], cancel: Cancel | None) -> list[Plan]:
        config = record.config
        profile = self._planning.profile_for(config, config.num_gpus, config.gpus_per_node)
        previous = record.last_plan
        plans: list[Plan] = []
        for index, lengths in enumerate(batches):
            request = PlanRequest(
                lengths=lengths,
                num_gpus=config.num_gpus,
                gpus_per_node=config.gpus_per_node,
                options=config.options,
            )
            try:
                previous = self._planning.solve(request, profile, config.baselines, previous, cancel, origin="session")
            except PlanningError as exc:
                where = ("body", "batches", index) if len(batches) > 1 else ("body", "lengths")
                prefix = f"batches[{index}]: " if len(batches) > 1 else ""
                raise unprocessable(prefix + " ".join(str(exc).split()), where) from None
            plans.append(previous)
        return plans

    def _save(self, record: SessionRecord) -> None:
        self._store.set(
            session_key(record.session_id),
            record.model_dump_json(),
            self._settings.session_idle_timeout_s,
        )
