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
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import AsyncIterator

from service.errors import RateLimited


class Lanes:
    def __init__(self, queue: int = 16) -> None:
        self.queue = queue
        self._lanes: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    @asynccontextmanager
    async def turn(self, principal: str) -> AsyncIterator[None]:
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
        try:
            yield
        finally:
            lock.release()
            if not lock.locked() and waiting[0] == 0 and self._lanes.get(principal, (None,))[0] is lock:
                del self._lanes[principal]
