"""KEK rotation: re-wrap every stored secret under a new KEK, in one transaction.

Either every key (watermark keys here, and what the packages built on the store keep sealed
under the KEK: the ledger's signing keys and log key) moves to the new KEK or none does.
Afterwards the old KEK opens nothing: the rows carry the new KEK's id and ciphertexts under
fresh nonces. The rotation asks those packages (:class:`KekDependant`, passed in by the
caller) to count and re-wrap their own rows: the key store never imports them.

Concurrency (PostgreSQL): rotation first locks the ``store_kek`` row exclusively; every
writer of a wrapped secret holds it shared until it commits (:func:`keys.material.
check_wrapping_kek`). So a key created or rotated concurrently either commits before the
rotation reads the rows (and is re-wrapped with them) or waits for the rotation and then
finds the store under the new KEK (and is refused if it only has the old one). Before
committing, the rotation checks under the lock that no row carries another KEK id.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from keys import clock
from keys.audit import record_audit
from keys.envelope import wrap_secret
from keys.errors import ConcurrentChange, KekError
from keys.kek import Kek, Keyring
from keys.material import binding_of, lock_store_kek, open_secret
from keys.models import StoreKek
from keys.models import KeyRow

log = logging.getLogger("hallmark.keys")


class KekDependant(Protocol):
    """Secrets a package built on the store keeps sealed under the store's KEK, in its own
    rows (the ledger's: ``ledger.sealed.KEK_DEPENDANTS``). Rotation and status ask it."""

    @property
    def name(self) -> str:
        """Its rows in ``kek status`` (``signing_keys``)."""
        ...

    @property
    def audit_name(self) -> str:
        """Its count in the ``kek.rotated`` audit event (``rewrapped_signing_keys``)."""
        ...

    def count_by_kek(self, session: Session) -> dict[str, int]:
        """How many of its rows each KEK id seals (:func:`count_by_kek`)."""
        ...

    def rewrap(self, session: Session, current: Keyring, new: Kek) -> int:
        """Lock its rows (``FOR UPDATE``), open each with ``current`` and re-seal it under
        ``new``; how many rows."""
        ...


def count_by_kek(session: Session, model: Any) -> dict[str, int]:
    """Rows of ``model`` (a table with a ``kek_id`` column) per KEK id."""
    return dict(session.execute(select(model.kek_id, func.count()).group_by(model.kek_id)).all())


@dataclass(frozen=True)
class KekRotation:
    previous_kek_ids: tuple[str, ...]
    """KEK ids the keys were wrapped with before (one, unless a rotation was interrupted)."""
    new_kek_id: str
    rewrapped: int


def rotate_kek(session: Session, *, current: Keyring, new: Kek, actor: str,
               dependants: Sequence[KekDependant], now: datetime | None = None) -> KekRotation:
    """Re-wrap every key under ``new``: the watermark keys and every dependant's rows
    (``ledger.sealed.KEK_DEPENDANTS`` for a store the ledger writes to). ``current`` must open
    every row (else :class:`KekError` and nothing changes). Audited as ``kek.rotated`` (ids
    and a count per kind)."""
    now = clock.resolve(now)
    marker = lock_store_kek(session, exclusive=True)
    rows = list(session.scalars(select(KeyRow).order_by(KeyRow.id).with_for_update()))
    sealed = {d.name: d.count_by_kek(session) for d in dependants}
    previous = tuple(sorted({row.kek_id for row in rows}.union(*sealed.values())))
    # A staged rollout may already list the new KEK (first, with the old one as previous);
    # rotating to the KEK every row already uses is the mistake this refuses.
    if new.id in current and (previous == (new.id,) or (not previous and new.id == current.primary.id)):
        raise KekError(f"the new KEK (id {new.id}) is the KEK already in use; generate a new one "
                       "with `hallmark kek generate --out FILE`")
    target = Keyring([new])
    for row in rows:
        secret = open_secret(current, row)
        wrapped = wrap_secret(target, secret=secret, binding=binding_of(row))
        row.wrapped_secret = wrapped.ciphertext
        row.nonce = wrapped.nonce
        row.kek_id = wrapped.kek_id
    rewrapped = {d.audit_name: d.rewrap(session, current, new) for d in dependants}
    if marker is not None:
        marker.kek_id, marker.changed_at = new.id, now
    session.flush()
    # Under the lock: nothing may remain under another KEK (a writer that bypassed the lock).
    stray = session.scalar(select(func.count()).select_from(KeyRow).where(KeyRow.kek_id != new.id)) or 0
    stray += sum(n for d in dependants for kek_id, n in d.count_by_kek(session).items() if kek_id != new.id)
    if stray:
        raise ConcurrentChange(f"{stray} key(s) were written under another KEK during the rotation; "
                               "nothing was changed, run `hallmark kek rotate` again")
    record_audit(session, actor=actor, action="kek.rotated",
                 details={"previous_kek_ids": list(previous), "new_kek_id": new.id,
                          "rewrapped_keys": len(rows), **rewrapped}, now=now)
    log.info("re-wrapped %d key(s) from KEK %s to KEK %s, by %s", len(rows), ", ".join(previous) or "-",
             new.id, actor)
    return KekRotation(previous_kek_ids=previous, new_kek_id=new.id, rewrapped=len(rows) + sum(rewrapped.values()))


@dataclass(frozen=True)
class KekStatus:
    configured: tuple[str, ...]
    """KEK ids this process holds, newest (the wrapping one) first."""
    store_kek_id: str | None
    """The KEK the last rotation moved the store to (None before any rotation)."""
    watermark_keys: dict[str, int]
    sealed: dict[str, dict[str, int]]
    """Each dependant's rows by the KEK id sealing them, by its name (``signing_keys``,
    ``log_key``: the transparency log's key, at most one)."""

    def to_dict(self) -> dict:
        held = {*self.watermark_keys}.union(*self.sealed.values())
        return {"configured": list(self.configured), "store_kek_id": self.store_kek_id,
                "watermark_keys": self.watermark_keys, **self.sealed,
                "unopenable": sorted(k for k in held if k not in self.configured)}


def kek_status(session: Session, keyring: Keyring, dependants: Sequence[KekDependant]) -> KekStatus:
    """Keys per KEK id (the watermark keys and each dependant's), and which KEKs this process has."""
    marker = session.get(StoreKek, 1)
    return KekStatus(configured=keyring.ids, store_kek_id=marker.kek_id if marker else None,
                     watermark_keys=count_by_kek(session, KeyRow),
                     sealed={d.name: d.count_by_kek(session) for d in dependants})
