"""Signing keys in the store: Ed25519 keys that sign receipts and detection reports.

The private key (32 raw bytes) is sealed with AES-256-GCM under the KEK, like a watermark
secret, with associated data binding the key id and the sealing KEK id; one opaque
:class:`~keys.errors.UnwrapError` on any failure. One key is ``active`` (signs); ``rotate``
retires it and makes a new one active in one transaction. Retired keys are kept and
published, so receipts they signed keep verifying. Every change is audited.
"""

from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from sqlalchemy import select
from sqlalchemy.orm import Session

from keys import clock
from keys.audit import record_audit
from keys.chain import timestamp
from keys.errors import InvalidTransition, KeyStoreError, UnwrapError
from keys.kek import Kek, Keyring
from keys.material import check_wrapping_kek
from keys.models import SigningKey as Row
from keys.receipts import ALGORITHM, Signer, b64url, key_id_of

AD_LABEL = b"hallmark/signing-key-wrap/v1"
ACTIVE, RETIRED = "active", "retired"


class NoSigningKey(KeyStoreError, LookupError):
    def __init__(self) -> None:
        super().__init__("no active signing key: create one with `hallmark signing-keys create`")


@dataclass(frozen=True)
class SigningKeyInfo:
    kid: str
    state: str
    kek_id: str
    public_key: str
    created_at: datetime
    retired_at: datetime | None

    def to_dict(self) -> dict[str, Any]:
        return {"kid": self.kid, "alg": ALGORITHM, "state": self.state, "kek_id": self.kek_id,
                "public_key": self.public_key, "created_at": timestamp(self.created_at),
                "retired_at": timestamp(self.retired_at) if self.retired_at else None}


def _info(row: Row) -> SigningKeyInfo:
    return SigningKeyInfo(kid=row.id, state=row.state, kek_id=row.kek_id, public_key=b64url(row.public_key),
                          created_at=row.created_at, retired_at=row.retired_at)


def _ad(kid: str, kek_id: str) -> bytes:
    return AD_LABEL + b"".join(struct.pack(">H", len(v.encode())) + v.encode() for v in (kid, kek_id))


def _seal(kek: Kek, kid: str, private_raw: bytes) -> tuple[bytes, bytes]:
    nonce = secrets.token_bytes(12)
    return AESGCM(kek.material).encrypt(nonce, private_raw, _ad(kid, kek.id)), nonce


def _open(keyring: Keyring, row: Row) -> Ed25519PrivateKey:
    kek = keyring.get(row.kek_id)
    try:
        raw = AESGCM(kek.material).decrypt(row.nonce, row.wrapped_private, _ad(row.id, kek.id))
        private = Ed25519PrivateKey.from_private_bytes(raw)
    except (InvalidTag, ValueError):
        raise UnwrapError(row.id) from None
    if private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) != row.public_key:
        raise UnwrapError(row.id)
    return private


def rewrap_signing_key(row: Row, current: Keyring, new: Kek) -> None:
    """Re-seal ``row``'s private key under ``new`` (KEK rotation)."""
    raw = _open(current, row).private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    row.wrapped_private, row.nonce = _seal(new, row.id, raw)
    row.kek_id = new.id


def _insert(session: Session, keyring: Keyring, now: datetime) -> Row:
    private = Ed25519PrivateKey.generate()
    public_raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    kid = key_id_of(public_raw)
    wrapped, nonce = _seal(keyring.primary, kid,
                           private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()))
    row = Row(id=kid, public_key=public_raw, wrapped_private=wrapped, nonce=nonce, kek_id=keyring.primary.id,
              state=ACTIVE, created_at=now, retired_at=None)
    session.add(row)
    session.flush()
    return row


def _active(session: Session, *, lock: bool = False) -> Row | None:
    query = select(Row).where(Row.state == ACTIVE)
    if lock:
        query = query.with_for_update()
    return session.scalar(query)


def create_signing_key(session: Session, keyring: Keyring, *, actor: str, now: datetime | None = None
                       ) -> SigningKeyInfo:
    """The first signing key; :class:`InvalidTransition` if one is active (use rotate)."""
    now = clock.resolve(now)
    check_wrapping_kek(session, keyring)
    if _active(session, lock=True) is not None:
        raise InvalidTransition("a signing key is already active; use `hallmark signing-keys rotate`")
    row = _insert(session, keyring, now)
    record_audit(session, actor=actor, action="signing_key.created", details={"kid": row.id, "kek_id": row.kek_id},
                 now=now)
    return _info(row)


def rotate_signing_key(session: Session, keyring: Keyring, *, actor: str, now: datetime | None = None
                       ) -> tuple[SigningKeyInfo, SigningKeyInfo | None]:
    """Retire the active key (if any) and make a new one active. Returns (new, retired)."""
    now = clock.resolve(now)
    check_wrapping_kek(session, keyring)
    current = _active(session, lock=True)
    if current is not None:
        current.state, current.retired_at = RETIRED, now
        session.flush()
    row = _insert(session, keyring, now)
    record_audit(session, actor=actor, action="signing_key.rotated",
                 details={"kid": row.id, "retired_kid": current.id if current else None, "kek_id": row.kek_id},
                 now=now)
    return _info(row), _info(current) if current else None


def ensure_signing_key(session: Session, keyring: Keyring, *, actor: str) -> None:
    """Create the first signing key if there is none (the gateway's start)."""
    if _active(session) is None and session.scalar(select(Row.id).limit(1)) is None:
        create_signing_key(session, keyring, actor=actor)


def list_signing_keys(session: Session) -> list[SigningKeyInfo]:
    return [_info(row) for row in session.scalars(select(Row).order_by(Row.created_at, Row.id))]


def active_signer(session: Session, keyring: Keyring) -> Signer:
    row = _active(session)
    if row is None:
        raise NoSigningKey()
    return Signer(kid=row.id, private_key=_open(keyring, row))


def public_keyset(session: Session) -> dict[str, Any]:
    """The ``/.well-known/hallmark-keys.json`` document: every signing key, retired ones too."""
    keys = []
    for info in list_signing_keys(session):
        public = info.to_dict()
        public.pop("kek_id")
        keys.append(public)
    return {"keys": keys}
