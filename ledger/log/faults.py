"""Rows in the store that the log's writer did not write: reported, never signed, and (for a
row that blocks the log) removed by the owner without losing an entry.

Whoever can write the database without the KEK (the gateway's own role, through a leaked DSN
or a compromised replica; the tables' owner) can insert rows but cannot make them
authenticate (ledger.log.tlog). Two things follow, and this module holds both:

- a ledger entry without an authentic leaf is not the gateway's: reads leave it out (never a
  listed generation, a receipt or a citation) and :func:`report` says so, to the store's
  fault listeners (the gateway's metric and alert, service.store_faults) and the log;
- a row in the log's own tables beyond the authenticated head (a leaf at the next index, a
  leaf naming the next entry, a subtree or checkpoint of a size the log has not reached) makes
  the next append collide with it. The writer never builds on it: the append fails as
  :class:`LogBlocked`, naming the row, and the generation it would have logged is refused
  (its entry rolls back with the leaf). :func:`foreign_rows` finds such rows and
  :func:`repair` (``hallmark ledger repair``: the owner, with the KEK) deletes them, after
  checking that the head authenticates; every genuine entry and leaf stays.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from keys.errors import KeyStoreError
from keys.models import LogCheckpoint, LogLeaf, LogNode

log = logging.getLogger("hallmark.ledger")

LISTENERS = "ledger.log.faults"
"""The name under which a store's fault listeners are kept (keys.db.Store.opened): callables
``(kind, subject, message)``; the gateway's counts and alerts."""
KINDS = ("unlogged_entry", "foreign_log_row", "log_blocked")


class LogBlocked(KeyStoreError):
    """An append collided with a row of the log's tables that the writer did not write.
    Nothing was written; only the owner, with the KEK, can remove the row (``hallmark ledger
    repair``)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"the transparency log is blocked: {what}, a row this gateway did not write (inserted "
                         "without the log key); nothing was appended. The owner must run `hallmark ledger repair` "
                         "(with the KEK) to remove it")
        self.what = what


def listen(store: Any, listener: Callable[[str, str, str], None]) -> None:
    """Call ``listener(kind, subject, message)`` for every fault found through ``store``'s sessions."""
    store.opened.setdefault(LISTENERS, []).append(listener)


def report(session: Session, kind: str, subject: str, message: str) -> None:
    """A fault found in the store: to its listeners, else to the log (a listener logs it, once)."""
    store = session.info.get("hallmark.store")
    listeners = store.opened.get(LISTENERS, ()) if store is not None else ()
    if not listeners:
        log.warning("store fault (%s, %s): %s", kind, subject, message)
    for listener in listeners:
        listener(kind, subject, message)


def report_unlogged(session: Session, rows: list[Any]) -> None:
    """Ledger entries read but left out because the log does not hold them as written."""
    for row in rows:
        report(session, "unlogged_entry", f"entry {row.id}",
               f"ledger entry {row.id} (generation {row.generation_id}, tenant {row.tenant_id}, seq {row.seq}) is "
               "not in the transparency log as written: inserted or changed without the log key; it is not shown, "
               "signed or cited (`hallmark ledger verify` names it)")


# --- rows beyond the head ----------------------------------------------------------------------


@dataclass
class ForeignRows:
    """Rows of the log's tables that lie beyond its authenticated head of ``size``."""

    size: int
    leaves: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[tuple[int, int]] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return bool(self.leaves or self.nodes or self.checkpoints)

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "leaves": self.leaves, "nodes": [list(n) for n in self.nodes],
                "checkpoints": self.checkpoints}

    def describe(self) -> list[str]:
        out = [f"log leaf {leaf['idx']} lies beyond the log's head (size {self.size}): inserted without the log "
               "key; the next append collides with it (run `hallmark ledger repair`)" for leaf in self.leaves]
        out += [f"log subtree (level {level}, index {index}) lies beyond the log's head (size {self.size}): "
                "inserted without the log key (run `hallmark ledger repair`)" for level, index in self.nodes]
        out += [(f"a checkpoint of size {size} is stored but the log holds {self.size} leaves" if size > self.size else
                 f"the stored checkpoint of size {size} is not signed by the log key") +
                ": inserted without the log key (run `hallmark ledger repair`)" for size in self.checkpoints]
        return out


