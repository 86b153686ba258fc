"""Events from the engine thread to the asyncio side, handed over once per step."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Callable

log = logging.getLogger("hallmark.engine.local")


class Outbox:
    """Events for the asyncio side, handed over once per engine step.

    Handing each event over by itself (``call_soon_threadsafe`` per token) woke the event
    loop once per token, and each wake-up took the GIL from the engine thread in the middle
    of a step: through ``LocalEngine.generate`` the engine ran at half the speed of the same
    steps driven directly (H200, bench/engine_cuda.py). One hand-over per step, in order.
    """

    def __init__(self) -> None:
        self._items: list[tuple] = []
        self._lock = threading.Lock()

    def sink(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> Callable[[object], None]:
        def put(event) -> None:
            with self._lock:
                self._items.append((loop, queue, event))
        return put

    def flush(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        by_loop: dict = {}
        for loop, queue, event in items:
            by_loop.setdefault(loop, []).append((queue, event))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:  # that event loop is closed: nobody is listening any more
                log.debug("dropped %d events for a closed event loop", len(batch))


def _deliver(batch: list) -> None:
    for queue, event in batch:
        queue.put_nowait(event)
