"""Opening the store: SQLite settings, schema checks, faults turned into one-line errors."""

from __future__ import annotations

import os
import threading

import pytest
from sqlalchemy import text

from keys import migrate
from keys.db import create_store_engine, open_store, parse_url
from keys.errors import ConfigError, NotMigrated, ReadOnlyStore, StoreUnavailable
from keys.settings import StoreSettings
from keys.tenants import create_tenant, list_tenants


def test_sqlite_runs_wal_with_foreign_keys_and_a_busy_timeout(tmp_path):
    engine = create_store_engine(f"sqlite:///{tmp_path / 'x.db'}", busy_timeout_ms=1234)
    try:
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 1234
    finally:
        engine.dispose()


def test_a_new_sqlite_database_and_its_wal_and_shm_are_readable_by_this_user_only(tmp_path, monkeypatch, capsys):
    """Issue 21: `hallmark db upgrade` created the database and its WAL 0644 (every local
    user could read wrapped keys, token hashes and the ledger). Now 0600, whatever the umask."""
    from keys.kek import Kek
    from tests.keys.conftest import Cli

    path = tmp_path / "var" / "hallmark.db"
    old = os.umask(0o022)
    try:
        Cli(monkeypatch, capsys).ok("db", "upgrade", HALLMARK_DATABASE_URL=f"sqlite:///{path}",
                                    HALLMARK_KEK=Kek.generate().to_base64())
        store = open_store(StoreSettings(database_url=f"sqlite:///{path}"))
        try:
            with store.transaction() as session:  # a write: the -wal and -shm files exist now
                create_tenant(session, name="acme", actor="test")
            found = {p.name: oct(p.stat().st_mode & 0o777) for p in path.parent.iterdir()}
        finally:
            store.close()
    finally:
        os.umask(old)
    assert found["hallmark.db"] == "0o600"
    assert {found.get("hallmark.db-wal", "0o600"), found.get("hallmark.db-shm", "0o600")} == {"0o600"}
    assert "hallmark.db-wal" in found and "hallmark.db-shm" in found
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"


def test_sqlite_foreign_keys_are_enforced(sqlite_url):
    store = open_store(StoreSettings(database_url=sqlite_url))
    try:
        with pytest.raises(Exception, match="FOREIGN KEY"):
            with store.engine.begin() as connection:
                connection.execute(text("INSERT INTO api_tokens (id, tenant_id, token_hash, prefix, admin, "
                                        "created_at, scopes) VALUES ('t', 'nope', 'h', 'p', 0, '2026-01-01', '')"))
    finally:
        store.close()


def test_a_missing_sqlite_file_is_not_created_and_says_upgrade(tmp_path):
    path = tmp_path / "var" / "hallmark.db"
    with pytest.raises(NotMigrated) as caught:
        open_store(StoreSettings(database_url=f"sqlite:///{path}"))
    assert "hallmark db upgrade" in caught.value.user_message
    assert not path.exists() and not path.parent.exists()


def test_an_unmigrated_database_is_refused(empty_database_url):
    if empty_database_url.startswith("sqlite"):
        engine = create_store_engine(empty_database_url)
        with engine.connect() as connection:  # an existing but empty SQLite file
            connection.exec_driver_sql("CREATE TABLE unrelated (x INTEGER)")
            connection.commit()
        engine.dispose()
    with pytest.raises(NotMigrated) as caught:
        open_store(StoreSettings(database_url=empty_database_url))
    assert "not migrated" in caught.value.user_message
    assert "hallmark db upgrade" in caught.value.user_message


def test_a_database_from_an_unknown_revision_is_refused(database_url):
    engine = create_store_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = 'ffff'"))
    engine.dispose()
    with pytest.raises(NotMigrated, match="upgrade Hallmark"):
        open_store(StoreSettings(database_url=database_url))


@pytest.mark.skipif(os.geteuid() == 0, reason="file permissions do not bind root "
                    "(test_cli.py covers read-only files as an unprivileged user)")
