"""Leases: short-lived store keys that a live worker keeps renewing, so that state owned by a
worker that died (a session lock, a running job) is released within `ttl_s`, not after hours.

One `Heartbeat` thread per owner (the session service, the job runner) renews every lease it
holds every `ttl_s / 4`; a failed renewal (the store is down) is retried at the next beat, so an
outage shorter than ~3/4 of `ttl_s` loses no lease. A lease is released by its owner only
(delete-if-equal), never by a worker that merely outlived it.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import TypeVar

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
                        logger.warning("lease %s was lost (expired or taken over)", key)
                        self.drop(key)
                except StoreUnavailable:
                    logger.warning("could not renew lease %s; retrying at the next beat", key)


def with_retries(action: Callable[[], ResultT], within_s: float, what: str) -> ResultT:
    """`action()`, retried with backoff (0.05 s doubling to 1 s) while the store is unavailable,
    for at most `within_s`; the last `StoreUnavailable` is raised after that."""
    deadline = time.monotonic() + within_s
    pause_s = 0.05
    while True:
        try:
            return action()
        except StoreUnavailable:
            if time.monotonic() + pause_s > deadline:
                raise
            logger.warning("store unavailable while %s; retrying in %.2f s", what, pause_s)
            time.sleep(pause_s)
            pause_s = min(1.0, pause_s * 2)
