"""Signing keys in the store: Ed25519 keys that sign receipts and detection reports.

The private key (32 raw bytes) is sealed with AES-256-GCM under the KEK, like a watermark
secret, with associated data binding the key id and the sealing KEK id; one opaque
:class:`~keys.errors.UnwrapError` on any failure. One key is ``active`` (signs); ``rotate``
retires it and makes a new one active in one transaction; ``revoke`` (a compromise) retires
a key and distrusts everything it signed.

Every creation, retirement and revocation is a leaf of the transparency log (ledger.log.leaves:
the key's id, public key and validity window ``[not_before, not_after)``, and
``revoked_at``), written in the transaction of the change and audited. What the log says
is the truth: the gateway signs only with a key whose latest logged event shows it active,
and the key set (:func:`public_keyset`) lists only logged keys, each with the inclusion
proof of its latest event against one signed checkpoint. A row inserted or changed by
anyone without the KEK (who cannot add an authentic leaf) changes nothing a verifier
trusts; ``hallmark ledger verify`` reports the difference.

The gateway's PostgreSQL role may only read ``signing_keys`` (keys.roles): key changes are
the admin CLI's, run as the owner; on SQLite the gateway creates the first key at start.
"""

from __future__ import annotations

import json
import secrets
import struct
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from keys import clock
from keys.audit import record_audit
from keys.errors import InvalidInput, InvalidTransition, KeyStoreError, UnwrapError
from keys.kek import Kek, Keyring
from keys.material import check_wrapping_kek
from keys.models import LogLeaf
from keys.models import SigningKey as Row
from ledger.chain import timestamp
from ledger.log import tlog
from ledger.log.key import LogAuthority
from ledger.receipts import ALGORITHM, Signer, b64url, key_id_of

AD_LABEL = b"hallmark/signing-key-wrap/v1"
ACTIVE, RETIRED, REVOKED = "active", "retired", "revoked"


class NoSigningKey(KeyStoreError, LookupError):
    def __init__(self) -> None:
        super().__init__("no active signing key in the transparency log: create one with "
                         "`hallmark signing-keys create`")


@dataclass(frozen=True)
class SigningKeyInfo:
    kid: str
    state: str
    """``active``, ``retired`` or ``revoked``, as the key's latest logged event says
    (the row's own state when the key is not in the log)."""
    kek_id: str
    public_key: str
    created_at: datetime
    retired_at: datetime | None
    revoked_at: datetime | None = None
    revocation_reason: str | None = None
    logged: bool = False
    """Whether the transparency log holds the key (an authentic event names it)."""
    consistent: bool = True
    """Whether the row agrees with the key's latest logged event (False: someone changed
    the row without the log key)."""

    def to_dict(self) -> dict[str, Any]:
        return {"kid": self.kid, "alg": ALGORITHM, "state": self.state, "kek_id": self.kek_id,
                "public_key": self.public_key, "created_at": timestamp(self.created_at),
                "not_before": timestamp(self.created_at),
                "not_after": timestamp(self.retired_at) if self.retired_at else None,
                "retired_at": timestamp(self.retired_at) if self.retired_at else None,
                "revoked_at": timestamp(self.revoked_at) if self.revoked_at else None,
                "revocation_reason": self.revocation_reason, "logged": self.logged, "consistent": self.consistent}


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


def rewrap_signing_keys(session: Session, current: Keyring, new: Kek) -> int:
    """Re-seal every signing key under ``new``, rows locked (KEK rotation: ledger.sealed);
    how many."""
    rows = list(session.scalars(select(Row).order_by(Row.id).with_for_update()))
    for row in rows:
        rewrap_signing_key(row, current, new)
    return len(rows)


# --- what the log says about each key --------------------------------------------------------


@dataclass(frozen=True)
class LoggedKey:
    """A signing key's latest authentic event in the log."""

    leaf_index: int
    event: dict[str, Any]

    @property
    def state(self) -> str:
        if self.event["revoked_at"]:
            return REVOKED
        return RETIRED if self.event["not_after"] else ACTIVE


def logged_keys(session: Session, auth: LogAuthority | None = None) -> dict[str, LoggedKey]:
    """kid -> its latest event whose leaf authenticates under the log key (empty without one)."""
    auth = auth or tlog.authority(session)
    if auth is None:
        return {}
    out: dict[str, LoggedKey] = {}
    for leaf in session.scalars(select(LogLeaf).where(LogLeaf.kind == "signing_key").order_by(LogLeaf.idx)):
        if leaf.data is None or not tlog.leaf_authentic(auth, leaf):
            continue
        event = json.loads(leaf.data)
        if event.get("kid") == leaf.kid:
            out[leaf.kid] = LoggedKey(leaf.idx, event)
    return out