def test_a_read_only_sqlite_file_is_refused_up_front(sqlite_template, tmp_path):
    path = tmp_path / "ro.db"
    path.write_bytes(sqlite_template.read_bytes())
    path.chmod(0o444)
    with pytest.raises(ReadOnlyStore) as caught:
        open_store(StoreSettings(database_url=f"sqlite:///{path}"))
    assert "read-only" in caught.value.user_message


def test_a_read_only_connection_is_reported_as_read_only(sqlite_template, tmp_path):
    path = tmp_path / "ro.db"
    path.write_bytes(sqlite_template.read_bytes())
    url = f"sqlite:///file:{path}?mode=ro&uri=true"
    store = open_store(StoreSettings(database_url=url))
    try:
        with pytest.raises(ReadOnlyStore) as caught:
            with store.transaction() as session:
                create_tenant(session, name="acme", actor="test")
        assert "read-only" in caught.value.user_message
    finally:
        store.close()


def test_an_unreachable_server_is_one_line_without_the_password():
    settings = StoreSettings(database_url="postgresql+psycopg://u:sekrit@127.0.0.1:1/db?connect_timeout=2")
    with pytest.raises(StoreUnavailable) as caught:
        open_store(settings)
    message = caught.value.user_message
    assert "\n" not in message and "sekrit" not in message and "HALLMARK_DATABASE_URL" in message


@pytest.mark.parametrize("url, driver", [("postgresql://u@h/db", "postgresql+psycopg"),
                                         ("postgres://u@h/db", "postgresql+psycopg"),
                                         ("postgresql+psycopg://u@h/db", "postgresql+psycopg"),
                                         ("sqlite:///x.db", "sqlite")])
def test_urls_are_normalised_to_the_installed_drivers(url, driver):
    assert parse_url(url).drivername == driver


@pytest.mark.parametrize("url", ["not a url", "mysql://localhost/db"])
def test_unsupported_urls_are_refused(url):
    with pytest.raises(ConfigError, match="HALLMARK_DATABASE_URL"):
        open_store(StoreSettings(database_url=url))


def test_a_failed_transaction_leaves_nothing(store):
    with pytest.raises(RuntimeError):
        with store.transaction() as session:
            create_tenant(session, name="ghost", actor="test")
            session.flush()
            raise RuntimeError("boom")
    with store.transaction(write=False) as session:
        assert list_tenants(session) == []


def test_sqlite_writers_queue_instead_of_failing(sqlite_url):
    """Each write transaction takes SQLite's write lock at BEGIN, so concurrent writers
    wait on the busy timeout rather than failing on a stale snapshot."""
    stores = [open_store(StoreSettings(database_url=sqlite_url)) for _ in range(4)]
    barrier = threading.Barrier(len(stores))
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            barrier.wait()
            for round_ in range(5):
                with stores[index].transaction() as session:
                    list_tenants(session)  # a read first: the case that fails without BEGIN IMMEDIATE
                    create_tenant(session, name=f"t{index}-{round_}", actor="test")
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == []
        with stores[0].transaction(write=False) as session:
            assert len(list_tenants(session)) == 20
    finally:
        for opened in stores:
            opened.close()


def test_head_revision_is_the_latest_migration():
    revisions = migrate.script_revisions()
    head = migrate.head_revision()
    assert all(head not in downs for downs in revisions.values())  # nothing revises it
    chain, at = [], head
    while at is not None:  # one chain from the head down to the initial schema
        chain.append(at)
        downs = revisions[at]
        at = downs[0] if downs else None
    assert chain[-1] == "0001" and len(chain) == len(revisions)


def test_a_database_error_never_carries_its_statements_parameters(database_url):
    """An unexpected database error reaches the log with its message (service.http_errors'
    500 handler logs its traceback): the statement's parameters (texts, digests, wrapped key
    material, token hashes) are not in it."""
    engine = create_store_engine(database_url)
    marker = "hm_secret_marker_6f1c"
    try:
        with engine.connect() as connection, pytest.raises(Exception) as caught:
            connection.execute(text("SELECT :value FROM no_such_table"), {"value": marker})
        assert "no_such_table" in str(caught.value)  # the error itself still says what failed
        assert marker not in str(caught.value) and marker not in repr(caught.value)
    finally:
        engine.dispose()
