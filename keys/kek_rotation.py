"""KEK rotation: re-wrap every stored secret under a new KEK, in one transaction.

Either every key (watermark and signing) moves to the new KEK or none does. Afterwards
the old KEK opens nothing: the rows carry the new KEK's id and ciphertexts under fresh
nonces.

Concurrency (PostgreSQL): rotation first locks the ``store_kek`` row exclusively; every
writer of a wrapped secret holds it shared until it commits (:func:`keys.material.
check_wrapping_kek`). So a key created or rotated concurrently either commits before the
rotation reads the rows (and is re-wrapped with them) or waits for the rotation and then
finds the store under the new KEK (and is refused if it only has the old one). Before
committing, the rotation checks under the lock that no row carries another KEK id.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from keys import clock
from keys.audit import record_audit
from keys.envelope import wrap_secret
from keys.errors import ConcurrentChange, KekError
from keys.kek import Kek, Keyring
from keys.material import binding_of, lock_store_kek, open_secret
from keys.models import LogKey, SigningKey, StoreKek
from keys.models import KeyRow
from keys.log_key import rewrap_log_key
from keys.signing import rewrap_signing_key

log = logging.getLogger("hallmark.keys")


@dataclass(frozen=True)
class KekRotation:
    previous_kek_ids: tuple[str, ...]
    """KEK ids the keys were wrapped with before (one, unless a rotation was interrupted)."""
    new_kek_id: str
    rewrapped: int


def rotate_kek(session: Session, *, current: Keyring, new: Kek, actor: str,
               now: datetime | None = None) -> KekRotation:
    """Re-wrap every key under ``new``. ``current`` must open every row (else
    :class:`KekError` and nothing changes). Audited as ``kek.rotated`` (ids and a count)."""
    now = clock.resolve(now)
    marker = lock_store_kek(session, exclusive=True)
    rows = list(session.scalars(select(KeyRow).order_by(KeyRow.id).with_for_update()))
    signing = list(session.scalars(select(SigningKey).order_by(SigningKey.id).with_for_update()))
    previous = tuple(sorted({row.kek_id for row in rows} | {row.kek_id for row in signing}))
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
    for row in signing:
        rewrap_signing_key(row, current, new)
    logs = rewrap_log_key(session, current, new)
    if marker is not None:
        marker.kek_id, marker.changed_at = new.id, now
    session.flush()
    # Under the lock: nothing may remain under another KEK (a writer that bypassed the lock).
    stray = session.scalar(select(func.count()).select_from(KeyRow).where(KeyRow.kek_id != new.id))
    stray = (stray or 0) + (session.scalar(select(func.count()).select_from(SigningKey)
                                           .where(SigningKey.kek_id != new.id)) or 0)
    if stray:
        raise ConcurrentChange(f"{stray} key(s) were written under another KEK during the rotation; "
                               "nothing was changed, run `hallmark kek rotate` again")
    record_audit(session, actor=actor, action="kek.rotated",
                 details={"previous_kek_ids": list(previous), "new_kek_id": new.id,
                          "rewrapped_keys": len(rows), "rewrapped_signing_keys": len(signing),
                          "rewrapped_log_keys": logs}, now=now)
    log.info("re-wrapped %d key(s) from KEK %s to KEK %s, by %s", len(rows), ", ".join(previous) or "-",
             new.id, actor)
    return KekRotation(previous_kek_ids=previous, new_kek_id=new.id, rewrapped=len(rows) + len(signing) + logs)


@dataclass(frozen=True)
class KekStatus:
    configured: tuple[str, ...]
    """KEK ids this process holds, newest (the wrapping one) first."""
    store_kek_id: str | None
    """The KEK the last rotation moved the store to (None before any rotation)."""
    watermark_keys: dict[str, int]
    signing_keys: dict[str, int]
    log_key: dict[str, int] = None  # type: ignore[assignment]
    """The transparency log's key, by the KEK id it is sealed under (at most one)."""

    def to_dict(self) -> dict:
        log_key = self.log_key or {}
        return {"configured": list(self.configured), "store_kek_id": self.store_kek_id,
                "watermark_keys": self.watermark_keys, "signing_keys": self.signing_keys, "log_key": log_key,
                "unopenable": sorted(k for k in {*self.watermark_keys, *self.signing_keys, *log_key}
                                     if k not in self.configured)}


def kek_status(session: Session, keyring: Keyring) -> KekStatus:
    """Keys per KEK id, and which KEKs this process has."""
    def count(model) -> dict[str, int]:
        return dict(session.execute(select(model.kek_id, func.count()).group_by(model.kek_id)).all())

    marker = session.get(StoreKek, 1)
    return KekStatus(configured=keyring.ids, store_kek_id=marker.kek_id if marker else None,
                     watermark_keys=count(KeyRow), signing_keys=count(SigningKey), log_key=count(LogKey))
