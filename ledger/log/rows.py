"""The transparency log's head and append at the database driver: the one hot path of the log.

Every ledger entry is appended in its own transaction (ledger.log.tlog.append), so the statements
that lock and read the head and write the leaf, the subtrees it completed and the new head
run once per generation event. Through SQLAlchemy's Core each costs ~50 µs of Python before
the database sees it; here they go to the DB-API cursor of the session's own connection (the
same transaction), and on PostgreSQL the three writes are one statement (data-modifying
CTEs), so an append is two round trips. The columns and their encodings are the models'
(keys.models: SQLite stores times as naive UTC text, PostgreSQL as timestamptz).
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from datetime import timezone
from typing import Any, Iterator

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from ledger.log.faults import LogBlocked

_SQLITE_TIME = "%Y-%m-%d %H:%M:%S.%f"
_PG_WRITE = """
WITH leaf AS (
    INSERT INTO log_leaves (idx, leaf_hash, kind, entry_id, tenant_id, kgrams_sha256, kid, data, mac, created_at)
    VALUES (%(idx)s, %(leaf_hash)s, %(kind)s, %(entry_id)s, %(tenant_id)s, %(kgrams_sha256)s, %(kid)s, %(data)s,
            %(mac)s, %(created_at)s)
), nodes AS (
    INSERT INTO log_nodes (level, idx, hash)
    SELECT * FROM unnest(%(levels)s::integer[], %(indexes)s::bigint[], %(hashes)s::bytea[])
)
UPDATE log_head SET size = %(size)s, border = %(border)s, mac = %(head_mac)s, updated_at = %(created_at)s
WHERE id = 1
"""


def _cursor(session: Session) -> tuple[Any, bool]:
    connection = session.connection()
    return connection.connection.driver_connection.cursor(), connection.dialect.name == "postgresql"


def _blocking(exc: Exception) -> str | None:
    """The row an append collided with, for a unique violation: only a row inserted by someone
    else can be there (the head's lock serialises appends, and each writes past the head)."""
    if getattr(exc, "sqlstate", None) == "23505":
        return f"a row of {getattr(exc.diag, 'table_name', None) or 'the log'} already holds its position " \
               f"({getattr(exc.diag, 'constraint_name', None) or 'unique key'})"
    if isinstance(exc, sqlite3.IntegrityError) and "UNIQUE" in str(exc):
        return f"a row already holds its position ({str(exc).split(':', 1)[-1].strip()})"
    return None


@contextmanager
def _driver_errors(session: Session, statement: str) -> Iterator[None]:
    """The DB-API cursor's errors as SQLAlchemy's (so keys.db.translate_error names a database
    fault: a 503, not an unhandled driver exception), and a collision as :class:`LogBlocked`."""
    dbapi = session.get_bind().dialect.loaded_dbapi
    try:
        yield
    except dbapi.Error as exc:
        blocking = _blocking(exc)
        if blocking is not None:
            raise LogBlocked(blocking) from None
        raise DBAPIError.instance(statement, None, exc, dbapi.Error, hide_parameters=True) from None


def read_head(session: Session, *, lock: bool) -> tuple[int, bytes, bytes | None]:
    """(size, border bytes, mac) of the head row, locked for the transaction with ``lock``."""
    cursor, postgres = _cursor(session)
    try:
        with _driver_errors(session, "SELECT ... FROM log_head"):
            cursor.execute("SELECT size, border, mac FROM log_head WHERE id = 1" + (" FOR UPDATE" if lock and postgres
                                                                                     else ""))
            size, border, mac = cursor.fetchone()
    finally:
        cursor.close()
    border = border.encode() if isinstance(border, str) else bytes(border)  # the migration's '' on SQLite
    return int(size), border, None if mac is None else bytes(mac)


def write_append(session: Session, leaf: dict[str, Any], completed: list[tuple[int, int, bytes]], size: int,
                 border: bytes, head_mac: bytes) -> None:
    """Insert ``leaf`` (keys.models.LogLeaf's columns) and the ``completed`` subtrees, and
    move the head to ``size``/``border``, in the session's transaction."""
    cursor, postgres = _cursor(session)
    try:
        with _driver_errors(session, "INSERT INTO log_leaves ..."):
            _write(cursor, postgres, leaf, completed, size, border, head_mac)
    finally:
        cursor.close()


def write_appends(session: Session, leaves: list[dict[str, Any]], completed: list[tuple[int, int, bytes]],
                  size: int, border: bytes, head_mac: bytes) -> None:
    """:func:`write_append` for many leaves in order (their idx consecutive from the head's
    size): the leaves, every subtree they completed, and the head at ``size`` once."""
    if len(leaves) == 1:
        write_append(session, leaves[0], completed, size, border, head_mac)
        return
    cursor, postgres = _cursor(session)
    try:
        with _driver_errors(session, "INSERT INTO log_leaves ..."):
            if postgres:
                columns = {name: [leaf[name] for leaf in leaves] for name in _LEAF_COLUMNS}
                cursor.execute(_PG_WRITE_MANY, {**columns, "levels": [c[0] for c in completed],
                                                "indexes": [c[1] for c in completed],
                                                "hashes": [c[2] for c in completed], "size": size, "border": border,
                                                "head_mac": head_mac, "updated_at": leaves[-1]["created_at"]})
                return
            cursor.executemany(_SQLITE_LEAF, [_sqlite_leaf(leaf) for leaf in leaves])
            if completed:
                cursor.executemany("INSERT INTO log_nodes (level, idx, hash) VALUES (?, ?, ?)", completed)
            cursor.execute("UPDATE log_head SET size = ?, border = ?, mac = ?, updated_at = ? WHERE id = 1",
                           (size, border, head_mac, _sqlite_leaf(leaves[-1])[-1]))
    finally:
        cursor.close()


_LEAF_COLUMNS = ("idx", "leaf_hash", "kind", "entry_id", "tenant_id", "kgrams_sha256", "kid", "data", "mac",
                 "created_at")
_SQLITE_LEAF = ("INSERT INTO log_leaves (idx, leaf_hash, kind, entry_id, tenant_id, kgrams_sha256, kid, data, mac, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_PG_WRITE_MANY = """
WITH leaf AS (
    INSERT INTO log_leaves (idx, leaf_hash, kind, entry_id, tenant_id, kgrams_sha256, kid, data, mac, created_at)
    SELECT * FROM unnest(%(idx)s::bigint[], %(leaf_hash)s::bytea[], %(kind)s::text[], %(entry_id)s::bigint[],
                         %(tenant_id)s::text[], %(kgrams_sha256)s::text[], %(kid)s::text[], %(data)s::bytea[],
                         %(mac)s::bytea[], %(created_at)s::timestamptz[])
), nodes AS (
    INSERT INTO log_nodes (level, idx, hash)
    SELECT * FROM unnest(%(levels)s::integer[], %(indexes)s::bigint[], %(hashes)s::bytea[])
)
UPDATE log_head SET size = %(size)s, border = %(border)s, mac = %(head_mac)s, updated_at = %(updated_at)s
WHERE id = 1
"""


def _sqlite_leaf(leaf: dict[str, Any]) -> tuple:
    return (leaf["idx"], leaf["leaf_hash"], leaf["kind"], leaf["entry_id"], leaf["tenant_id"], leaf["kgrams_sha256"],
            leaf["kid"], leaf["data"], leaf["mac"], leaf["created_at"].astimezone(timezone.utc).strftime(_SQLITE_TIME))


def _write(cursor: Any, postgres: bool, leaf: dict[str, Any], completed: list[tuple[int, int, bytes]], size: int,
           border: bytes, head_mac: bytes) -> None:
    if postgres:
        cursor.execute(_PG_WRITE, {**leaf, "levels": [c[0] for c in completed],
                                   "indexes": [c[1] for c in completed], "hashes": [c[2] for c in completed],
                                   "size": size, "border": border, "head_mac": head_mac})
        return
    when = leaf["created_at"].astimezone(timezone.utc).strftime(_SQLITE_TIME)
    cursor.execute("INSERT INTO log_leaves (idx, leaf_hash, kind, entry_id, tenant_id, kgrams_sha256, kid, data, "
                   "mac, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (leaf["idx"], leaf["leaf_hash"], leaf["kind"], leaf["entry_id"], leaf["tenant_id"],
                    leaf["kgrams_sha256"], leaf["kid"], leaf["data"], leaf["mac"], when))
    if completed:
        cursor.executemany("INSERT INTO log_nodes (level, idx, hash) VALUES (?, ?, ?)", completed)
    cursor.execute("UPDATE log_head SET size = ?, border = ?, mac = ?, updated_at = ? WHERE id = 1",
                   (size, border, head_mac, when))
