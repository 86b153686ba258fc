"""What the ledger keeps sealed under the store's KEK: its signing keys and its log key.

``hallmark kek rotate`` and ``kek status`` pass these to the key store
(:func:`keys.kek_rotation.rotate_kek`, :func:`~keys.kek_rotation.kek_status`), which re-wraps
and counts them without importing the ledger. A rotation must be given all of them: a
secret left under the old KEK opens nothing once that KEK is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from keys.kek import Kek, Keyring
from keys.kek_rotation import KekDependant, count_by_kek
from keys.models import LogKey, SigningKey
from ledger.log.key import rewrap_log_key
from ledger.signing import rewrap_signing_keys


@dataclass(frozen=True)
class Sealed:
    """One table of the ledger's sealed secrets, as a :class:`~keys.kek_rotation.KekDependant`."""

    name: str
    audit_name: str
    model: Any
    """The ORM class of the rows (a ``kek_id`` column names the KEK sealing each)."""
    rewrap_rows: Callable[[Session, Keyring, Kek], int]

    def count_by_kek(self, session: Session) -> dict[str, int]:
        return count_by_kek(session, self.model)

    def rewrap(self, session: Session, current: Keyring, new: Kek) -> int:
        return self.rewrap_rows(session, current, new)


KEK_DEPENDANTS: tuple[KekDependant, ...] = (
    Sealed("signing_keys", "rewrapped_signing_keys", SigningKey, rewrap_signing_keys),
    Sealed("log_key", "rewrapped_log_keys", LogKey, rewrap_log_key),
)
"""In the order the rotation re-wraps them and its audit event counts them."""
