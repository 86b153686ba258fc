"""Large detections in worker processes: one principal's big bodies cannot hold the interpreter
another principal's check runs in (issue 31, fair lane).

A body larger than ``service.routes.detect.INLINE_MAX`` was detected in a worker *thread*. Its
CPU-bound Python (the probe sketch's and the ledger's k-gram hashes: about 40 ms of an 8,000-id
body, almost all of it holding the GIL) then shared one interpreter with the event loop serving
everyone else: each step of another principal's small check waited for the interpreter
(``sys.getswitchinterval``) behind it, and a stream of such bodies on 4 connections took
another tenant's p99 to 0.9-3.7x its idle p99 (bench.detect_flood, issue 31 third round).

Here those two steps, the probe sketch (``service.access.gate._sketch_of``) and the core
(:func:`service.detection.detect`), run in a small pool of processes (``detect_workers``, 1 by
default; 0 keeps the worker thread). Each worker opens the same store and tokenizer as the
gateway (no model: detection reads token ids and keys, never weights) and answers exactly what
the gateway's thread would: the same function over the same store. What stays in the gateway
is what must be shared by its requests: the principal's lane and slot, the budgets and probe
families' writes (one writer, :mod:`service.access.group_commit`), the tier's shaping and
signing, the metrics.

A worker keeps keys as long as the gateway's cache does (``key_cache_seconds``, 2 s by
default): the gateway clears its own cache when a key is revoked or rotated through it, and a
worker, which is not told, sees the change within that time, as another replica does. (Read on
every request instead, the keys and signing key cost the flood below a third of its answers.)
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import Any, Callable

log = logging.getLogger("hallmark.access")

_services = None
"""The worker process's own :class:`service.state.Services` (set by :func:`_start`)."""


class _Tokenizer:
    """What detection reads of an engine: its tokenizer, vocabulary size and end ids."""

    def __init__(self, path: str, vocab_size: int | None, eos_ids: frozenset[int]) -> None:
        self.path = path
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self._tokenizer = None

    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.path)
        return self._tokenizer


def _start(settings, store_settings, tokenizer_path: str, vocab_size, eos_ids) -> None:
    """A worker's start: the store, the tokenizer and the detector's compiled paths."""
    global _services
    _exit_with(os.getppid())
    _lower_priority(settings.detect_worker_nice)
    from keys.db import open_store
    from service import warmup
    from service.state import Services

    store = open_store(store_settings, require_kek=True)
    engine = _Tokenizer(tokenizer_path, vocab_size, eos_ids)
    _services = Services(settings=settings, store=store, engine=engine)
    warmup.warm_detection(engine)


WORKER_NICE = 10
"""How much lower than the gateway's the workers' CPU priority is by default (added to their
nice value; the gateway's is ``detect_worker_nice``). The gateway's own process runs every
principal's small checks on its event loop; a worker runs the large bodies, and under a flood
those are one principal's stream back to back. At the same priority the kernel shared the
cores evenly between the two, and on a busy 2-core box another tenant's check waited for a
core behind the flood's detection (issue 31 item 5: its p99 1.2-5.7x its idle p99,
bench.detect_flood). Lower, a worker takes what the gateway leaves: the flood keeps the
leftover capacity, not a core of its own. An unprivileged process may lower its priority,
never raise it back, so a worker stays lower for its life."""


def _lower_priority(nice: int = WORKER_NICE) -> None:
    if not nice:
        return
    try:
        os.nice(nice)
    except OSError:  # not permitted here: the worker runs at the gateway's priority
        log.warning("could not lower the detection worker's priority")


