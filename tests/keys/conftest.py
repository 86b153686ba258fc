"""Fixtures of the key store's tests: real SQLite files and the real PostgreSQL server.

Every test that takes ``database_url`` runs twice: on a fresh migrated SQLite file and
(marked ``postgres``) on the run's migrated PostgreSQL database, emptied before the test.
Migration tests get fresh empty databases. All PostgreSQL databases of a run have random
names and are dropped at its end. When the
server (``HALLMARK_TEST_POSTGRES_URL``, default 127.0.0.1:5432, user postgres) is not
reachable those tests skip with the reason, unless ``HALLMARK_REQUIRE_POSTGRES=1`` (CI),
which makes them fail.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from sqlalchemy import MetaData, create_engine, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from keys import migrate
from keys.db import Store, create_store_engine, open_store
from keys.kek import Kek, Keyring
from keys.lifecycle import create_key
from keys.material import StoredKey, active_key
from keys.settings import StoreSettings
from keys.tenants import TenantInfo, create_tenant
from watermark.spec import WatermarkSpec

PG_ADMIN_URL = os.environ.get("HALLMARK_TEST_POSTGRES_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REQUIRE_POSTGRES = os.environ.get("HALLMARK_REQUIRE_POSTGRES") == "1"
RUN_ID = secrets.token_hex(4)
APP_TABLES = ("tenants", "watermark_keys", "api_tokens", "ledger_entries", "audit_events", "signing_keys",
              "ledger_kgrams", "log_keys", "log_leaves", "log_nodes", "log_checkpoints", "probe_queries",
              "access_spend")
_ENV_VARS = ("HALLMARK_DATABASE_URL", "HALLMARK_KEK", "HALLMARK_KEK_FILE", "HALLMARK_ACTOR",
             "HALLMARK_KEK_PREVIOUS", "HALLMARK_KEK_PREVIOUS_FILE",
             "HALLMARK_BUSY_TIMEOUT_MS")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's own HALLMARK_* settings must not leak into the tests."""
    for name in _ENV_VARS:
        monkeypatch.delenv(name, raising=False)


# --- PostgreSQL ------------------------------------------------------------------------


