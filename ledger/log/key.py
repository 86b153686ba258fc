"""The transparency log's key: one long-lived Ed25519 key per store, sealed under the KEK.

It signs checkpoints (C2SP signed notes, :mod:`ledger.log.note`) and, through a key derived from
it, MACs the log's head and each leaf (:mod:`ledger.log.tlog`): what lets a process holding the
KEK tell a leaf it sequenced from a row inserted by anyone who can only write the database
(the gateway's own role, or the tables' owner, who hold neither the KEK nor this key). Its
public half is what verifiers pin (``--trust-log-key``); rotating it would start a new log,
so there is no rotation, only re-wrapping under a new KEK (``kek rotate``).

A third key derived from it keys the ledger's k-gram digests (ledger.kgrams, scheme 2): one
store-wide secret with exactly the lifetime those digests need (created with the log, never
rotated, since a new one would orphan every digest recorded; re-wrapped with the log key),
not derived from any watermark key, and never stored or shown on its own.

The row is written by a process that may insert into ``log_keys``: the admin CLI as the
owner (``hallmark ledger init``), or a gateway on SQLite at its start. The gateway's
PostgreSQL role may only read it (keys.roles).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from dataclasses import dataclass
from datetime import datetime

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from sqlalchemy import select
from sqlalchemy.orm import Session

from keys import clock
from keys.audit import record_audit
from keys.db import Store
from keys.errors import KekError, KeyStoreError
from keys.kek import Kek, Keyring
from keys.models import LogKey
from ledger.log.note import NoteSigner, Verifier

AD_LABEL = b"hallmark/log-key-wrap/v1"
MAC_LABEL = b"hallmark/log-mac/v1"
KGRAM_LABEL = b"hallmark/kgram-key/v2"
_OPENED = "ledger.log.key"  # its name among the store's opened secrets (keys.db.Store.opened)


class LogKeyError(KeyStoreError):
    """The log key is missing, cannot be opened, or cannot be created here."""


@dataclass(frozen=True)
class LogAuthority:
    """The opened log key: signs checkpoints, MACs the head and leaves, and keys the ledger's
    scheme 2 k-gram digests (ledger.kgrams). Never in ``repr``."""

    origin: str
    signer: NoteSigner
    mac_key: bytes
    kgram_key: bytes
    """HMAC key of ledger.kgrams' scheme 2: one per store, derived like ``mac_key`` (a distinct
    label: neither reveals the other nor the log key)."""

    def __repr__(self) -> str:
        return f"LogAuthority(origin={self.origin!r})"

    @property
    def verifier(self) -> Verifier:
        return self.signer.verifier

    def mac(self, *parts: bytes) -> bytes:
        message = b"".join(struct.pack(">I", len(p)) + p for p in parts)
        return hmac.new(self.mac_key, message, hashlib.sha256).digest()

    def check(self, mac: bytes | None, *parts: bytes) -> bool:
        return mac is not None and hmac.compare_digest(mac, self.mac(*parts))


def _ad(origin: str, kek_id: str) -> bytes:
    return AD_LABEL + b"".join(struct.pack(">H", len(v.encode())) + v.encode() for v in (origin, kek_id))


def _authority(origin: str, private: Ed25519PrivateKey) -> LogAuthority:
    raw = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return LogAuthority(origin=origin, signer=NoteSigner(origin, private),
                        mac_key=hmac.new(raw, MAC_LABEL, hashlib.sha256).digest(),
                        kgram_key=hmac.new(raw, KGRAM_LABEL, hashlib.sha256).digest())


def open_log_key(row: LogKey, keyring: Keyring) -> LogAuthority:
    kek = keyring.get(row.kek_id)
    try:
        raw = AESGCM(kek.material).decrypt(row.nonce, row.wrapped_private, _ad(row.origin, kek.id))
        private = Ed25519PrivateKey.from_private_bytes(raw)
    except (InvalidTag, ValueError):
        raise LogKeyError("the log key could not be decrypted: its stored ciphertext does not authenticate "
                          "(altered, or moved); restore the log_keys row from a backup") from None
    if private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) != row.public_key:
        raise LogKeyError("the log key's stored public half does not match its private half; restore the "
                          "log_keys row from a backup")
    return _authority(row.origin, private)


def load_log_key(session: Session, keyring: Keyring) -> LogAuthority | None:
    """The store's log key, opened; None when the store has none yet."""
    row = session.get(LogKey, 1)
    return None if row is None else open_log_key(row, keyring)


def store_log_key(store: Store, session: Session | None) -> LogAuthority | None:
    """The store's log key, opened with the store's keyring once and kept with the store
    (``store.opened``); None while the store has none or this process holds no KEK.
    ``session``: where to read it when it is not opened yet (None: only what is opened already)."""
    found = store.opened.get(_OPENED)
    if found is None and session is not None:
        try:
            found = load_log_key(session, store.keyring)
        except KekError:
            return None
        if found is not None:
            store.opened[_OPENED] = found
    return found


def forget_log_key(store: Store) -> None:
    """Drop the store's opened log key (it was just created: the next use reads it committed)."""
    store.opened.pop(_OPENED, None)


def log_verifier(session: Session) -> Verifier | None:
    """The log's public key as the database holds it (for trust on first use only: the
    database's owner could replace this row; pin the key you saw first)."""
    row = session.get(LogKey, 1)
    return None if row is None else Verifier(row.origin, row.public_key)


def default_origin(public_raw: bytes) -> str:
    return f"hallmark.invalid/log/{hashlib.sha256(public_raw).hexdigest()[:16]}"


def create_log_key(session: Session, keyring: Keyring, *, actor: str, origin: str | None = None,
                   now: datetime | None = None) -> LogAuthority:
    """Create the store's log key (the caller checked there is none), sealed under the
    primary KEK; audited. ``origin`` names the log in its checkpoints (a schema-less URL,
    e.g. ``example.com/hallmark``); by default one derived from the key."""
    now = clock.resolve(now)
    private = Ed25519PrivateKey.generate()
    public_raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    origin = origin or default_origin(public_raw)
    if not origin or any(c.isspace() or c == "+" for c in origin) or len(origin) > 200:
        raise LogKeyError("the log origin must be 1-200 characters without spaces or '+', e.g. example.com/hallmark")
    kek: Kek = keyring.primary
    nonce = secrets.token_bytes(12)
    raw = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    session.add(LogKey(id=1, origin=origin, public_key=public_raw, nonce=nonce, kek_id=kek.id, created_at=now,
                       wrapped_private=AESGCM(kek.material).encrypt(nonce, raw, _ad(origin, kek.id))))
    session.flush()
    authority = _authority(origin, private)
    record_audit(session, actor=actor, action="log_key.created",
                 details={"origin": origin, "vkey": authority.verifier.vkey, "kek_id": kek.id}, now=now)
    return authority


def rewrap_log_key(session: Session, current: Keyring, new: Kek) -> int:
    """Re-seal the log key under ``new`` (KEK rotation); how many rows (0 or 1)."""
    row = session.scalar(select(LogKey).with_for_update())
    if row is None:
        return 0
    private = open_log_key(row, current).signer.private_key
    raw = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    row.nonce = secrets.token_bytes(12)
    row.wrapped_private = AESGCM(new.material).encrypt(row.nonce, raw, _ad(row.origin, new.id))
    row.kek_id = new.id
    return 1

