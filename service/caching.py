"""A small TTL cache for the hot path (token lookups, opened keys).

Detection must answer hundreds of requests a second on two cores; hitting the database
and AES-GCM on every request would dominate. Entries live ``ttl`` seconds, so a revoked
token or a rotated key takes effect within that time (ServiceSettings.key_cache_seconds).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Generic, Hashable, TypeVar

V = TypeVar("V")


class TTLCache(Generic[V]):
    def __init__(self, ttl: float, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._entries: dict[Hashable, tuple[float, V]] = {}
        self._lock = threading.Lock()

    def get_or_load(self, key: Hashable, load: Callable[[], V]) -> V:
        if self.ttl <= 0:
            return load()
        now = self._clock()
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and hit[0] > now:
                return hit[1]
        value = load()
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key] = (now + self.ttl, value)
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