def _consistent(row: Row, logged: LoggedKey) -> bool:
    event = logged.event
    return (event["public_key"] == b64url(row.public_key) and event["not_before"] == timestamp(row.created_at)
            and event["not_after"] == (timestamp(row.retired_at) if row.retired_at else None)
            and event["revoked_at"] == (timestamp(row.revoked_at) if row.revoked_at else None))


def _info(row: Row, logged: LoggedKey | None) -> SigningKeyInfo:
    state = logged.state if logged is not None else (REVOKED if row.revoked_at else row.state)
    return SigningKeyInfo(kid=row.id, state=state, kek_id=row.kek_id, public_key=b64url(row.public_key),
                          created_at=row.created_at, retired_at=row.retired_at, revoked_at=row.revoked_at,
                          revocation_reason=row.revocation_reason, logged=logged is not None,
                          consistent=logged is not None and _consistent(row, logged))


def _log_event(session: Session, row: Row, event: str, now: datetime, **extra: Any) -> None:
    auth = tlog.writer_authority(session)
    if auth is None:
        raise KeyStoreError("signing-key changes need the transparency log, which is switched off in this store")
    tlog.append_key_event(session, auth, {**tlog.key_event_of(row, event, now), **extra}, now=now)


def size_before(session: Session, when: datetime, now: datetime) -> int:
    """How many leaves the log shows were appended before ``when``: the current size for a
    time not in the past, else the largest checkpoint signed (under the log key: a row of
    log_checkpoints anyone could insert proves nothing) no later than ``when``; 0 if none."""
    auth = tlog.required_authority(session)
    if when >= now:
        return tlog.read_head(session, auth, lock=True)[0]
    from keys.models import LogCheckpoint
    from ledger.log.note import NoteError, open_checkpoint

    limit = int(when.timestamp() * 1e9)
    best = 0
    for note in session.scalars(select(LogCheckpoint.note).order_by(LogCheckpoint.size.desc())):
        try:
            checkpoint = open_checkpoint(note, auth.verifier)
        except NoteError:
            continue
        if checkpoint.timestamp_ns <= limit:
            best = max(best, checkpoint.size)
    return best


# --- changes ---------------------------------------------------------------------------------


def _may_write(session: Session) -> None:
    if session.get_bind().dialect.name == "postgresql" and not session.execute(
            text("SELECT has_table_privilege('signing_keys', 'INSERT')")).scalar():
        raise InvalidTransition("this database role may not write signing keys (the gateway's role never may): "
                                "run `hallmark signing-keys` as the database owner")


def _insert(session: Session, keyring: Keyring, now: datetime) -> Row:
    private = Ed25519PrivateKey.generate()
    public_raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    kid = key_id_of(public_raw)
    wrapped, nonce = _seal(keyring.primary, kid,
                           private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()))
    row = Row(id=kid, public_key=public_raw, wrapped_private=wrapped, nonce=nonce, kek_id=keyring.primary.id,
              state=ACTIVE, created_at=now, retired_at=None, revoked_at=None)
    session.add(row)
    session.flush()
    _log_event(session, row, "created", now)
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
    _may_write(session)
    check_wrapping_kek(session, keyring)
    if _active(session, lock=True) is not None:
        raise InvalidTransition("a signing key is already active; use `hallmark signing-keys rotate`")
    row = _insert(session, keyring, now)
    record_audit(session, actor=actor, action="signing_key.created", details={"kid": row.id, "kek_id": row.kek_id},
                 now=now)
    return _info(row, logged_keys(session).get(row.id))


def _retire(session: Session, row: Row, now: datetime) -> None:
    row.state, row.retired_at = RETIRED, now
    session.flush()


def rotate_signing_key(session: Session, keyring: Keyring, *, actor: str, now: datetime | None = None
                       ) -> tuple[SigningKeyInfo, SigningKeyInfo | None]:
    """Retire the active key (if any) and make a new one active. Returns (new, retired)."""
    now = clock.resolve(now)
    _may_write(session)
    check_wrapping_kek(session, keyring)
    current = _active(session, lock=True)
    if current is not None:
        _retire(session, current, now)
        _log_event(session, current, "retired", now)
    row = _insert(session, keyring, now)
    record_audit(session, actor=actor, action="signing_key.rotated",
                 details={"kid": row.id, "retired_kid": current.id if current else None, "kek_id": row.kek_id},
                 now=now)
    logged = logged_keys(session)
    return _info(row, logged.get(row.id)), _info(current, logged.get(current.id)) if current else None


