"""service.caching.TTLCache's refresh ahead (issue 30 item 5): a busy entry is reloaded on the
cache's thread before it expires, never served past its expiry, and a reload begun before a
clear is dropped."""

from __future__ import annotations

import threading

from service.caching import TTLCache

WAIT = 10.0  # seconds: generous, the reload is immediate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_read_near_expiry_returns_the_entry_and_reloads_it_off_the_callers_thread():
    clock = Clock()
    cache = TTLCache(2.0, clock=clock, refresh_ahead=0.25)
    reloaded = threading.Event()
    threads = []

    def load(value):
        def run():
            threads.append(threading.current_thread().name)
            if value == "new":
                reloaded.set()
            return value
        return run

    assert cache.get_or_load("k", load("old")) == "old"
    clock.now += 1.0  # half its life left: no reload
    assert cache.get_or_load("k", load("new")) == "old"
    assert not reloaded.is_set()
    clock.now += 0.6  # the last quarter: served, and reloaded on the cache's thread
    assert cache.get_or_load("k", load("new")) == "old"
    assert reloaded.wait(WAIT)
    for _ in range(1000):  # stored just after load returns, under the cache's lock
        if cache.get("k") == "new":
            break
        threading.Event().wait(0.01)
    assert cache.get("k") == "new"
    assert threads == [threading.current_thread().name, "cache-refresh"]
    clock.now += 1.0  # the reloaded entry's own life: still fresh, no load
    assert cache.get_or_load("k", load("unused")) == "new"


def test_an_expired_entry_is_loaded_by_its_caller():
    clock = Clock()
    cache = TTLCache(2.0, clock=clock, refresh_ahead=0.25)
    cache.get_or_load("k", lambda: "old")
    clock.now += 2.5
    assert cache.get_or_load("k", lambda: "new") == "new"


def test_a_reload_begun_before_a_clear_is_dropped():
    clock = Clock()
    cache = TTLCache(2.0, clock=clock, refresh_ahead=0.25)
    started, release, done = threading.Event(), threading.Event(), threading.Event()

    def slow():
        started.set()
        release.wait(WAIT)
        return "stale"

    cache.get_or_load("k", lambda: "old")
    clock.now += 1.8
    assert cache.get_or_load("k", slow) == "old"
    assert started.wait(WAIT)
    cache.clear()
    # The next reload queued behind the slow one tells when the thread has handled it.
    cache.put("other", 1)
    clock.now += 1.8
    cache.get_or_load("other", lambda: done.set() or 2)
    release.set()
    assert done.wait(WAIT)
    assert cache.get("k", None) is None
    assert cache.get_or_load("k", lambda: "fresh") == "fresh"


def test_a_failed_reload_leaves_the_entry_to_expire():
    clock = Clock()
    cache = TTLCache(2.0, clock=clock, refresh_ahead=0.25)
    failed = threading.Event()

    def broken():
        failed.set()
        raise RuntimeError("database down")

    cache.get_or_load("k", lambda: "old")
    clock.now += 1.8
    assert cache.get_or_load("k", broken) == "old"
    assert failed.wait(WAIT)
    clock.now += 0.5
    assert cache.get_or_load("k", lambda: "new") == "new"


def _until(predicate) -> bool:
    """Poll ``predicate`` (the reload thread stores under the cache's lock just after it loads)."""
    for _ in range(1000):
        if predicate():
            return True
        threading.Event().wait(0.01)
    return predicate()


def test_a_busy_token_is_reloaded_ahead_and_a_revoked_one_dropped_at_once():
    from service.caching import TokenCache

    clock = Clock()
    cache = TokenCache(2.0, clock=clock, refresh_ahead=0.25)
    callers = threading.current_thread().name
    loads = []

    def load(value):
        def run():
            loads.append(threading.current_thread().name)
            return value
        return run

    assert cache.lookup_refreshing("t", load("never")) == (False, None)  # a miss: the caller loads
    assert loads == []
    cache.store("t", "identity")
    clock.now += 1.0
    assert cache.lookup_refreshing("t", load("fresh")) == (True, "identity")
    assert loads == []  # half its life left: nothing queued
    clock.now += 0.6
    assert cache.lookup_refreshing("t", load("fresh")) == (True, "identity")
    assert _until(lambda: cache.lookup("t") == (True, "fresh"))
    assert loads == ["cache-refresh"] and callers != "cache-refresh"
    clock.now += 1.6  # near the reloaded entry's expiry; the token was revoked meanwhile
    assert cache.lookup_refreshing("t", load(None)) == (True, "fresh")
    assert _until(lambda: cache.lookup("t") == (True, None))  # gone at once, remembered unknown
    assert TTLCache.hit(cache.unknown.get("t"))


def test_a_token_is_never_served_past_its_expiry_waiting_for_a_reload():
    from service.caching import TokenCache

    clock = Clock()
    cache = TokenCache(2.0, clock=clock, refresh_ahead=0.25)
    cache.store("t", "identity")
    clock.now += 2.5
    assert cache.lookup_refreshing("t", lambda: "fresh") == (False, None)