def forged_checkpoint(note: str, verifier: Any) -> bool:
    """Whether a stored checkpoint note is not the log key's (anyone could insert the row)."""
    from ledger.log.note import NoteError, open_checkpoint

    try:
        open_checkpoint(note, verifier)
    except NoteError:
        return True
    return False


def foreign_rows(session: Session, size: int, verifier: Any = None) -> ForeignRows:
    """The rows beyond a head of ``size`` (read from an authenticated head): a leaf the writer
    appends is at index ``size`` exactly, and its head moves in the same transaction, so no
    genuine leaf, subtree or checkpoint ever lies beyond the head. With the log's ``verifier``,
    also a checkpoint within the log whose note the log key did not sign (one inserted ahead of
    the log, which the writer's publication then skipped as published already)."""
    found = ForeignRows(size)
    for leaf in session.scalars(select(LogLeaf).where(LogLeaf.idx >= size).order_by(LogLeaf.idx)):
        found.leaves.append({"idx": leaf.idx, "kind": leaf.kind, "entry_id": leaf.entry_id,
                             "tenant_id": leaf.tenant_id, "leaf_hash": leaf.leaf_hash.hex()})
    for level, index in session.execute(select(LogNode.level, LogNode.idx)):
        if (index + 1) << level > size:  # a complete subtree ends within the tree
            found.nodes.append((level, index))
    found.nodes.sort()
    found.checkpoints = list(session.scalars(select(LogCheckpoint.size).where(LogCheckpoint.size > size)
                                             .order_by(LogCheckpoint.size)))
    if verifier is not None:
        found.checkpoints += [row.size for row in session.scalars(
            select(LogCheckpoint).where(LogCheckpoint.size <= size).order_by(LogCheckpoint.size))
            if forged_checkpoint(row.note, verifier)]
        found.checkpoints.sort()
    return found


def _without_append_only(session: Session, table: str, delete: Callable[[], None]) -> None:
    """Run ``delete`` with ``table``'s append-only triggers off, in the session's transaction
    (the owner's privilege: the gateway's role can neither alter the table nor delete)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text(f"ALTER TABLE {table} DISABLE TRIGGER {table}_append_only"))
        try:
            delete()
        finally:
            session.execute(text(f"ALTER TABLE {table} ENABLE TRIGGER {table}_append_only"))
        return
    trigger = f"{table}_no_delete"
    found = session.execute(text("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = :n"),
                            {"n": trigger}).scalar()
    if found is not None:
        session.execute(text(f"DROP TRIGGER {trigger}"))
    delete()
    if found is not None:
        session.execute(text(found))


def repair(session: Session, size: int, *, actor: str, verifier: Any = None) -> ForeignRows:
    """Delete the rows beyond the authenticated head of ``size`` and the forged checkpoints
    (:func:`foreign_rows`), as the owner, in the session's transaction, with an audit event that
    lists them. Entries and leaves within the log are not touched: nothing the log holds is lost
    (a checkpoint removed is published again, signed, by the gateway's next publication)."""
    from keys.audit import record_audit

    found = foreign_rows(session, size, verifier)
    if not found.found:
        return found
    if found.leaves:
        _without_append_only(session, "log_leaves", lambda: session.execute(
            text("DELETE FROM log_leaves WHERE idx >= :size"), {"size": size}))
    for level, index in found.nodes:
        _without_append_only(session, "log_nodes", lambda: session.execute(
            text("DELETE FROM log_nodes WHERE level = :l AND idx = :i"), {"l": level, "i": index}))
    for checkpoint in found.checkpoints:
        _without_append_only(session, "log_checkpoints", lambda: session.execute(
            text("DELETE FROM log_checkpoints WHERE size = :size"), {"size": checkpoint}))
    record_audit(session, actor=actor, action="log.repaired",
                 details={"size": size, "removed": json.loads(json.dumps(found.to_dict()))})
    return found
