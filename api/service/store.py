"""Where sessions, uploaded profiles and jobs live: one small key-value interface, two backends.

Values are JSON text (the API's own pydantic models), keys are namespaced (`session:<id>`,
`profile:<id>`, `job:<id>`, ...). `MemoryStore` keeps them in this process; `RedisStore` keeps
them in a Redis server so that several workers or replicas share them. Both expire keys given a
TTL, and both offer the two atomic operations the service needs: set-if-absent (locks, creation)
and delete-if-equal (releasing one's own lock), plus renew-if-equal (a lease's heartbeat) and
counted registries (`admit`: at most N live members of a kind, for the state caps).
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

# Deletes KEYS[1] only while it still holds ARGV[1]: releases a lock only by its owner.
_DELETE_IF_EQUAL_LUA = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
# Restarts the TTL of KEYS[1] (ARGV[2] ms) only while it holds ARGV[1]: a lease's heartbeat.
_RENEW_IF_EQUAL_LUA = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""
# A registry KEYS[1] (sorted set: member -> expiry in ms): drops expired members, then admits
# ARGV[1] until ARGV[2] (ms) unless it is new and ARGV[4] members are already live (now: ARGV[3]).
_ADMIT_LUA = """
redis.call('zremrangebyscore', KEYS[1], '-inf', ARGV[3])
if not redis.call('zscore', KEYS[1], ARGV[1]) and redis.call('zcard', KEYS[1]) >= tonumber(ARGV[4]) then
  return 0
end
redis.call('zadd', KEYS[1], ARGV[2], ARGV[1])
local newest = redis.call('zrange', KEYS[1], -1, -1, 'withscores')
redis.call('pexpireat', KEYS[1], newest[2])
return 1
"""


class StoreUnavailable(RuntimeError):
    """The store cannot be reached (the service answers 503)."""


class Store(ABC):
    """The service's state: JSON text under string keys, optionally expiring."""

    backend: str

    @abstractmethod
    def get(self, key: str) -> str | None:
        """The value of `key`, or None when absent or expired."""

    @abstractmethod
    def set(self, key: str, value: str, ttl_s: float | None = None, *, only_if_absent: bool = False) -> bool:
        """Store `value` (expiring after `ttl_s` when given); False when `only_if_absent` and the
        key exists."""

    @abstractmethod
    def delete(self, key: str) -> bool:
        """Remove `key`; True when it existed."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether `key` holds a live value (without reading it)."""

    @abstractmethod
    def delete_if_equal(self, key: str, value: str) -> bool:
        """Remove `key` only while it holds `value` (atomically)."""

    @abstractmethod
    def expire(self, key: str, ttl_s: float) -> bool:
        """Restart the TTL of `key`; False when absent."""

    @abstractmethod
    def renew_if_equal(self, key: str, value: str, ttl_s: float) -> bool:
        """Restart the TTL of `key` only while it holds `value` (atomically)."""

    @abstractmethod
    def admit(self, registry: str, member: str, ttl_s: float, max_members: int) -> bool:
        """Register `member` of `registry` until `ttl_s` from now; False (nothing changes) when it
        is new and `max_members` live members are registered already. A known member is renewed."""

    @abstractmethod
    def forget(self, registry: str, member: str) -> None:
        """Remove `member` from `registry`."""

    @abstractmethod
    def ping(self) -> None:
        """Raise `StoreUnavailable` when the store cannot serve requests."""

    def close(self) -> None:  # noqa: B027  (optional hook: nothing to release in memory)
        """Release connections."""