def revoke_signing_key(session: Session, keyring: Keyring, *, kid: str, reason: str, actor: str,
                       now: datetime | None = None, compromised_at: datetime | None = None,
                       ) -> tuple[SigningKeyInfo, SigningKeyInfo | None]:
    """Revoke ``kid``: its private key is compromised since ``compromised_at`` (default: now).
    Its logged event records that time as ``revoked_at`` and, as ``trusted_below``, how many
    leaves the log shows were appended before it (:func:`size_before`): verifiers keep its
    receipts of those entries (ledger.receipts.check_window) and refuse everything else it
    signed. The active key's revocation makes a new key active in the same transaction.
    Returns (revoked, new or None)."""
    now = clock.resolve(now)
    compromised_at = now if compromised_at is None else clock.resolve(compromised_at)
    if compromised_at > now:
        raise InvalidInput("the compromise time cannot be in the future")
    if not isinstance(reason, str) or not reason.strip() or len(reason) > 500:
        raise InvalidInput("give a reason for the revocation (1-500 characters)")
    _may_write(session)
    row = session.scalar(select(Row).where(Row.id == kid).with_for_update())
    if row is None:
        raise InvalidInput(f"no signing key {kid!r}")
    if row.revoked_at is not None:
        raise InvalidTransition(f"signing key {kid} is already revoked")
    was_active = row.state == ACTIVE
    if was_active:
        check_wrapping_kek(session, keyring)
        _retire(session, row, now)
    below = size_before(session, compromised_at, now)
    row.revoked_at, row.revocation_reason = compromised_at, reason.strip()
    session.flush()
    _log_event(session, row, "revoked", now, trusted_below=below)
    new = _insert(session, keyring, now) if was_active else None
    record_audit(session, actor=actor, action="signing_key.revoked",
                 details={"kid": row.id, "reason": reason.strip(), "new_kid": new.id if new else None,
                          "compromised_at": timestamp(compromised_at), "trusted_below": below}, now=now)
    logged = logged_keys(session)
    return _info(row, logged.get(row.id)), _info(new, logged.get(new.id)) if new else None


def ensure_signing_key(session: Session, keyring: Keyring, *, actor: str) -> None:
    """Create the first signing key if the log holds no active one and the store has no
    active row (the gateway's start on a store it may write)."""
    if any(k.state == ACTIVE for k in logged_keys(session).values()):
        return
    if _active(session) is None:
        try:
            _may_write(session)
        except InvalidTransition:
            raise NoSigningKey() from None
        try:
            create_signing_key(session, keyring, actor=actor)
        except InvalidTransition:
            # Another replica starting at the same moment committed the first key between
            # the check above and create_signing_key's locked one: that key serves both.
            # (Two inserts racing past both checks collide on uq_signing_keys_one_active
            # instead: ConcurrentChange, and the caller retries.)
            if _active(session) is None:
                raise


def list_signing_keys(session: Session) -> list[SigningKeyInfo]:
    logged = logged_keys(session)
    return [_info(row, logged.get(row.id)) for row in session.scalars(select(Row).order_by(Row.created_at, Row.id))]


def active_signer(session: Session, keyring: Keyring) -> Signer:
    """The key that signs now: the one whose latest logged event shows it active (never
    a row's own say-so)."""
    logged = logged_keys(session)
    active = sorted((k for k in logged.values() if k.state == ACTIVE), key=lambda k: k.leaf_index)
    if not active:
        raise NoSigningKey()
    row = session.get(Row, active[-1].event["kid"])
    if row is None or b64url(row.public_key) != active[-1].event["public_key"]:
        raise NoSigningKey()
    return Signer(kid=row.id, private_key=_open(keyring, row))


def public_keyset(session: Session) -> dict[str, Any]:
    """The ``/.well-known/hallmark-keys.json`` document (format: ledger.keyset): every signing
    key the log holds, with its window and the inclusion proof of its latest event against
    one checkpoint signed now, and the log's public key."""
    auth = tlog.authority(session)
    if auth is None:  # a store whose log is not set up yet holds no key a verifier could trust
        return {"log": None, "keys": []}
    size, root, note = tlog.current_checkpoint(session, auth)
    logged = logged_keys(session, auth)
    rows = {row.id: row for row in session.scalars(select(Row))}
    keys = []
    for kid, found in sorted(logged.items(), key=lambda item: item[1].event["not_before"]):
        event = found.event
        keys.append({"kid": kid, "alg": ALGORITHM, "public_key": event["public_key"], "state": found.state,
                     "not_before": event["not_before"], "not_after": event["not_after"],
                     "revoked_at": event["revoked_at"], "trusted_below": event.get("trusted_below"),
                     "revocation_reason": rows[kid].revocation_reason if kid in rows else None,
                     "log": {"leaf_index": found.leaf_index, "event": event,
                             "inclusion_proof": [b64(h) for h in tlog.inclusion_proof(session, found.leaf_index, size)]}})
    return {"log": {"origin": auth.origin, "vkey": auth.verifier.vkey, "tree_size": size, "checkpoint": note},
            "keys": keys}


def b64(raw: bytes) -> str:
    import base64

    return base64.b64encode(raw).decode("ascii")
