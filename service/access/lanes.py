"""A fair lane per principal: one of its detections runs at a time in this process, the rest
wait their turn (issue 31: one tenant's stream of 8,000-id bodies on 4 connections took
another tenant's p50 from 0.04 s to 1.38 s, because each of its requests' CPU-bound steps
queued on the event loop beside the other tenant's).

With one detection per principal in flight, another principal's check competes with at most
one step of each busy principal, and the routes keep the steps that run on the event loop
small (``service.routes.detect.INLINE_MAX``): a larger body runs in a worker thread, where the
interpreter shares the CPU between it and the loop instead of the loop waiting for it. More
than ``queue`` waiting detections of one principal are refused at once (429
``too_many_concurrent_detections``), so a flood holds no unbounded queue.

**Others first** (issue 31 item 5: one principal's detections may not raise another's p99
above twice its idle p99). One lane at a time still lets a principal keep the gateway busy
all the time: its next detection starts the moment its last one ends, and another
principal's check then runs beside a whole detection of it (the worker process's CPU, the
gateway's admission write and body handling). So each principal's lane use is measured: the
share of recent time (decayed over ``window`` seconds) its lane was held. A principal over
``share`` (a continuous stream; one long detection does not get there) is *over its share*:
its next turn waits while any principal within its share has a detection in flight, and so
does its detection between admission and the core (:meth:`Lanes.defer`). Others' checks are
short, so the flooder loses only the time they take and keeps the leftover capacity; no
wait is longer than ``defer_max`` (a stream of others' checks never starves it). Answers are
unchanged: only when a detection starts moves.
"""

from __future__ import annotations

import asyncio
import math
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable

from service.errors import RateLimited

SHARE = 0.5
"""A principal whose lane was held more than this share of the recent time is over its share
(the gateway's is ``detect_fair_share``)."""
WINDOW = 2.0
"""Seconds over which lane use decays (an exponential time constant): a flood is over its
share within about 1.5 s of continuous use, a single detection of a few hundred ms is not
(the gateway's is ``detect_fair_window_s``)."""
DEFER_MAX = 0.5
"""The longest one wait of an over-share principal for others (it is never starved; the
gateway's is ``detect_defer_max_s``)."""


class Lanes:
    def __init__(self, queue: int = 16, *, share: float = SHARE, window: float = WINDOW,
                 defer_max: float = DEFER_MAX, clock: Callable[[], float] = time.monotonic) -> None:
        self.queue = queue
        self.share, self.window, self.defer_max, self.clock = share, window, defer_max, clock
        self.deferred = 0  # waits of over-share principals (how often others went first)
        self._lanes: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self._use: dict[str, tuple[float, float]] = {}
        """Principal -> (lane use in decayed seconds, when): its turns that ended."""
        self._since: dict[str, float] = {}
        """Principal -> when its turn in progress began."""
        self._prune_at = 4096
        self._within: set[str] = set()  # principals within their share with a turn in flight
        self._clear: asyncio.Event | None = None  # set while no such turn is in flight
        self._starts: list[tuple[str, float]] = []
        """The last two distinct principals to begin a turn, and when (latest first): enough to
        tell whether any principal other than a given one began one lately, in O(1)."""

    def use(self, principal: str) -> float:
        """The share of the recent time (0 to 1) this principal's lane was held."""
        now = self.clock()
        used, at = self._use.get(principal, (0.0, now))
        held = used * math.exp(-(now - at) / self.window)
        since = self._since.get(principal)
        if since is not None:  # the turn in progress counts as it goes
            held += self.window * (1.0 - math.exp(-(now - since) / self.window))
        return held / self.window

    def over_share(self, principal: str) -> bool:
        return self.use(principal) > self.share

    async def defer(self, principal: str) -> None:
        """If ``principal`` is over its share: wait (at most ``defer_max``) until no principal
        within its share has a detection in flight."""
        if not self._within or principal in self._within or not self.over_share(principal):
            return  # (a turn that began within its share goes on as it began)
        self.deferred += 1
        try:
            await asyncio.wait_for(self._event().wait(), self.defer_max)
        except asyncio.TimeoutError:
            pass

    def _event(self) -> asyncio.Event:
        if self._clear is None:
            self._clear = asyncio.Event()
            if not self._within:
                self._clear.set()
        return self._clear

    def others_lately(self, principal: str) -> bool:
        """Whether a principal other than this one began a turn within the last ``window``
        seconds (someone an over-share stream could delay)."""
        now = self.clock()
        return any(p != principal and now - at < self.window for p, at in self._starts)

    def _started(self, principal: str) -> None:
        self._starts = [(principal, self.clock())] + [s for s in self._starts if s[0] != principal][:1]

    @asynccontextmanager
    async def turn(self, principal: str) -> AsyncIterator[bool]:
        """The principal's turn (its detections one at a time); yields whether it may detect on
        the event loop: its turn began within its share, or no other principal began one lately
        (the route detects a contending over-share principal's small bodies off the loop too:
        service.routes.detect; a principal alone keeps the loop's speed)."""
        lock, waiting = self._lanes.setdefault(principal, (asyncio.Lock(), [0]))
        if lock.locked() and waiting[0] >= self.queue:
            raise RateLimited(f"{waiting[0]} detections of yours are already waiting (at most {self.queue}); "
                              "retry when one finishes", headers={"Retry-After": "1"},
                              code="too_many_concurrent_detections")
        waiting[0] += 1
        try:
            await lock.acquire()
        finally:
            waiting[0] -= 1
        within = False
        try:
            await self.defer(principal)  # others first, once over its share
            within = not self.over_share(principal)
            if within:
                self._within.add(principal)
                self._event().clear()
            inline = within or not self.others_lately(principal)
            self._started(principal)
            self._since[principal] = self.clock()
            yield inline
        finally:
            self._ended(principal)
            if within:
                self._within.discard(principal)
                if not self._within:
                    self._event().set()
            lock.release()
            if not lock.locked() and waiting[0] == 0 and self._lanes.get(principal, (None,))[0] is lock:
                del self._lanes[principal]

    def _ended(self, principal: str) -> None:
        since = self._since.pop(principal, None)
        if since is None:
            return
        now = self.clock()
        used, at = self._use.get(principal, (0.0, now))
        used = used * math.exp(-(now - at) / self.window) + self.window * (1.0 - math.exp(-(now - since) / self.window))
        self._use[principal] = (used, now)
        if len(self._use) > self._prune_at:  # principals whose use has decayed away are forgotten
            self._use = {p: (u, t) for p, (u, t) in self._use.items()
                         if u * math.exp(-(now - t) / self.window) > 1e-3 * self.window}
            self._prune_at = max(4096, 2 * len(self._use))