class PgServer:
    """Creates throwaway databases (random names) on the test server; drops them all."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = make_url(admin_url)
        self.engine = create_engine(self.admin_url, isolation_level="AUTOCOMMIT",
                                    connect_args={"connect_timeout": 3})
        self.created: list[str] = []
        self._count = 0
        # Several servers live in one run (the keys' fixture, fault and limit tests): each
        # names its databases apart, or the second one's first CREATE DATABASE collides.
        self._tag = secrets.token_hex(2)

    def url_for(self, name: str) -> str:
        return self.admin_url.set(database=name).render_as_string(hide_password=False)

    def create_database(self) -> str:
        self._count += 1
        name = f"hallmark_test_{RUN_ID}_{self._tag}_{self._count}"
        with self.engine.connect() as connection:
            connection.exec_driver_sql(f"CREATE DATABASE {name}")
        self.created.append(name)
        return name

    def drop_database(self, name: str) -> None:
        with self.engine.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        self.created.remove(name)

    def close(self) -> None:
        for name in reversed(list(self.created)):
            self.drop_database(name)
        self.engine.dispose()


def reachable_pg_server() -> PgServer:
    """The test server, or the run skips (fails under HALLMARK_REQUIRE_POSTGRES=1) when it
    is unreachable."""
    server = PgServer(PG_ADMIN_URL)
    try:
        with server.engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
    except Exception as exc:  # noqa: BLE001
        server.engine.dispose()
        if REQUIRE_POSTGRES:
            pytest.fail(f"PostgreSQL not reachable: {exc}")
        pytest.skip("PostgreSQL not reachable")
    return server


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    server = PgServer(PG_ADMIN_URL)
    try:
        with server.engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any failure to reach the server decides the same way
        server.engine.dispose()
        first = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or ["?"])[0]
        reason = f"PostgreSQL not reachable at {server.admin_url.render_as_string()}: {first}"
        if REQUIRE_POSTGRES:
            pytest.fail(f"{reason} (HALLMARK_REQUIRE_POSTGRES=1 requires it)", pytrace=False)
        pytest.skip(f"{reason}; set HALLMARK_REQUIRE_POSTGRES=1 to make this a failure")
    try:
        yield server
    finally:
        server.close()


class PgDatabase:
    """The run's migrated database, emptied before each test that uses it.

    Creating and dropping a database per test costs a quarter of a second each on the
    server; emptying the tables costs a few milliseconds. Emptying bypasses the audit
    log's append-only triggers (``session_replication_role = replica``, superuser only):
    the harness may reset what the application must never rewrite.
    """

    def __init__(self, server: PgServer) -> None:
        self.name = server.create_database()
        self.url = server.url_for(self.name)
        engine = create_store_engine(self.url)
        try:
            migrate.upgrade(engine)
        finally:
            engine.dispose()
        self.admin = create_engine(self.url, isolation_level="AUTOCOMMIT")

    def reset(self) -> str:
        with self.admin.connect() as connection:
            # Whatever an earlier (failed) test left connected must not hold locks.
            connection.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()")
            connection.exec_driver_sql("SET session_replication_role = replica")
            connection.exec_driver_sql(f"TRUNCATE {', '.join(APP_TABLES)} RESTART IDENTITY CASCADE")
            connection.exec_driver_sql("SET session_replication_role = DEFAULT")
            connection.exec_driver_sql("UPDATE store_kek SET kek_id = NULL, changed_at = NULL")
            connection.exec_driver_sql("UPDATE log_head SET size = 0, border = '', mac = NULL, updated_at = NULL")
            connection.execute(text("UPDATE alembic_version SET version_num = :head"),
                               {"head": migrate.head_revision()})
        return self.url

    def close(self) -> None:
        self.admin.dispose()


@pytest.fixture(scope="session")
def pg_database(pg_server: PgServer) -> Iterator[PgDatabase]:
    database = PgDatabase(pg_server)
    try:
        yield database
    finally:
        database.close()


# --- SQLite ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "hallmark.db"
    engine = create_store_engine(f"sqlite:///{path}")
    try:
        migrate.upgrade(engine)
    finally:
        engine.dispose()  # checkpoints the WAL into the file, so the file alone is complete
    return path


# --- a fresh migrated database per test, on both backends ------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        path = tmp_path / "hallmark.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    yield request.getfixturevalue("pg_database").reset()


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    """A fresh migrated SQLite database only (for SQLite-specific behaviour)."""
    path = tmp_path / "hallmark.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh migrated PostgreSQL database only (for row locks and real concurrency).
    Tests using it must carry ``@pytest.mark.postgres``."""
    yield request.getfixturevalue("pg_database").reset()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with no schema at all (for migration tests)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    server: PgServer = request.getfixturevalue("pg_server")
    name = server.create_database()
    try:
        yield server.url_for(name)
    finally:
        server.drop_database(name)


# --- KEKs, settings, stores ------------------------------------------------------------


@pytest.fixture
def kek() -> Kek:
    return Kek.generate()


@pytest.fixture
def keyring(kek: Kek) -> Keyring:
    return Keyring([kek])


@pytest.fixture
def settings(database_url: str, kek: Kek) -> StoreSettings:
    return StoreSettings(database_url=database_url, kek=SecretStr(kek.to_base64()))


@pytest.fixture
def store(settings: StoreSettings) -> Iterator[Store]:
    opened = open_store(settings, require_kek=True)
    try:
        yield opened
    finally:
        opened.close()


@dataclass(frozen=True)
class TwoTenants:
    """Tenants ``acme`` (with an active key) and ``beta`` (with one when asked), for the tests
    of tenant scoping."""

    acme: TenantInfo
    beta: TenantInfo
    acme_key: StoredKey
    beta_key: StoredKey | None


