"""Per-token rate limits (a token bucket per API token).

Detection answers are an oracle: enough queries let a client learn which tokens a key
favours and then forge or scrub the watermark. The bucket caps that rate per token.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    def __init__(self, rate_per_minute: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate_per_minute / 60.0
        self.burst = float(burst)
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def acquire(self, who: str) -> float:
        """0 if allowed (one unit taken), else the seconds to wait before retrying."""
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(who)
            if bucket is None:
                bucket = self._buckets[who] = _Bucket(self.burst, now)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return 0.0
            return (1.0 - bucket.tokens) / self.rate