class MemoryStore(Store):
    """In-process store (the default): a dict guarded by a lock, expiry checked on access."""

    backend = "memory"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._values: dict[str, tuple[str, float | None]] = {}
        self._registries: dict[str, dict[str, float]] = {}
        self._next_sweep = 0.0

    def get(self, key: str) -> str | None:
        with self._lock:
            return self._live(key)

    def set(self, key: str, value: str, ttl_s: float | None = None, *, only_if_absent: bool = False) -> bool:
        with self._lock:
            self._sweep()
            if only_if_absent and self._live(key) is not None:
                return False
            self._values[key] = (value, self._deadline(ttl_s))
            return True

    def delete(self, key: str) -> bool:
        with self._lock:
            existed = self._live(key) is not None
            self._values.pop(key, None)
            return existed

    def exists(self, key: str) -> bool:
        with self._lock:
            return self._live(key) is not None

    def delete_if_equal(self, key: str, value: str) -> bool:
        with self._lock:
            if self._live(key) != value:
                return False
            del self._values[key]
            return True

    def expire(self, key: str, ttl_s: float) -> bool:
        with self._lock:
            current = self._live(key)
            if current is None:
                return False
            self._values[key] = (current, self._deadline(ttl_s))
            return True

    def renew_if_equal(self, key: str, value: str, ttl_s: float) -> bool:
        with self._lock:
            if self._live(key) != value:
                return False
            self._values[key] = (value, self._deadline(ttl_s))
            return True

    def admit(self, registry: str, member: str, ttl_s: float, max_members: int) -> bool:
        with self._lock:
            now = self._clock()
            members = self._registries.setdefault(registry, {})
            for expired in [name for name, deadline in members.items() if deadline <= now]:
                del members[expired]
            if member not in members and len(members) >= max_members:
                return False
            members[member] = now + ttl_s
            return True

    def forget(self, registry: str, member: str) -> None:
        with self._lock:
            self._registries.get(registry, {}).pop(member, None)

    def ping(self) -> None:
        return None

    def _deadline(self, ttl_s: float | None) -> float | None:
        return None if ttl_s is None else self._clock() + ttl_s

    def _live(self, key: str) -> str | None:
        """The value of `key` unless expired (an expired key is dropped). Caller holds the lock."""
        entry = self._values.get(key)
        if entry is None:
            return None
        value, deadline = entry
        if deadline is not None and deadline <= self._clock():
            del self._values[key]
            return None
        return value

    def _sweep(self) -> None:
        """Drop expired keys at most once a second, so unread keys do not pile up."""
        now = self._clock()
        if now < self._next_sweep:
            return
        self._next_sweep = now + 1.0
        expired = [key for key, (_, deadline) in self._values.items() if deadline is not None and deadline <= now]
        for key in expired:
            del self._values[key]


class RedisStore(Store):
    """A Redis server shared by every worker and replica (redis-py, UTF-8 strings)."""

    backend = "redis"

    def __init__(self, url: str, prefix: str = "hydraplan:", timeout_s: float = 2.0) -> None:
        import redis  # the service extra; imported only when HYDRAPLAN_REDIS_URL is set

        self._errors = (redis.RedisError, OSError)
        self._prefix = prefix
        self._client = redis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            health_check_interval=30,
        )
        self._delete_if_equal = self._client.register_script(_DELETE_IF_EQUAL_LUA)
        self._renew_if_equal = self._client.register_script(_RENEW_IF_EQUAL_LUA)
        self._admit = self._client.register_script(_ADMIT_LUA)

    def get(self, key: str) -> str | None:
        return self._call(self._client.get, self._prefix + key)

    def set(self, key: str, value: str, ttl_s: float | None = None, *, only_if_absent: bool = False) -> bool:
        expiry_ms = None if ttl_s is None else max(1, int(ttl_s * 1000))
        done = self._call(self._client.set, self._prefix + key, value, px=expiry_ms, nx=only_if_absent)
        return bool(done)

    def delete(self, key: str) -> bool:
        return bool(self._call(self._client.delete, self._prefix + key))

    def exists(self, key: str) -> bool:
        return bool(self._call(self._client.exists, self._prefix + key))

    def delete_if_equal(self, key: str, value: str) -> bool:
        return bool(self._call(self._delete_if_equal, keys=[self._prefix + key], args=[value]))

    def expire(self, key: str, ttl_s: float) -> bool:
        return bool(self._call(self._client.pexpire, self._prefix + key, max(1, int(ttl_s * 1000))))

    def renew_if_equal(self, key: str, value: str, ttl_s: float) -> bool:
        expiry_ms = max(1, int(ttl_s * 1000))
        return bool(self._call(self._renew_if_equal, keys=[self._prefix + key], args=[value, expiry_ms]))

    def admit(self, registry: str, member: str, ttl_s: float, max_members: int) -> bool:
        now_ms = int(time.time() * 1000)  # wall clock: shared by every replica
        args = [member, now_ms + max(1, int(ttl_s * 1000)), now_ms, max_members]
        return bool(self._call(self._admit, keys=[self._prefix + registry], args=args))

    def forget(self, registry: str, member: str) -> None:
        self._call(self._client.zrem, self._prefix + registry, member)

    def ping(self) -> None:
        self._call(self._client.ping)

    def close(self) -> None:
        self._client.close()

    def _call(self, function, *args, **kwargs):
        try:
            return function(*args, **kwargs)
        except self._errors as exc:
            raise StoreUnavailable(f"redis store unavailable: {exc}") from exc


def open_store(redis_url: str | None, prefix: str = "hydraplan:") -> Store:
    """`RedisStore` when a URL is configured, else `MemoryStore`."""
    if redis_url:
        return RedisStore(redis_url, prefix)
    return MemoryStore()
