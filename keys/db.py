"""Opening the store: engines, sessions, transactions, and the checks that turn database
faults into one-line errors.

SQLite (the embedded default) runs in WAL mode with foreign keys on and a busy timeout;
SQLAlchemy, not the sqlite3 driver, emits BEGIN, so SELECTs and DDL are transactional and
a write transaction can take the write lock up front (``BEGIN IMMEDIATE``) instead of
failing when it upgrades from a stale read. PostgreSQL is reached through psycopg 3
(``postgresql+psycopg://``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from keys import migrate
from keys.errors import (
    ConcurrentChange,
    ConfigError,
    KeyStoreError,
    NotMigrated,
    ReadOnlyStore,
    StoreBusy,
    StoreUnavailable,
)
from keys.kek import Keyring, load_keyring
from keys.settings import StoreSettings

log = logging.getLogger("hallmark.keys")

_BEGIN_OPTION = "hallmark_sqlite_begin"
_UPGRADE_HINT = "run `hallmark db upgrade`"


def parse_url(url: str) -> URL:
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError("HALLMARK_DATABASE_URL is not a database URL; use sqlite:///path.db "
                          "or postgresql+psycopg://user@host:5432/db") from None
    if parsed.drivername in ("postgres", "postgres+psycopg"):  # the libpq spelling
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise ConfigError(f"unsupported database {parsed.get_backend_name()!r} in "
                          "HALLMARK_DATABASE_URL; use sqlite or postgresql+psycopg")
    if parsed.get_backend_name() == "postgresql" and parsed.drivername != "postgresql+psycopg":
        # psycopg 3 is the only PostgreSQL driver installed; say so instead of an ImportError.
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def display_url(url: URL | str) -> str:
    """The URL with any password masked, for messages and logs."""
    return (url if isinstance(url, URL) else make_url(url)).render_as_string(hide_password=True)


def sqlite_file(url: URL) -> Path | None:
    """The database file of a SQLite URL; None for in-memory and ``file:`` URI databases."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if database in ("", ":memory:") or url.query.get("uri") in ("true", "1"):
        return None
    return Path(database)


