"""Small bounded caches for the hot path (token lookups, opened keys).

Detection must answer hundreds of requests a second on two cores; hitting the database
and AES-GCM on every request would dominate. Entries live ``ttl`` seconds, so a revoked
token or a rotated key takes effect within that time (ServiceSettings.key_cache_seconds),
on every replica. A full cache forgets its least recently used entry, one at a time.

:class:`TokenCache` keeps known and unknown tokens apart: unknown tokens (a client with a
typo, or a flood of random ones) are remembered in their own LRU, so that they are refused
without a database query when repeated and can never evict a valid token.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

V = TypeVar("V")
_MISSING = object()


class TTLCache(Generic[V]):
    """An LRU of at most ``max_entries`` entries, each valid ``ttl`` seconds."""

    def __init__(self, ttl: float, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[Hashable, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, default=_MISSING):
        """The live value for ``key``, else ``default`` (a sentinel: test with :meth:`hit`)."""
        if self.ttl <= 0:
            return default
        now = self._clock()
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return default
            if hit[0] <= now:
                del self._entries[key]
                return default
            self._entries.move_to_end(key)
            return hit[1]

    @staticmethod
    def hit(value) -> bool:
        return value is not _MISSING

    def put(self, key: Hashable, value: V) -> None:
        if self.ttl <= 0:
            return
        with self._lock:
            self._entries[key] = (self._clock() + self.ttl, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def get_or_load(self, key: Hashable, load: Callable[[], V]) -> V:
        value = self.get(key)
        if self.hit(value):
            return value
        value = load()
        self.put(key, value)
        return value

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return self.hit(self.get(key))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


class TokenCache(Generic[V]):
    """Known tokens (value not None) and unknown ones (None) in separate LRUs."""

    def __init__(self, ttl: float, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.known: TTLCache[V] = TTLCache(ttl, max_entries, clock)
        self.unknown: TTLCache[bool] = TTLCache(ttl, max_entries, clock)

    def lookup(self, key: Hashable) -> tuple[bool, V | None]:
        """(found, value): found with None means a remembered unknown token."""
        value = self.known.get(key)
        if TTLCache.hit(value):
            return True, value
        if TTLCache.hit(self.unknown.get(key)):
            return True, None
        return False, None

    def store(self, key: Hashable, value: V | None) -> None:
        if value is None:
            self.unknown.put(key, True)
        else:
            self.known.put(key, value)

    def get_or_load(self, key: Hashable, load: Callable[[], V | None]) -> V | None:
        found, value = self.lookup(key)
        if found:
            return value
        value = load()
        self.store(key, value)
        return value

    def clear(self) -> None:
        self.known.clear()
        self.unknown.clear()
