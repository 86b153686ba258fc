"""A circuit breaker for a PostgreSQL store: while the database is unreachable, every
transaction fails at once as :class:`~keys.errors.StoreUnavailable`, and the store recovers
by itself when it is back.

Why a probe, not timeouts. A database lost behind a network that drops packets (or a proxy
that stops forwarding) never answers: a query on an open connection waits forever (the bytes
were acknowledged, so TCP sees nothing wrong) and a new connection waits for libpq's connect
timeout, at least 2 s. No per-query deadline fits both a 1 ms look-up and a long listing, so
one thread per process asks the database ``SELECT 1`` every :data:`PROBE_EVERY` seconds on its
own connection and gives it :data:`PROBE_TIMEOUT` to answer (a request that meets a
connection failure asks it to probe at once). When it does not answer (an error, such as a
terminated backend, is asked again on a fresh connection first), the breaker opens:

- :meth:`Breaker.check` (called by ``Store.transaction`` before it takes a connection) raises
  at once, so a request that needs the database answers 503 without waiting;
- every connection of the pool has its socket shut down, so a query (or the pool's ping)
  already waiting fails now instead of never, and the pool is emptied;
- the probe reconnects every :data:`PROBE_EVERY` seconds; its first answer closes the breaker
  and new transactions connect afresh.

- a connection the pool is opening meanwhile stops waiting too (the attempt goes on alone
  and closes what it gets), and no new one is attempted while open.

So a request waits at most about ``PROBE_EVERY + PROBE_TIMEOUT`` (0.75 s) for a database that
stopped answering. SQLite needs none of this (a local file).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from keys.errors import StoreUnavailable

log = logging.getLogger("hallmark.keys")

PROBE_EVERY = 0.25
PROBE_TIMEOUT = 0.5
CONNECT_TIMEOUT = 2
"""libpq's (and psycopg's) smallest connect timeout, in seconds."""


class Breaker:
    """The breaker of one store's engine (see the module docstring). Start it with :meth:`start`."""

    def __init__(self, engine: Any, *, probe_every: float = PROBE_EVERY, probe_timeout: float = PROBE_TIMEOUT) -> None:
        self.engine = engine
        self.probe_every = probe_every
        self.probe_timeout = probe_timeout
        self.open_since: float | None = None
        self.trips = 0
        self._connections: dict[int, Any] = {}  # id(dbapi connection) -> the connection, while open
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._silent: bool | None = None
        self._thread: threading.Thread | None = None
        self._probe: Any = None
        from sqlalchemy import event

        # Every connection of the pool, not only those checked out: the pool's ping of an idle
        # connection at checkout (pool_pre_ping) waits on a silent network too.
        event.listen(engine, "do_connect", self._do_connect)
        event.listen(engine, "connect", self._on_connect)
        event.listen(engine, "close", self._forget)
        event.listen(engine, "close_detached", self._forget_detached)
        engine.pool.dispose()  # connections made before it listened (the schema check's) are not known to it

    # --- what requests see --------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self.open_since is not None

    def check(self) -> None:
        if self.open_since is not None:
            raise StoreUnavailable(f"the database has not answered for {time.monotonic() - self.open_since:.1f} s "
                                   "(circuit open; it is probed every "
                                   f"{self.probe_every:g} s and used again as soon as it answers)")

    def failed(self, exc: BaseException) -> None:
        """A transaction failed with a connection-level error: the probe asks now (one dropped
        connection, a terminated backend, is no outage: only the probe's verdict opens)."""
        sqlstate = getattr(getattr(exc, "orig", None), "sqlstate", None)
        if sqlstate is None or sqlstate.startswith(("08", "57P")):
            self._wake.set()

    # --- the probe ----------------------------------------------------------------------

    def start(self) -> "Breaker":
        self._thread = threading.Thread(target=self._run, name="hallmark-db-probe", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(CONNECT_TIMEOUT + 1)
        self._close_probe()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.probe_every)
            self._wake.clear()
            if self._stop.is_set():
                return
            ok = self._ask()
            if not ok and self._silent is False:
                ok = self._ask()  # it answered, with an error (its connection was ended): ask afresh
            if not ok and self.open_since is None:
                self.trip(f"no answer to the probe within {self.probe_timeout:g} s")
            elif ok and self.open_since is not None:
                log.warning("the database answers again after %.1f s; circuit closed",
                            time.monotonic() - self.open_since)
                self.open_since = None

    def _ask(self) -> bool:
        """Whether the database answered ``SELECT 1`` in time; :attr:`_silent` says whether a
        failure was silence (a timeout) or an answer (an error, a closed connection)."""
        started = time.monotonic()
        try:
            if self._probe is None:
                self._probe = _connect(self.engine)
            self._probe.timeout = self.probe_timeout
            self._probe.execute("SELECT 1").fetchone()
            return True
        except Exception:  # noqa: BLE001 - any failure is an unanswered probe
            self._silent = time.monotonic() - started >= self.probe_timeout
            self._close_probe()
            return False

    def _close_probe(self) -> None:
        probe, self._probe = self._probe, None
        if probe is not None:
            _shut(probe)
            try:
                probe.close()
            except Exception:  # noqa: BLE001 - a dead connection may fail to close
                pass

    def trip(self, why: str) -> None:
        with self._lock:
            if self.open_since is not None:
                return
            self.open_since = time.monotonic()
            self.trips += 1
            waiting = list(self._connections.values())
        log.error("the database is unreachable (%s): circuit open, requests that need it answer 503 at once", why)
        for connection in waiting:  # queries waiting on a silent network fail now
            _shut(connection)
        try:
            self.engine.pool.dispose()  # idle connections: likely dead, never pinged through a silent network
        except Exception:  # noqa: BLE001
            pass

    # --- the pool's connections ---------------------------------------------------------

    def _do_connect(self, dialect: Any, record: Any, cargs: Any, cparams: Any) -> Any:
        """A new connection for the pool, unless the breaker is open; and if it opens while this
        one waits for the server (which a silent network makes take the whole connect timeout),
        the wait ends then: the attempt goes on alone and closes what it gets."""
        failure = dialect.loaded_dbapi.OperationalError
        if self.open_since is not None:
            raise failure("the database is unreachable (circuit open)")
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def attempt() -> None:
            try:
                outcome["connection"] = dialect.connect(*cargs, **cparams)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                outcome["error"] = exc
            with self._lock:
                done.set()
                late = outcome.get("abandoned") and "connection" in outcome
            if late:
                outcome["connection"].close()

        threading.Thread(target=attempt, name="hallmark-db-connect", daemon=True).start()
        while not done.wait(0.05):
            with self._lock:
                if self.open_since is not None and not done.is_set():
                    outcome["abandoned"] = True
                    raise failure("the database is unreachable (circuit opened while connecting)")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["connection"]

    def _on_connect(self, dbapi_connection: Any, record: Any) -> None:
        with self._lock:
            self._connections[id(dbapi_connection)] = dbapi_connection

    def _forget(self, dbapi_connection: Any, record: Any) -> None:
        with self._lock:
            self._connections.pop(id(dbapi_connection), None)

    def _forget_detached(self, dbapi_connection: Any) -> None:
        self._forget(dbapi_connection, None)


def _connect(engine: Any) -> Any:
    """The probe's own connection (outside the pool), every wait of which ends after its ``timeout``."""
    import psycopg

    class Probe(psycopg.Connection):
        timeout: float = PROBE_TIMEOUT

        def wait(self, gen, interval=0.1, timeout=None):  # noqa: ANN001 - psycopg's signature
            return super().wait(gen, interval=interval, timeout=self.timeout)

    _, params = engine.dialect.create_connect_args(engine.url)
    params = {**params, "connect_timeout": CONNECT_TIMEOUT, "autocommit": True}
    return Probe.connect(**params)


def _shut(connection: Any) -> None:
    """Shut the connection's socket down (both ways): whoever waits on it wakes with an error.
    A connection closed meanwhile has no socket any more (its fd may be another's by now)."""
    try:
        if connection.closed:
            return
        fd = connection.pgconn.socket
    except Exception:  # noqa: BLE001 - closed already
        return
    try:
        duplicate = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        duplicate.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        duplicate.close()