def _exit_with(parent: int) -> None:
    """End this worker once the gateway that started it is gone: a gateway ended without its
    exit handlers (killed, os._exit) left its workers running, 630 MB each (found in this
    branch's benches)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="hallmark-parent-watch", daemon=True).start()


def _detect(identity, body, options: dict[str, Any]) -> dict[str, Any]:
    from service import detection

    return detection.detect(_services, identity, body, counted=False, **options)


def _count_tokens(text: str) -> int:
    from service import detection

    return len(detection.Tokenised(_services.engine.tokenizer()).encode(text)[0])


def _sketch(fn: Callable[..., Any], secret: bytes, body, k: int):
    return fn(_services, secret, body, k)


def _ready() -> bool:
    return _services is not None


class Offload:
    def __init__(self, services, workers: int) -> None:
        self.workers = workers
        self._pool = self._new_pool(services)

    def _new_pool(self, services) -> ProcessPoolExecutor:
        engine = services.engine
        tokenizer = engine.tokenizer()
        path = getattr(tokenizer, "name_or_path", None) or getattr(engine, "model_name", None)
        workers = self.workers
        pool = ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start,
            initargs=(services.settings, services.store.settings, path, getattr(engine, "vocab_size", None),
                      frozenset(getattr(engine, "eos_ids", None) or ())))
        for _ in range(workers):  # started now, not by the first large body
            pool.submit(_ready).add_done_callback(_log_failure)
        return pool

    def restart(self, services) -> None:
        old, self._pool = self._pool, self._new_pool(services)
        old.shutdown(wait=False, cancel_futures=True)

    async def sketch(self, fn: Callable[..., Any], services, secret: bytes, body, k: int):
        """``fn(services, secret, body, k)`` (the gate's probe sketch, sent by name) in a worker."""
        try:
            return await asyncio.wrap_future(self._pool.submit(_sketch, fn, secret, body, k))
        except BrokenProcessPool:
            log.warning("a detection worker died; starting another")
            self.restart(services)
            return await asyncio.to_thread(fn, services, secret, body, k)

    async def count_tokens(self, services, text: str) -> int:
        """The text's tokens as sent (``detection.Tokenised.encode``), counted in a worker: the
        public tier's length check of a large text, Python that would otherwise run in a
        gateway thread beside the event loop."""
        try:
            return await asyncio.wrap_future(self._pool.submit(_count_tokens, text))
        except BrokenProcessPool:
            log.warning("a detection worker died; starting another")
            self.restart(services)
            from service import detection

            tokenised = detection.Tokenised(services.engine.tokenizer())
            return len((await asyncio.to_thread(tokenised.encode, text))[0])

    async def call(self, services, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` (a module's function, sent by name; it needs none of the worker's
        services) in a worker: e.g. a large body's JSON parse and validation
        (service.routes.detect), which would otherwise hold the gateway's interpreter."""
        try:
            return await asyncio.wrap_future(self._pool.submit(fn, *args))
        except BrokenProcessPool:
            log.warning("a detection worker died; starting another")
            self.restart(services)
            return await asyncio.to_thread(fn, *args)

    async def detect(self, fn: Callable[..., Any], services, identity, body) -> dict[str, Any]:
        """``fn(services, identity, body)`` (:func:`service.detection.detect`, or a partial of
        it) in a worker; the request's tokenisations are not sent (the worker makes its own)."""
        options = dict(fn.keywords) if isinstance(fn, partial) else {}
        options.pop("tokens", None)
        options.pop("counted", None)
        try:
            found = await asyncio.wrap_future(self._pool.submit(_detect, identity, body, options))
        except BrokenProcessPool:
            # A worker died (killed, out of memory): this request in a thread, later ones in a new pool.
            log.warning("a detection worker died; starting another")
            self.restart(services)
            return await asyncio.to_thread(fn, services, identity, body)
        services.metrics.detections.labels("watermarked" if found.get("watermarked") else "not_watermarked").inc()
        return found

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _log_failure(future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("a detection worker did not start: %r", future.exception())


_lock = threading.Lock()


def offload_of(services) -> Offload | None:
    """The gateway's worker pool (started on first use), or None with ``detect_workers`` 0."""
    workers = getattr(services.settings, "detect_workers", 0)
    if not workers:
        return None
    found = getattr(services, "_offload", None)
    if found is None:
        with _lock:
            found = getattr(services, "_offload", None)
            if found is None:
                found = services._offload = Offload(services, workers)
    return found


def offloadable(fn: Callable[..., Any]) -> bool:
    from service import detection

    return (fn.func if isinstance(fn, partial) else fn) is detection.detect


__all__ = ["BrokenProcessPool", "Offload", "offload_of", "offloadable"]
