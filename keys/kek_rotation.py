"""KEK rotation: re-wrap every stored secret under a new KEK, in one transaction.

Either every key moves to the new KEK or none does. Afterwards the old KEK opens
nothing: the rows carry the new KEK's id and ciphertexts under fresh nonces.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from keys import clock
from keys.audit import record_audit
from keys.envelope import wrap_secret
from keys.errors import KekError
from keys.kek import Kek, Keyring
from keys.material import binding_of, open_secret
from keys.models import Tenant
from keys.models import WatermarkKey as KeyRow

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
    if new.id in current:
        raise KekError(f"the new KEK (id {new.id}) is the KEK already in use; generate a new one "
                       "with `hallmark kek generate --out FILE`")
    now = clock.resolve(now)
    # Key creation locks its tenant first; holding every tenant lock keeps a key from
    # being added under the old KEK while this transaction runs (PostgreSQL).
    session.execute(select(Tenant.id).order_by(Tenant.id).with_for_update()).all()
    rows = list(session.scalars(select(KeyRow).order_by(KeyRow.id).with_for_update()))
    previous = tuple(sorted({row.kek_id for row in rows}))
    target = Keyring([new])
    for row in rows:
        secret = open_secret(current, row)
        wrapped = wrap_secret(target, secret=secret, binding=binding_of(row))
        row.wrapped_secret = wrapped.ciphertext
        row.nonce = wrapped.nonce
        row.kek_id = wrapped.kek_id
    session.flush()
    record_audit(session, actor=actor, action="kek.rotated",
                 details={"previous_kek_ids": list(previous), "new_kek_id": new.id,
                          "rewrapped_keys": len(rows)}, now=now)
    log.info("re-wrapped %d key(s) from KEK %s to KEK %s, by %s", len(rows), ", ".join(previous) or "-",
             new.id, actor)
    return KekRotation(previous_kek_ids=previous, new_kek_id=new.id, rewrapped=len(rows))
