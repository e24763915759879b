"""A thread-safe least-recently-used cache bounded by the total weight (bytes) of its values.

Caches of the planner and the service are bounded by what they hold, not by their entry count:
one huge value (a 1F1B order of a 20,000-stage pipeline, a 16 MB uploaded profile) must not pin
hundreds of megabytes. A value heavier than the whole budget is returned but not kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

KeyT = TypeVar("KeyT", bound=Hashable)
ValueT = TypeVar("ValueT")


class WeightedLru(Generic[KeyT, ValueT]):
    """At most `max_weight` in total of `weight(value)` is kept; the least recently used goes first."""

    def __init__(self, max_weight: int, weight: Callable[[ValueT], int]) -> None:
        self.max_weight = max_weight
        self._weight_of = weight
        self._entries: OrderedDict[KeyT, tuple[ValueT, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.weight = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get_or_make(self, key: KeyT, make: Callable[[], ValueT]) -> ValueT:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return entry[0]
            self.misses += 1
        value = make()  # outside the lock: two threads may both build it, both get equal values
        weight = self._weight_of(value)
        if weight > self.max_weight:
            return value
        with self._lock:
            previous = self._entries.pop(key, None)
            if previous is not None:
                self.weight -= previous[1]
            self._entries[key] = (value, weight)
            self.weight += weight
            while self.weight > self.max_weight:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.weight -= dropped
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.weight = 0