@pytest.fixture
def two_tenants(store: Store) -> Callable[..., TwoTenants]:
    """``two_tenants(spec=..., beta_key=False)``: create acme and beta, acme's key of ``spec``
    (default: the default spec) and, with ``beta_key``, one for beta too."""

    def make(*, spec: WatermarkSpec | None = None, beta_key: bool = False) -> TwoTenants:
        spec = spec or WatermarkSpec()
        with store.transaction() as session:
            acme = create_tenant(session, name="acme", actor="test")
            beta = create_tenant(session, name="beta", actor="test")
            for tenant in ("acme", "beta") if beta_key else ("acme",):
                create_key(session, store.keyring, tenant=tenant, actor="test", spec=spec)
        with store.transaction(write=False) as session:
            return TwoTenants(acme, beta, active_key(session, store.keyring, tenant_id=acme.id),
                              active_key(session, store.keyring, tenant_id=beta.id) if beta_key else None)

    return make


def assert_refused(url: str, statements: list[str], match: str) -> None:
    """Each statement, in a transaction of its own over a plain connection (no ORM, no store
    checks), fails with a database error matching ``match``."""
    engine = create_engine(url)
    try:
        for statement in statements:
            with pytest.raises(DBAPIError, match=match):
                with engine.begin() as connection:
                    connection.exec_driver_sql(statement)
    finally:
        engine.dispose()


def snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every application table, for 'nothing changed' assertions."""
    engine = create_engine(url)
    try:
        metadata = MetaData()
        metadata.reflect(engine, only=APP_TABLES)
        with engine.connect() as connection:
            return {name: sorted((tuple(row) for row in connection.execute(select(metadata.tables[name]))),
                                 key=repr)
                    for name in APP_TABLES}
    finally:
        engine.dispose()


def count_rows(url: str, table: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar_one()
    finally:
        engine.dispose()


# --- the CLI, in process ---------------------------------------------------------------


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        import json

        return json.loads(self.stdout)


class Cli:
    """Runs ``hallmark`` exactly as the console script does (service.cli.main), in process."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
        self.monkeypatch = monkeypatch
        self.capsys = capsys
        self.outputs: list[str] = []

    def env(self, **values: str | None) -> None:
        for name, value in values.items():
            if value is None:
                self.monkeypatch.delenv(name, raising=False)
            else:
                self.monkeypatch.setenv(name, value)

    def __call__(self, *args: str, **env: str | None) -> CliResult:
        from service.cli import main

        saved = {name: os.environ.get(name) for name in env}
        self.env(**env)
        self.capsys.readouterr()
        self.monkeypatch.setattr(sys, "argv", ["hallmark", *args])
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        captured = self.capsys.readouterr()
        self.outputs.append(captured.out + captured.err)
        return CliResult(code, captured.out, captured.err)

    def ok(self, *args: str, **env: str | None) -> CliResult:
        result = self(*args, **env)
        if result.exit_code != 0:
            raise AssertionError(f"hallmark {' '.join(args)} failed ({result.exit_code}): {result.stderr}")
        return result

    def fails(self, *args: str, **env: str | None) -> CliResult:
        """Run a command that must fail with exactly one line ``error: ...`` on stderr."""
        result = self(*args, **env)
        if result.exit_code == 0:
            raise AssertionError(f"hallmark {' '.join(args)} succeeded: {result.stdout}")
        lines = result.stderr.strip().splitlines()
        if len(lines) != 1 or not lines[0].startswith("error: ") or result.stdout:
            raise AssertionError(f"not one error line: stdout={result.stdout!r} stderr={result.stderr!r}")
        return result


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        database_url: str, kek: Kek) -> Cli:
    runner = Cli(monkeypatch, capsys)
    runner.env(HALLMARK_DATABASE_URL=database_url, HALLMARK_KEK=kek.to_base64(),
               HALLMARK_ACTOR="test:cli")
    return runner