def create_store_engine(url: str | URL, *, busy_timeout_ms: int = 5000) -> Engine:
    """An engine with the store's per-connection settings (no connection is made yet).
    Its errors never carry their statement's parameters (``hide_parameters``): those are
    texts, digests, wrapped key material and token hashes, and an unexpected database error
    reaches the log with its message and traceback."""
    parsed = parse_url(url) if isinstance(url, str) else url
    if parsed.get_backend_name() == "postgresql":
        connect_args: dict[str, Any] = {}
        if "connect_timeout" not in parsed.query:
            # libpq's least: a lost database is otherwise noticed by keys.breaker's probe
            connect_args["connect_timeout"] = 2
        return create_engine(parsed, pool_pre_ping=True, connect_args=connect_args, hide_parameters=True)

    engine = create_engine(parsed, connect_args={"timeout": busy_timeout_ms / 1000}, hide_parameters=True)

    @event.listens_for(engine, "connect")
    def _configure_sqlite(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's begin hook below emit BEGIN (the driver skips it for SELECT/DDL).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA foreign_keys = ON")
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            cursor.execute("PRAGMA journal_mode = WAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _begin_sqlite(connection: Any) -> None:
        mode = connection.get_execution_options().get(_BEGIN_OPTION, "DEFERRED")
        connection.exec_driver_sql(f"BEGIN {mode}")

    return engine


def translate_error(exc: BaseException, url: URL | str) -> KeyStoreError | None:
    """The one-line domain error for a database fault, or None if it is not one we know."""
    if isinstance(exc, KeyStoreError):
        return exc
    if not isinstance(exc, DBAPIError):
        return None
    shown = display_url(url)
    message = str(exc.orig) if exc.orig is not None else str(exc)
    first_line = message.strip().splitlines()[0] if message.strip() else type(exc).__name__
    lowered = message.lower()
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if "readonly database" in lowered or "read-only" in lowered or sqlstate == "25006":
        return ReadOnlyStore(f"the database {shown} is read-only; make it writable for this user "
                             "or point HALLMARK_DATABASE_URL at a writable database")
    if "database is locked" in lowered or "database is busy" in lowered:
        return StoreBusy(f"the database {shown} stayed locked by another writer; retry")
    if "no such table" in lowered or sqlstate == "42P01":
        return NotMigrated(f"the database {shown} is not migrated; {_UPGRADE_HINT}")
    if sqlstate in ("40001", "40P01"):
        return ConcurrentChange("a concurrent change to the same rows won; retry")
    if isinstance(exc, IntegrityError):
        return ConcurrentChange(f"the change conflicts with data committed meanwhile "
                                f"({first_line}); retry")
    if isinstance(exc, OperationalError):
        return StoreUnavailable(f"cannot use the database {shown}: {first_line}; check "
                                "HALLMARK_DATABASE_URL and that the database is reachable")
    return None


class Store:
    """An opened store: its engine, session factory and (loaded on first use) keyring."""

    def __init__(self, settings: StoreSettings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.url = engine.url
        # Sessions know their store: the ledger's look-ups reach the log key through it
        # (ledger.log.tlog.authority) to cite only entries the log holds as written.
        info = {"hallmark.store": self}
        self.sessions: sessionmaker[Session] = sessionmaker(engine, expire_on_commit=False, info=info)
        # SQLite: take the write lock at BEGIN, so concurrent writers queue on the busy
        # timeout instead of failing when a stale read transaction tries to write.
        self._write_sessions: sessionmaker[Session] = sessionmaker(
            engine.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"}), expire_on_commit=False, info=info
        )
        self.opened: dict[str, Any] = {}
        """Secrets that packages built on the store opened with its keyring, kept for the
        store's life under their own names (the transparency-log key: :func:`ledger.log.key.
        store_log_key`). The store holds them without knowing them: it never imports them."""
        self.breaker: Any = None
        """A PostgreSQL store's circuit breaker (keys.breaker) once a long-running process started
        one (the gateway): while open, :meth:`transaction` fails at once as StoreUnavailable."""
        self.sequencing = True
        """False only in a benchmark's control arm: ledger entries are written without
        transparency-log leaves (never cited by detection, and no receipt carries a proof)."""

    @cached_property
    def keyring(self) -> Keyring:
        """The KEK keyring from the settings; :class:`~keys.errors.KekError` if unusable."""
        return load_keyring(self.settings)

    @contextmanager
    def transaction(self, *, write: bool = True) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on any error,
        with database faults raised as :class:`~keys.errors.KeyStoreError`."""
        factory = self._write_sessions if write else self.sessions
        if self.breaker is not None:
            self.breaker.check()
        session = factory()
        try:
            yield session
            session.commit()
        except BaseException as exc:
            session.rollback()
            mapped = translate_error(exc, self.url)
            if self.breaker is not None and isinstance(mapped, StoreUnavailable):
                self.breaker.failed(exc)
            if mapped is not None and mapped is not exc:
                raise mapped from None
            raise
        finally:
            session.close()

    def close(self) -> None:
        self.engine.dispose()


def _writable(path: Path) -> bool:
    if os.access in os.supports_effective_ids:
        return os.access(path, os.W_OK, effective_ids=True)
    return os.access(path, os.W_OK)


def _check_sqlite_file(path: Path, *, create: bool) -> None:
    if not path.exists():
        if not create:
            raise NotMigrated(f"the database file {path} does not exist; {_UPGRADE_HINT} to create "
                              "it (or set HALLMARK_DATABASE_URL)")
        try:
            # The directory will hold wrapped keys and token hashes: keep it to this user.
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # So is the file, whatever the umask: SQLite gives its -wal and -shm files the
            # database file's mode, so they are created 0600 too.
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            pass
        except OSError as exc:
            raise StoreUnavailable(f"cannot create the database file {path}: {exc.strerror}") from None
    elif not _writable(path):
        raise ReadOnlyStore(f"the database file {path} is read-only; make it writable for this "
                            "user or point HALLMARK_DATABASE_URL at a writable database")
    if not _writable(path.parent):
        raise ReadOnlyStore(f"the directory {path.parent} of the database file is not writable "
                            "(SQLite keeps its -wal and -shm files there); make it writable")


def ensure_migrated(engine: Engine) -> None:
    """Refuse a database whose schema is missing or not at this code's head revision."""
    shown = display_url(engine.url)
    try:
        current = migrate.current_revision(engine)
    except DBAPIError as exc:
        raise translate_error(exc, engine.url) or exc from None
    head = migrate.head_revision()
    if current == head:
        return
    if current is None:
        raise NotMigrated(f"the database {shown} is not migrated; {_UPGRADE_HINT}")
    if current in migrate.known_revisions():
        raise NotMigrated(f"the database {shown} is at schema revision {current} but this Hallmark "
                          f"needs {head}; {_UPGRADE_HINT}")
    raise NotMigrated(f"the database {shown} is at schema revision {current}, which this Hallmark "
                      "does not know (a newer release migrated it); upgrade Hallmark")


def open_store(settings: StoreSettings, *, require_kek: bool = False, check_schema: bool = True,
               create: bool = False) -> Store:
    """Open the store the settings describe.

    ``require_kek`` loads the keyring now (raising :class:`~keys.errors.KekError` early),
    ``check_schema`` refuses an unmigrated database, ``create`` lets a missing SQLite file
    be created (for ``hallmark db upgrade`` only).
    """
    url = parse_url(settings.database_url)
    path = sqlite_file(url)
    if path is not None:
        _check_sqlite_file(path, create=create)
    store = Store(settings, create_store_engine(url, busy_timeout_ms=settings.busy_timeout_ms))
    try:
        if require_kek:
            store.keyring  # noqa: B018 - loads and validates the KEK now
        if check_schema:
            ensure_migrated(store.engine)
    except BaseException:
        store.close()
        raise
    return store
