"""The tamper matrix's machinery (tests/service/test_tamper_matrix.py): a stack populated
through a real gateway on SQLite or on PostgreSQL with the separated roles, cloned per case,
and the tamperings, done as the people the threat model names could do them.

- The database owner (actor d: every table, triggers off, no KEK, no log key): rewrites
  rows with plain SQL, re-chaining hashes as `ledger.chain` documents.
- The operator holding the log key (actor e): rewrites rows *and* rebuilds the log over
  them with valid MACs, then signs a fresh checkpoint (:func:`rebuild_log`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from ledger.chain import GENESIS_HASH, entry_fields, entry_hash


@dataclass
class Stack:
    backend: str
    url: str
    """The owner's URL of the populated database (a template: tests work on clones)."""
    service_url: str | None
    kek_file: Path
    tmp: Path
    witness_state: Path
    """A witness state taken after every generation (its checkpoint covers all of them)."""
    early_head: dict[str, Any]
    """The log's head row as it was after the first generations (an owner could have kept it)."""
    generations: list[dict[str, Any]]
    """{"id", "tenant", "text", "token_ids"} of each generation, oldest first."""
    server: Any = None

    def clone(self, name: str) -> str:
        if self.backend == "sqlite":
            import sqlite3

            path = self.tmp / f"{name}.db"
            source, target = sqlite3.connect(make_url(self.url).database), sqlite3.connect(path)
            try:
                source.backup(target)  # the WAL's pages too, unlike a file copy
            finally:
                source.close()
                target.close()
            return f"sqlite:///{path}"
        admin = self.server.engine
        database = f"{make_url(self.url).database}_{name}"[:63]
        with admin.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
            connection.exec_driver_sql(f"CREATE DATABASE {database} TEMPLATE {make_url(self.url).database}")
        self.server.created.append(database)
        return self.server.url_for(database)


@contextmanager
def owner(url: str) -> Iterator[Any]:
    """A connection of the tables' owner with the append-only triggers out of the way."""
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            if engine.dialect.name == "postgresql":
                connection.exec_driver_sql("SET LOCAL session_replication_role = replica")
            else:
                triggers = connection.exec_driver_sql(
                    "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'").all()
                for name, _ in triggers:
                    connection.exec_driver_sql(f"DROP TRIGGER {name}")
            yield connection
            if engine.dialect.name == "sqlite":
                for _, sql in triggers:
                    connection.exec_driver_sql(sql)
    finally:
        engine.dispose()


def entries(connection, tenant: str | None = None) -> list[dict[str, Any]]:
    """Ledger rows as the store's types read them (aware times, JSON decoded), oldest first."""
    from sqlalchemy import select

    from keys.models import LedgerEntry, Tenant

    table = LedgerEntry.__table__
    query = select(table).order_by(table.c.id)
    if tenant:
        query = query.join(Tenant.__table__, Tenant.__table__.c.id == table.c.tenant_id).where(
            Tenant.__table__.c.name == tenant)
    return [dict(row._mapping) for row in connection.execute(query)]


def insert_entry(connection, values: dict[str, Any]) -> None:
    from keys.models import LedgerEntry

    connection.execute(LedgerEntry.__table__.insert().values(**values))


def _aware(row: dict[str, Any]) -> dict[str, Any]:
    return row


def rechain(connection, tenant_id: str) -> None:
    """Recompute one tenant's seq, prev_hash and entry_hash in id order (what an owner does
    after editing, deleting or reordering to make the chain verify again)."""
    rows = sorted((r for r in entries(connection) if r["tenant_id"] == tenant_id), key=lambda r: (r["seq"], r["id"]))
    previous = GENESIS_HASH
    for seq, row in enumerate(rows, start=1):
        row = _aware(dict(row, seq=seq, prev_hash=previous))
        digest = entry_hash(entry_fields(type("Row", (), row)))
        connection.execute(text("UPDATE ledger_entries SET seq = :s, prev_hash = :p, entry_hash = :h WHERE id = :id"),
                           {"s": seq + 1_000_000, "p": previous, "h": "tmp" + digest[:60], "id": row["id"]})
        row["entry_hash"] = digest
        rows[seq - 1] = row
        previous = digest
    for row in rows:  # two passes: (tenant_id, seq) and entry_hash are unique
        connection.execute(text("UPDATE ledger_entries SET seq = :s, prev_hash = :p, entry_hash = :h WHERE id = :id"),
                           {"s": row["seq"], "p": row["prev_hash"], "h": row["entry_hash"], "id": row["id"]})


def rebuild_log(url: str, kek_file: Path | None = None, kek: Any = None) -> None:
    """Actor e: rebuild the whole log over the rows as they are now (valid MACs, the real log
    key) and publish a checkpoint of it: what only the operator holding the keys can do."""
    from pydantic import SecretStr

    from ledger.log import tlog
    from keys.db import open_store
    from ledger.log.leaves import EMPTY_KGRAMS, kgram_rows_commitment
    from keys.models import LedgerEntry, SigningKey
    from keys.settings import StoreSettings
    from sqlalchemy import select

    with owner(url) as connection:
        for table in ("log_leaves", "log_nodes", "log_checkpoints"):
            connection.exec_driver_sql(f"DELETE FROM {table}")
        connection.exec_driver_sql("UPDATE log_head SET size = 0, border = '', mac = NULL")
    settings = (StoreSettings(database_url=url, kek_file=kek_file) if kek is None
                else StoreSettings(database_url=url, kek=SecretStr(kek.to_base64())))
    store = open_store(settings, require_kek=True)
    try:
        with store.transaction() as session:
            auth = tlog.required_authority(session)
            kgrams = tlog._kgram_sets(session)
            for row in session.scalars(select(LedgerEntry).order_by(LedgerEntry.id)):
                commitment = kgram_rows_commitment(kgrams.get(row.generation_id, ())) if row.kind == "finished" \
                    else EMPTY_KGRAMS
                tlog.append_entry(session, auth, row, commitment)
            for key in session.scalars(select(SigningKey).order_by(SigningKey.created_at)):
                tlog.append_key_event(session, auth, tlog.key_event_of(key, "adopted", key.created_at))
            tlog.publish(session, auth)
    finally:
        store.close()
