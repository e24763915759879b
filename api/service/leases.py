"""Leases: short-lived store keys that a live worker keeps renewing, so that state owned by a
worker that died (a session lock, a running job) is released within `ttl_s`, not after hours.

One `Heartbeat` thread per owner (the session service, the job runner) renews every lease it
holds every `ttl_s / 4`; a failed renewal (the store is down) is retried at the next beat. A store
that pauses for longer than `ttl_s` lets the lease expire although its owner is alive: the owner's
next beat finds it gone and takes it back (set-if-absent), unless someone else took it meanwhile.
So that a reader does not declare the owner dead in that window, `lease_lost` reports a lease
lost only once readers have seen it missing for a grace period (`ttl_s`), longer than a beat
takes to reclaim it. A lease is released by its owner only (delete-if-equal), never by a worker
that merely outlived it.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import tenacity

from hydraplan.api.service.store import Store, StoreUnavailable

logger = logging.getLogger("hydraplan.leases")
ResultT = TypeVar("ResultT")


class Heartbeat:
    """Holds leases (store key -> owner token) and renews them from one daemon thread."""

    def __init__(self, store: Store, ttl_s: float, name: str) -> None:
        self.ttl_s = ttl_s
        self._store = store
        self._name = name
        self._leases: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, key: str) -> str | None:
        """Take the lease `key` if nobody holds it; returns the owner token, None when taken."""
        owner = secrets.token_hex(8)
        if not self._store.set(key, owner, self.ttl_s, only_if_absent=True):
            return None
        self._hold(key, owner)
        return owner

    def grant(self, key: str) -> str:
        """Take the lease `key` unconditionally (a new job's, whose id nobody else knows)."""
        owner = secrets.token_hex(8)
        self._store.set(key, owner, self.ttl_s)
        self._hold(key, owner)
        return owner

    def release(self, key: str) -> None:
        """Stop renewing `key` and delete it if it is still ours (best effort: it expires anyway)."""
        with self._lock:
            owner = self._leases.pop(key, None)
        if owner is not None:
            try:
                self._store.delete_if_equal(key, owner)
            except StoreUnavailable:
                logger.warning("could not release lease %s; it expires in %.0f s", key, self.ttl_s)

    def drop(self, key: str) -> None:
        """Stop renewing `key` without touching the store: it expires within `ttl_s`."""
        with self._lock:
            self._leases.pop(key, None)

    def held(self) -> list[str]:
        with self._lock:
            return list(self._leases)

    def stop(self) -> None:
        """Stop renewing every lease (they expire within `ttl_s`)."""
        self._stop.set()
        with self._lock:
            self._leases.clear()

    def _hold(self, key: str, owner: str) -> None:
        with self._lock:
            self._leases[key] = owner
            if self._thread is None or not self._thread.is_alive():
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._beat, args=(self._stop,), name=self._name, daemon=True)
                self._thread.start()

    def _beat(self, stop: threading.Event) -> None:
        while not stop.wait(self.ttl_s / 4):
            with self._lock:
                leases = list(self._leases.items())
            for key, owner in leases:
                try:
                    if not self._store.renew_if_equal(key, owner, self.ttl_s):
                        self._reclaim(key, owner)
                except StoreUnavailable:
                    logger.warning("could not renew lease %s; retrying at the next beat", key)

    def _reclaim(self, key: str, owner: str) -> None:
        """Take back a lease that expired while its owner lived (a store pause longer than the
        TTL); drop it when another owner holds it now."""
        if self._store.set(key, owner, self.ttl_s, only_if_absent=True):
            self._store.delete(missing_key(key))
            logger.warning("lease %s had expired (store outage?); taken back", key)
        else:
            logger.warning("lease %s was taken over", key)
            self.drop(key)


def missing_key(key: str) -> str:
    """Where readers note when they first saw the lease `key` missing."""
    return f"{key}:missing"


def lease_lost(store: Store, key: str, grace_s: float) -> bool:
    """Whether the lease `key` is gone for good: missing, and first seen missing by a reader at
    least `grace_s` ago (a live owner takes an expired lease back within a beat)."""
    if store.get(key) is not None:
        return False
    now_s = time.time()  # wall clock: readers on every worker and replica compare it
    store.set(missing_key(key), repr(now_s), 3 * grace_s, only_if_absent=True)
    first_seen = store.get(missing_key(key))
    return first_seen is not None and now_s - float(first_seen) >= grace_s


def with_retries(action: Callable[[], ResultT], within_s: float, what: str) -> ResultT:
    """`action()`, retried with exponential backoff (0.05 s doubling to 1 s) while the store is
    unavailable, for at most `within_s`; the last `StoreUnavailable` is raised after that."""
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(StoreUnavailable),
        stop=tenacity.stop_before_delay(within_s),
        wait=tenacity.wait_exponential(multiplier=0.05, min=0.05, max=1.0),
        before_sleep=lambda state: logger.warning(
            "store unavailable while %s (attempt %d); retrying", what, state.attempt_number
        ),
        reraise=True,
    )
    return retrying(action)
