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

import logging
import queue
import threading
import time
from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

V = TypeVar("V")
_MISSING = object()
log = logging.getLogger("hallmark.caching")


class TTLCache(Generic[V]):
    """An LRU of at most ``max_entries`` entries, each valid ``ttl`` seconds.

    ``refresh_ahead`` (a share of ``ttl``, 0: off): :meth:`get_or_load` of an entry in the last
    ``refresh_ahead * ttl`` seconds of its life returns it and reloads it on the cache's own
    thread, so a busy key is reloaded before it expires instead of by the caller that finds it
    expired: on the gateway that caller is the event loop, and the signer's and a detection
    scope's reloads held it 10-27 ms every 2 s (bench.detect_http --probe, issue 30 item 5),
    every request in flight waiting. No entry is served past its expiry either way (one whose
    reload has not finished is loaded by its caller, as without), so a change still takes
    effect within ``ttl``; a reload that began before :meth:`clear` is dropped."""

    def __init__(self, ttl: float, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic,
                 refresh_ahead: float = 0.0) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self.refresh_ahead = refresh_ahead
        self._clock = clock
        self._entries: OrderedDict[Hashable, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()
        self._cleared = 0  # clear()s so far: a reload begun before one is not stored
        self._reloading: set[Hashable] = set()
        self._reloads: queue.SimpleQueue | None = None

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
            self._put(key, value)

    def _put(self, key: Hashable, value: V) -> None:
        self._entries[key] = (self._clock() + self.ttl, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def get_refreshing(self, key: Hashable, load: Callable[[], V], default=_MISSING):
        """:meth:`get`, and where the live entry is in its last ``refresh_ahead`` share, its
        reload by ``load`` queued on the cache's thread (never run by the caller)."""
        if self.refresh_ahead <= 0 or self.ttl <= 0:
            return self.get(key, default)
        now = self._clock()
        with self._lock:
            hit = self._entries.get(key)
            if hit is None or hit[0] <= now:
                return default
            self._entries.move_to_end(key)
            if hit[0] - now < self.ttl * self.refresh_ahead and key not in self._reloading:
                self._reloading.add(key)
                self._reload_queue().put((key, load, self._cleared))
            return hit[1]

    def get_or_load(self, key: Hashable, load: Callable[[], V]) -> V:
        value = self.get_refreshing(key, load)
        if self.hit(value):
            return value
        value = load()
        self.put(key, value)
        return value

    def _reload_queue(self) -> queue.SimpleQueue:
        """The reloads' queue, and the daemon thread that runs them (started on first use)."""
        if self._reloads is None:
            self._reloads = queue.SimpleQueue()
            threading.Thread(target=self._reload_forever, args=(self._reloads,), daemon=True,
                             name="cache-refresh").start()
        return self._reloads

    def _reload_forever(self, reloads: queue.SimpleQueue) -> None:
        while True:
            try:
                key, load, cleared = reloads.get(timeout=30.0)
            except queue.Empty:  # idle: the thread ends (queued under the lock, so none is lost)
                with self._lock:
                    if reloads.empty():
                        self._reloads = None
                        return
                continue
            try:
                value = load()
            except Exception:  # noqa: BLE001 - the entry expires and its next caller loads (and fails) as before
                log.debug("reloading %r ahead of its expiry failed", key, exc_info=True)
                value = _MISSING
            with self._lock:
                self._reloading.discard(key)
                if value is not _MISSING and cleared == self._cleared:
                    self._put(key, value)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return self.hit(self.get(key))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._cleared += 1

    def discard(self, key: Hashable) -> None:
        with self._lock:
            self._entries.pop(key, None)


class _Gone(Exception):
    """A known token's reload found it unknown (revoked, expired, deleted)."""


class TokenCache(Generic[V]):
    """Known tokens (value not None) and unknown ones (None) in separate LRUs.

    ``refresh_ahead`` as :class:`TTLCache`'s, for known tokens looked up by
    :meth:`lookup_refreshing`: a busy token is reloaded on the cache's thread before it
    expires, so no request waits for its reload every ``ttl`` seconds (a request awaiting it
    held every request of that token behind one database read). A reload that finds the token
    gone drops it at once and remembers it unknown: a revocation still takes effect within
    ``ttl``."""

    def __init__(self, ttl: float, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic,
                 refresh_ahead: float = 0.0) -> None:
        self.known: TTLCache[V] = TTLCache(ttl, max_entries, clock, refresh_ahead=refresh_ahead)
        self.unknown: TTLCache[bool] = TTLCache(ttl, max_entries, clock)

    def lookup_refreshing(self, key: Hashable, load: Callable[[], V | None]) -> tuple[bool, V | None]:
        """:meth:`lookup`, and for a known token near its expiry a reload queued (never run here)."""
        if self.known.refresh_ahead <= 0:
            return self.lookup(key)

        def reload() -> V:
            value = load()
            if value is None:
                self.known.discard(key)
                self.unknown.put(key, True)
                raise _Gone
            return value

        value = self.known.get_refreshing(key, reload)
        if TTLCache.hit(value):
            return True, value
        if TTLCache.hit(self.unknown.get(key)):
            return True, None
        return False, None

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
