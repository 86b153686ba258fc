"""Events from the engine's threads to the asyncio side, handed over in batches."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Callable

from service.engines.base import Delta

log = logging.getLogger("hallmark.engine.local")


class Outbox:
    """Events for the asyncio side: one hand-over per flush, and at most one waiting per
    event loop.

    Handing each event over by itself (``call_soon_threadsafe`` per token) woke the event
    loop once per token, and each wake-up took the GIL from the engine thread in the middle
    of a step: through ``LocalEngine.generate`` the engine ran at half the speed of the same
    steps driven directly (H200, bench/engine_cuda.py). A flush schedules one delivery per
    event loop; while that delivery has not run yet (the loop is busy), later events join
    it, and a request's consecutive Deltas are merged into one (text and token ids joined,
    the latest route counts): a loop that falls behind gets fewer, larger events instead of
    a growing backlog of small ones. Each request's events keep their order.
    """

    def __init__(self) -> None:
        self._pending: dict[asyncio.AbstractEventLoop, dict[asyncio.Queue, list]] = {}
        self._scheduled: set[asyncio.AbstractEventLoop] = set()
        self._lock = threading.Lock()

    def sink(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> Callable[[object], None]:
        def put(event) -> None:
            with self._lock:
                events = self._pending.setdefault(loop, {}).setdefault(queue, [])
                if events and isinstance(event, Delta) and isinstance(events[-1], Delta):
                    events[-1] = merged(events[-1], event)
                else:
                    events.append(event)
        return put

    def flush(self) -> None:
        """Schedule the delivery of what is pending, for each loop that has none scheduled."""
        with self._lock:
            loops = [loop for loop in self._pending if loop not in self._scheduled]
            self._scheduled.update(loops)
        for loop in loops:
            try:
                loop.call_soon_threadsafe(self._deliver, loop)
            except RuntimeError:  # that event loop is closed: nobody is listening any more
                with self._lock:
                    dropped = self._pending.pop(loop, {})
                    self._scheduled.discard(loop)
                log.debug("dropped events of %d requests for a closed event loop", len(dropped))

    def _deliver(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``: hand over everything pending for it (what arrived since the flush too)."""
        with self._lock:
            batch = self._pending.pop(loop, {})
            self._scheduled.discard(loop)
        for queue, events in batch.items():
            for event in events:
                queue.put_nowait(event)


def merged(first: Delta, second: Delta) -> Delta:
    """Two consecutive Deltas of one request as one."""
    return Delta(text=first.text + second.text, token_ids=first.token_ids + second.token_ids,
                 routes=second.routes if second.routes is not None else first.routes)
