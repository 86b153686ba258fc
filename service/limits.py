"""Rate and concurrency limits: token buckets shared by every replica, and per-tenant
generation admission.

A bucket holds up to ``burst`` units and refills at ``rate`` units a second; a request
takes ``cost`` units or is refused with the seconds until it could succeed (HTTP 429 with
Retry-After). Buckets live where every gateway replica sees them:

* ``database`` (the default on PostgreSQL): one row per bucket in ``rate_limit_buckets``,
  updated under a row lock, timed by the database's clock, through the owner's
  ``hallmark_take_bucket()`` (migration 0013: the service role cannot refill a bucket);
* ``redis`` (``HALLMARK_REDIS_URL``): one hash per bucket, updated by one Lua script, timed
  by Redis's clock;
* ``memory`` (the default on SQLite): this process only.

A shared backend that fails (the database restarting) falls back to this process's own
buckets until it answers again, so limits hold approximately instead of failing requests.

Generation is limited per tenant twice: at most ``tenant_max_concurrent_generations``
generations in flight in this replica, and a token budget of ``tenant_tokens_per_minute``
shared by all replicas. A generation reserves its ``max_tokens`` when admitted and gives
back what it did not use when it ends.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import text

from service.errors import RateLimited

log = logging.getLogger("hallmark.limits")


class Buckets(Protocol):
    def take(self, name: str, cost: float, rate: float, burst: float) -> float:
        """Take ``cost`` units (a negative cost gives units back): 0.0 if taken, else the
        seconds until it could be (``inf`` if ``cost`` exceeds ``burst``)."""


def _refill(level: float, elapsed: float, rate: float, burst: float) -> float:
    return min(burst, level + max(0.0, elapsed) * rate)


def _decide(level: float, cost: float, rate: float, burst: float) -> tuple[float, float]:
    """(new level, wait) for a bucket at ``level`` after refilling."""
    if cost <= 0:
        return min(burst, level - cost), 0.0
    if level >= cost:
        return level - cost, 0.0
    return level, math.inf if cost > burst else (cost - level) / rate


class MemoryBuckets:
    """This process's buckets (bounded: the least recently used are forgotten, i.e. refilled)."""

    def __init__(self, max_buckets: int = 100_000, clock=time.monotonic) -> None:
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._max = max_buckets
        self._clock = clock
        self._lock = threading.Lock()

    def take(self, name: str, cost: float, rate: float, burst: float) -> float:
        now = self._clock()
        with self._lock:
            level, updated = self._buckets.pop(name, (burst, now))
            level, wait = _decide(_refill(level, now - updated, rate, burst), cost, rate, burst)
            self._buckets[name] = (level, now)
            while len(self._buckets) > self._max:
                self._buckets.popitem(last=False)
        return wait


class DatabaseBuckets:
    """Buckets in the store's ``rate_limit_buckets`` table (one row lock per take)."""

    def __init__(self, store) -> None:
        self.store = store
        self._postgres = store.engine.dialect.name == "postgresql"

    def take(self, name: str, cost: float, rate: float, burst: float) -> float:
        with self.store.transaction() as session:
            connection = session.connection()
            if self._postgres:
                # The owner's function is the table's one write path (migration 0013): the service
                # role cannot refill a bucket, pass itself a larger rate, or refund a detection.
                wait = connection.execute(text("SELECT hallmark_take_bucket(:name, :cost, :rate, :burst)"),
                                          {"name": name, "cost": cost, "rate": rate, "burst": burst}).scalar_one()
                return math.inf if wait < 0 else wait
            # SQLite: the write transaction (BEGIN IMMEDIATE) already serialises takers
            now = time.time()
            connection.execute(text("INSERT OR IGNORE INTO rate_limit_buckets (name, level, updated) "
                                    "VALUES (:name, :burst, :now)"), {"name": name, "burst": burst, "now": now})
            level, updated = connection.execute(text(
                "SELECT level, updated FROM rate_limit_buckets WHERE name = :name"), {"name": name}).one()
            level, wait = _decide(_refill(level, now - updated, rate, burst), cost, rate, burst)
            connection.execute(text("UPDATE rate_limit_buckets SET level = :level, updated = :now WHERE name = :name"),
                               {"level": level, "now": now, "name": name})
        return wait


