"""The HTTP gateway: ``create_app(settings)`` wires the routers of :mod:`service.routes`,
the error handlers (:mod:`service.http_errors`) and the middleware (:mod:`service.body_limit`,
:mod:`service.middleware`, :mod:`service.request_log`)
around the services a running gateway holds (:class:`service.state.Services`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable, TypeVar

from sqlalchemy.orm import Session

from fastapi import FastAPI

from keys.db import Store, open_store
from keys.errors import ConcurrentChange
from ledger.entries import recover_interrupted
from ledger.signing import ensure_signing_key
from ledger.log.tlog import ensure_log
from keys.settings import StoreSettings
from service.engines.base import Engine
from service import http_errors, openapi, warmup
from service.body_limit import BodyLimit
from service.middleware import RequestMetrics
from service.request_log import RequestLog
from service.routes import admin, detect, generate, generations, ledger_log, openai, ops, provenance
from service.settings import ServiceSettings
from service.state import Services
from service.ui import mount_ui

log = logging.getLogger("hallmark.app")
T = TypeVar("T")


def _prepare_provenance(store: Store) -> None:
    """At start: make sure the transparency log has its key (created, with what the store
    already holds adopted as its first leaves, where this role may: SQLite, or the owner),
    close the streams a dead predecessor left open (as interrupted), and make sure a signing
    key the log holds exists for receipts. On PostgreSQL under the gateway's restricted role
    a missing log key or signing key stops the start with what to run as the owner."""
    _, adopted = _retrying(store, lambda session: ensure_log(session, store.keyring, actor="service:start"))
    if adopted:
        log.warning("transparency log created: %d existing ledger entries and signing keys adopted as its "
                    "first leaves", adopted)
    closed = _retrying(store, recover_interrupted)
    if closed:
        log.warning("closed %d generation(s) left open by a stopped process as interrupted: %s",
                    len(closed), ", ".join(closed[:20]))
    _retrying(store, lambda session: ensure_signing_key(session, store.keyring, actor="service:start"))


def _start_breaker(store: Store):
    """A PostgreSQL store's circuit breaker (keys.breaker): a lost database answers 503 at once."""
    if store.engine.dialect.name != "postgresql" or store.breaker is not None:
        return None
    from keys.breaker import Breaker

    store.breaker = Breaker(store.engine).start()
    return store.breaker


def _metrics_listener(settings: ServiceSettings, services: Services):
    """/metrics alone on ``settings.metrics_listen`` (host:port), or None."""
    if not settings.metrics_listen:
        return None
    from prometheus_client import start_http_server

    from service.metrics import CoarseDetections

    host, _, port = settings.metrics_listen.rpartition(":")
    server, _ = start_http_server(int(port), addr=host or "127.0.0.1", registry=CoarseDetections(services.metrics.registry))
    log.info("metrics on their own listener: http://%s:%s/metrics", host or "127.0.0.1", port)
    return server


async def _flush_token_uses(services: Services) -> None:
    """Write when tokens were last used every FLUSH_EVERY seconds (service.token_uses)."""
    from service.token_uses import FLUSH_EVERY

    while True:
        await asyncio.sleep(FLUSH_EVERY)
        try:
            await asyncio.to_thread(services.token_uses.flush)
        except Exception:  # noqa: BLE001 - a database outage: kept for the next round
            log.warning("could not record API tokens' last use; retrying")


async def _publish_checkpoints(services: Services) -> None:
    """Publish a checkpoint at least every ``checkpoint_every_seconds`` after this process
    logged an entry (the entry-count bound is kept where entries are logged)."""
    period = services.settings.checkpoint_every_seconds
    while True:
        await asyncio.sleep(min(period, 5.0) / 2)
        try:
            await asyncio.to_thread(services.publish_checkpoint, if_older_than=period)
        except Exception:  # noqa: BLE001 - a database outage: the next round retries
            log.warning("could not publish a transparency-log checkpoint; retrying", exc_info=True)


def _retrying(store: Store, step: Callable[[Session], T], attempts: int = 5) -> T:
    """Run one start-up step in its own transaction, again when it collides with another
    replica starting at the same moment (both create the first signing key, or both close
    the same dead writer's streams): the loser's retry then sees the winner's rows."""
    for attempt in range(attempts):
        try:
            with store.transaction() as session:
                return step(session)
        except ConcurrentChange:
            if attempt == attempts - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def create_app(settings: ServiceSettings, *, engine: Engine | None = None,
               store_settings: StoreSettings | None = None, store: Store | None = None) -> FastAPI:
    """The gateway. ``engine``/``store`` may be given (tests, embedding); otherwise they are
    built from the settings and started with the app."""
    state: dict[str, Services] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own_store = store or open_store(store_settings or StoreSettings(), require_kek=True)
        own_engine = engine
        if own_engine is None:
            from service.engines.factory import create_engine

            own_engine = create_engine(settings)
        services = Services(settings=settings, store=own_store, engine=own_engine)
        breaker = _start_breaker(own_store)
        await asyncio.to_thread(_prepare_provenance, own_store)
        await asyncio.to_thread(services.publish_checkpoint)
        publisher = asyncio.create_task(_publish_checkpoints(services))
        uses = asyncio.create_task(_flush_token_uses(services))
        state["services"] = services
        app.state.services = services
        await own_engine.start()
        # The detector's compiled paths and the tokenizer's tables, before the server accepts a
        # connection (so before /readyz answers): no request compiles them (service.warmup).
        await asyncio.to_thread(warmup.warm_detection, own_engine)
        await asyncio.to_thread(warmup.warm_requests, services)
        # Models, tokenizers and modules are loaded now: move them out of the collector's
        # reach, and collect less often, so that no request waits behind a long collection
        # (measured: 60 ms p99 spikes on /v1/detect with the default thresholds).
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 50, 100)
        metrics_server = _metrics_listener(settings, services)
        try:
            yield
        finally:
            if metrics_server is not None:
                metrics_server.shutdown()
                metrics_server.server_close()
            publisher.cancel()
            uses.cancel()
            try:
                await asyncio.to_thread(services.token_uses.flush)
            except Exception:  # noqa: BLE001 - the store may be down at shutdown
                log.warning("could not record API tokens' last use at shutdown")
            try:  # what this process logged is handed to witnesses before it goes
                await asyncio.to_thread(services.publish_checkpoint, if_older_than=0.0)
            except Exception:  # noqa: BLE001 - the store may be down at shutdown
                log.warning("could not publish a last transparency-log checkpoint at shutdown")
            await own_engine.stop()
            if breaker is not None:
                own_store.breaker = None
                await asyncio.to_thread(breaker.stop)
            if store is None:
                own_store.close()
            # Back in the collector's reach, so the interpreter's final collection frees them:
            # objects still frozen at exit make triton's nanobind print ~40 lines of "leaked"
            # reports after every Ctrl-C.
            gc.unfreeze()

    # /docs is served by mount_ui with local Swagger UI files (FastAPI's default loads them from a
    # CDN: a blank page offline); ReDoc's bundle loads its logo from a CDN, so /redoc is off.
    app = FastAPI(title="Hallmark", version="0.1.0", description=openapi.DESCRIPTION, lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    http_errors.install(app)
    openapi.install(app, settings, state)
    for routes in (generate, openai, detect, generations, provenance, ledger_log, ops, admin):
        app.include_router(routes.router)
    mount_ui(app)
    app.add_middleware(RequestMetrics, services=state)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    # Outermost: it logs what the body limit refuses too, and every answer carries the id.
    app.add_middleware(RequestLog, routes=app.router.routes)
    return app
