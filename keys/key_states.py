"""A watermark key's state now and when a generation ran under it.

The ledger records the key's state in every entry it writes (``key_state``: the state at
generation time; a key revoked while a generation ran shows ``revoked`` there). A key's
state changes later (rotated to ``verify-only``, revoked as compromised), and a record
that says only the state at generation reads as "active" for a key revoked since. So
records and ledger matches show both, each named: ``key_state_at_generation`` and
``key_state_now`` (:func:`with_key_states`).
"""

from __future__ import annotations

from typing import Any, Iterable

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from keys.models import KeyRow, LedgerEntry


# Built once, their id lists bound at execution (the Core path: these run on every detection
# that cites the ledger).
_CURRENT = select(KeyRow.id, KeyRow.state).where(KeyRow.id.in_(bindparam("ids", expanding=True)))
_LATEST = (select(LedgerEntry.generation_id, func.max(LedgerEntry.id).label("last"))
           .where(LedgerEntry.generation_id.in_(bindparam("ids", expanding=True)))
           .group_by(LedgerEntry.generation_id).subquery())
_AT_GENERATION = select(LedgerEntry.generation_id, LedgerEntry.key_state).join(
    _LATEST, LedgerEntry.id == _LATEST.c.last)


def current_states(session: Session, key_ids: Iterable[str | None]) -> dict[str, str]:
    """The state of each watermark key now, by key id (one query; unknown ids are absent)."""
    ids = sorted({k for k in key_ids if k})
    if not ids:
        return {}
    return dict(session.connection().execute(_CURRENT, {"ids": ids}).all())


def states_at_generation(session: Session, generation_ids: Iterable[str]) -> dict[str, str | None]:
    """The key state the ledger recorded in each generation's latest entry, by generation id
    (one query; the caller has already scoped the ids to what it may see)."""
    ids = sorted(set(generation_ids))
    if not ids:
        return {}
    return dict(session.connection().execute(_AT_GENERATION, {"ids": ids}).all())


def with_key_states(session: Session, items: list[dict[str, Any]],
                    now: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """``items`` (generation records or ledger matches: dicts with ``key_id`` and the ledger's
    ``key_state``) with ``key_state_at_generation`` (the ledger's ``key_state``, whose
    meaning is unchanged) and ``key_state_now`` (None for a generation without a key).
    ``now``: :func:`current_states` of the items' keys, read already (none: read here)."""
    if now is None:
        now = current_states(session, (item.get("key_id") for item in items))
    for item in items:
        item["key_state_at_generation"] = item.get("key_state")
        item["key_state_now"] = now.get(item.get("key_id")) if item.get("key_id") else None
    return items