_REDIS_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local saved = redis.call('HMGET', KEYS[1], 'level', 'updated')
local level = tonumber(saved[1]) or burst
local updated = tonumber(saved[2]) or now
level = math.min(burst, level + math.max(0, now - updated) * rate)
local wait = 0
if cost <= 0 then level = math.min(burst, level - cost)
elseif level >= cost then level = level - cost
elseif cost > burst then wait = -1
else wait = (cost - level) / rate end
redis.call('HSET', KEYS[1], 'level', tostring(level), 'updated', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 60)
return tostring(wait)
"""


class RedisBuckets:
    """Buckets in Redis: one hash per bucket, one atomic script per take."""

    def __init__(self, url: str, prefix: str = "hallmark:rl:") -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self.prefix = prefix
        self._script = self.client.register_script(_REDIS_TAKE)

    def take(self, name: str, cost: float, rate: float, burst: float) -> float:
        wait = float(self._script(keys=[self.prefix + name], args=[rate, burst, cost]))
        return math.inf if wait < 0 else wait


class FailoverBuckets:
    """A shared backend, with this process's buckets while it fails."""

    def __init__(self, primary: Buckets, fallback: Buckets | None = None) -> None:
        self.primary = primary
        self.fallback = fallback or MemoryBuckets()
        self._warned = 0.0

    def take(self, name: str, cost: float, rate: float, burst: float) -> float:
        try:
            return self.primary.take(name, cost, rate, burst)
        except Exception as exc:  # noqa: BLE001 - any failure of the shared store: limit locally
            now = time.monotonic()
            if now - self._warned > 10:
                self._warned = now
                log.warning("shared rate limits unavailable (%s); limiting per process meanwhile",
                            type(exc).__name__)
            return self.fallback.take(name, cost, rate, burst)


def create_buckets(settings, store) -> Buckets:
    backend = settings.rate_limit_backend
    if backend == "auto":
        backend = "redis" if settings.redis_url else (
            "database" if store.engine.dialect.name == "postgresql" else "memory")
    if backend == "memory":
        return MemoryBuckets()
    if backend == "database":
        return FailoverBuckets(DatabaseBuckets(store))
    if backend == "redis":
        if not settings.redis_url:
            raise ValueError("rate_limit_backend 'redis' needs HALLMARK_REDIS_URL")
        return FailoverBuckets(RedisBuckets(settings.redis_url))
    raise ValueError(f"unknown rate limit backend: {backend}; expected one of auto, memory, database, redis")


def retry_after(wait: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(wait)))}


@dataclass
class GenerationLease:
    """A tenant's admitted generation: give it back with :meth:`release` (idempotent)."""

    limits: "TenantLimits"
    tenant_id: str
    reserved: int
    released: bool = False

    def release(self, used_tokens: int = 0) -> None:
        if self.released:
            return
        self.released = True
        self.limits._end(self.tenant_id, self.reserved - min(self.reserved, max(0, used_tokens)))


class TenantLimits:
    """Per-tenant admission for generation: concurrency (this replica) and a token budget
    (shared through ``buckets``). Zero disables either."""

    def __init__(self, buckets: Buckets, *, max_concurrent: int, tokens_per_minute: float, token_burst: float) -> None:
        self.buckets = buckets
        self.max_concurrent = max_concurrent
        self.rate = tokens_per_minute / 60.0
        self.burst = token_burst
        self._running: dict[str, int] = {}
        self._lock = threading.Lock()
        self._refunds = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hallmark-limits")

    async def admit(self, tenant_id: str, max_tokens: int) -> GenerationLease:
        with self._lock:
            running = self._running.get(tenant_id, 0)
            if self.max_concurrent and running >= self.max_concurrent:
                raise RateLimited(f"this tenant already has {running} generations in progress (the limit is "
                                  f"{self.max_concurrent}); retry when one finishes",
                                  headers=retry_after(1), code="too_many_concurrent_generations")
            self._running[tenant_id] = running + 1
        lease = GenerationLease(self, tenant_id, max_tokens if self.rate > 0 else 0)
        if self.rate > 0:
            try:
                wait = await asyncio.to_thread(self.buckets.take, f"gen:{tenant_id}", max_tokens, self.rate,
                                               self.burst)
            except BaseException:
                lease.reserved = 0
                lease.release()
                raise
            if wait > 0:
                lease.reserved = 0
                lease.release()
                if math.isinf(wait):
                    raise RateLimited(f"max_tokens {max_tokens} exceeds this tenant's token budget of "
                                      f"{self.burst:.0f}", code="token_budget_exceeded")
                raise RateLimited(f"this tenant's generation token budget ({self.rate * 60:.0f} tokens a minute) "
                                  f"is used up; retry in {wait:.1f} s", headers=retry_after(wait),
                                  code="token_rate_limited")
        return lease

    def _end(self, tenant_id: str, unused: int) -> None:
        with self._lock:
            left = self._running.get(tenant_id, 1) - 1
            if left > 0:
                self._running[tenant_id] = left
            else:
                self._running.pop(tenant_id, None)
        if unused > 0 and self.rate > 0:
            self._refunds.submit(self._refund, tenant_id, unused)

    def _refund(self, tenant_id: str, unused: int) -> None:
        try:
            self.buckets.take(f"gen:{tenant_id}", -unused, self.rate, self.burst)
        except Exception:  # noqa: BLE001 - a lost refund only makes the limit stricter for a while
            log.warning("could not return %d unused tokens to tenant %s's budget", unused, tenant_id)

    def running(self, tenant_id: str) -> int:
        with self._lock:
            return self._running.get(tenant_id, 0)
