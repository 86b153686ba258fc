"""Concurrent detections per principal in this replica, taken before any work.

A detection holds a slot from before its body is tokenised until its answer is ready; a
principal past ``limit`` gets 429 ``too_many_concurrent_detections`` at once. So one tenant's
flood of huge bodies occupies at most ``limit`` worker threads, and another tenant's check
finds a free one.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from service.errors import RateLimited


class Slots:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    @contextmanager
    def hold(self, principal: str) -> Iterator[None]:
        with self._lock:
            held = self._held.get(principal, 0)
            if self.limit and held >= self.limit:
                raise RateLimited(f"{held} detections of yours are already running (the limit is {self.limit} "
                                  "at once); retry when one finishes", headers={"Retry-After": "1"},
                                  code="too_many_concurrent_detections")
            self._held[principal] = held + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._held.get(principal, 1) - 1
                if left > 0:
                    self._held[principal] = left
                else:
                    self._held.pop(principal, None)
