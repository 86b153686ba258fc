"""A key's life: create or import, rotate (active -> verify-only), revoke; list and show.

States: ``active`` (generates and detects; at most one per tenant), ``verify-only``
(detects only; a rotated-out key, or a key created while another was active) and
``revoked`` (compromised; detections under it are reported as revoked). Every change
takes the tenant's row lock first (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite
serialises writers), and a partial unique index backs the one-active rule in the database.
Each change writes its audit events in the same transaction.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from keys import clock
from keys.audit import record_audit
from keys.envelope import KeyBinding, wrap_secret
from keys.errors import DuplicateKey, InvalidInput, InvalidTransition, NoActiveKey, UnknownKey
from keys.kek import Keyring
from keys.material import check_wrapping_kek, spec_of
from keys.models import ACTIVE, REVOKED, VERIFY_ONLY, Tenant
from keys.models import KeyRow
from keys.tenants import get_tenant, get_tenant_by_id, new_id
from watermark import prf
from watermark.key import check_value, fingerprint
from watermark.spec import NEW_KEY_DIVERSITY, NEW_KEY_MODE, NEW_KEY_PRF, WatermarkSpec
from watermark.validation import summary

log = logging.getLogger("hallmark.keys")

MAX_REASON_LENGTH = 500
MAX_SOURCE_LENGTH = 200


@dataclass(frozen=True)
class KeyRecord:
    """A key's public record: everything but the secret."""

    key_id: str
    tenant_id: str
    tenant: str
    version: int
    state: str
    fingerprint: str
    spec: WatermarkSpec
    kek_id: str
    imported: bool
    import_source: str | None
    created_at: datetime
    activated_at: datetime | None
    verify_only_at: datetime | None
    revoked_at: datetime | None
    revocation_reason: str | None

    def to_dict(self) -> dict[str, Any]:
        def iso(value: datetime | None) -> str | None:
            return value.isoformat() if value is not None else None

        return {"key_id": self.key_id, "tenant": self.tenant, "tenant_id": self.tenant_id,
                "version": self.version, "state": self.state, "fingerprint": self.fingerprint,
                "spec": self.spec.public_dict(), "key_bits": self.spec.key_bits, "kek_id": self.kek_id,
                "imported": self.imported,
                "import_source": self.import_source, "created_at": iso(self.created_at),
                "activated_at": iso(self.activated_at), "verify_only_at": iso(self.verify_only_at),
                "revoked_at": iso(self.revoked_at), "revocation_reason": self.revocation_reason}


@dataclass(frozen=True)
class Rotation:
    """The result of a rotation: the new active key and the previous one, now verify-only."""

    new: KeyRecord
    previous: KeyRecord


def key_info(row: KeyRow, tenant_name: str) -> KeyRecord:
    return KeyRecord(key_id=row.id, tenant_id=row.tenant_id, tenant=tenant_name, version=row.version,
                   state=row.state, fingerprint=row.shown_fingerprint, spec=spec_of(row), kek_id=row.kek_id,
                   imported=row.imported, import_source=row.import_source, created_at=row.created_at,
                   activated_at=row.activated_at, verify_only_at=row.verify_only_at,
                   revoked_at=row.revoked_at, revocation_reason=row.revocation_reason)


def build_spec(base: WatermarkSpec | None = None, **changes: Any) -> WatermarkSpec:
    """A validated spec: ``base`` (default: the defaults, in mode
    :data:`~watermark.spec.NEW_KEY_MODE`) with ``changes`` applied (field names; a given None
    is a value, e.g. ``dedup_max_history=None`` searches everything). A ``base`` keeps its
    mode (a rotation does not change how a tenant's text is generated unless asked).
    Invalid values raise :class:`InvalidInput` in one line."""
    fields = base.public_dict() if base is not None else {"mode": NEW_KEY_MODE, "prf": NEW_KEY_PRF}
    fields.update(changes)
    fields = _with_diversity(fields, changes, new=base is None)
    try:
        return WatermarkSpec.model_validate(fields)
    except ValidationError as exc:
        raise InvalidInput(f"invalid watermark spec: {summary(exc, default='spec')}") from None


def _with_diversity(fields: dict[str, Any], changes: Mapping[str, Any], new: bool) -> dict[str, Any]:
    """``fields`` with a `diverse` key's scheme where nobody named one: a key that becomes
    `diverse` here (a new key, or ``mode`` changed to it) gets :data:`NEW_KEY_DIVERSITY`
    (`head`) with dedup scope `all`, which it needs, unless the creator named another scope
    (then `salt`); a base that is already `diverse` keeps its scheme (a rotation does not
    change how a tenant's text is generated unless asked) unless a named scope other than
    `all` rules `head` out (then `salt`); a key made `deterministic` has none."""
    if "diversity" in changes:
        return fields
    if fields.get("mode") != "diverse":  # a base's scheme does not outlive its mode
        return {name: value for name, value in fields.items() if name != "diversity"}
    scope = fields.get("dedup", fields.get("deduplicate_contexts"))
    if fields.get("diversity") == "head" and scope is not None and scope != "all":
        return {**fields, "diversity": "salt"}  # the head scheme needs scope all: a named scope wins
    became = new or "mode" in changes
    if not became or fields.get("diversity") is not None:
        return fields
    named_dedup = changes.get("dedup", changes.get("deduplicate_contexts"))
    if named_dedup is None and new:
        fields = {**fields, "dedup": "all"}
    scope = fields.get("dedup", fields.get("deduplicate_contexts"))
    return {**fields, "diversity": NEW_KEY_DIVERSITY if scope == "all" else "salt"}


def spec_for_new_key(session: Session, *, tenant: str,
                     changes: Mapping[str, Any] | None = None) -> tuple[WatermarkSpec, KeyRecord | None]:
    """The spec a new key of ``tenant`` gets when the caller names only what to change: the
    tenant's current spec (its active key's, else its newest key's, say after the active one
    was revoked) with ``changes`` applied, and the key it came from; the defaults with
    ``changes`` for a tenant without keys (source None). Takes the tenant's lock, so a
    rotation cannot slip in before the key is created in the same transaction."""
    tenant_row = get_tenant(session, name=tenant, lock=True)
    source = _active_row(session, tenant_row.id) or session.scalar(
        select(KeyRow).where(KeyRow.tenant_id == tenant_row.id).order_by(KeyRow.version.desc()).limit(1))
    base = spec_of(source) if source is not None else None
    return build_spec(base, **dict(changes or {})), (key_info(source, tenant_row.name) if source else None)


def _spec_json(spec: WatermarkSpec) -> dict[str, Any]:
    return spec.public_dict()


def _insert_key(session: Session, keyring: Keyring, *, tenant: Tenant, secret: int,
                spec: WatermarkSpec, state: str, imported: bool, import_source: str | None,
                now: datetime) -> KeyRow:
    """Wrap and insert a new version of ``tenant``'s key. Caller holds the tenant lock."""
    check = check_value(secret)  # private: the column, never shown (see watermark.key)
    clash = session.execute(
        select(KeyRow.id, Tenant.name).join(Tenant, Tenant.id == KeyRow.tenant_id)
        .where(KeyRow.fingerprint == check)
    ).first()
    if clash is not None:
        raise DuplicateKey(fingerprint(secret), clash[0], clash[1])
    version = (session.scalar(select(func.max(KeyRow.version)).where(KeyRow.tenant_id == tenant.id))
               or 0) + 1
    key_id = new_id("key")
    wrapped = wrap_secret(keyring, secret=secret,
                          binding=KeyBinding(tenant_id=tenant.id, key_id=key_id, version=version))
    row = KeyRow(id=key_id, tenant_id=tenant.id, version=version, wrapped_secret=wrapped.ciphertext,
                 nonce=wrapped.nonce, kek_id=wrapped.kek_id, spec=_spec_json(spec),
                 fingerprint=check, state=state, imported=imported, import_source=import_source,
                 created_at=now, activated_at=now if state == ACTIVE else None,
                 verify_only_at=now if state == VERIFY_ONLY else None)
    session.add(row)
    session.flush()
    return row


def _active_row(session: Session, tenant_id: str, *, lock: bool = False) -> KeyRow | None:
    query = select(KeyRow).where(KeyRow.tenant_id == tenant_id, KeyRow.state == ACTIVE)
    if lock:
        query = query.with_for_update()
    return session.scalar(query)


def _new_key_details(row: KeyRow) -> dict[str, Any]:
    return {"version": row.version, "state": row.state, "fingerprint": row.shown_fingerprint,
            "kek_id": row.kek_id, "spec": row.spec}


def create_key(session: Session, keyring: Keyring, *, tenant: str, actor: str,
               spec: WatermarkSpec | None = None, now: datetime | None = None) -> KeyRecord:
    """A new random key for ``tenant`` (a name): active if the tenant has no active key,
    else verify-only (use :func:`rotate_key` to replace the active key). Audited."""
    now = clock.resolve(now)
    tenant_row = get_tenant(session, name=tenant, lock=True)
    check_wrapping_kek(session, keyring)
    state = VERIFY_ONLY if _active_row(session, tenant_row.id) is not None else ACTIVE
    spec = spec or build_spec()
    row = _insert_key(session, keyring, tenant=tenant_row, secret=secrets.randbits(spec.key_bits),
                      spec=spec, state=state, imported=False,
                      import_source=None, now=now)
    record_audit(session, actor=actor, action="key.created", tenant_id=tenant_row.id, key_id=row.id,
                 details=_new_key_details(row), now=now)
    log.info("created key %s (tenant %s, version %d, %s, fingerprint %s) by %s",
             row.id, tenant_row.name, row.version, row.state, row.shown_fingerprint, actor)
    return key_info(row, tenant_row.name)


def import_key(session: Session, keyring: Keyring, *, tenant: str, secret: int, spec: WatermarkSpec,
               actor: str, source: str | None = None, now: datetime | None = None) -> KeyRecord:
    """Store an existing deployment's key (for example a vLLM ``--watermark-config`` key) so
    that its text is detected and attributed. State as for :func:`create_key`. Audited,
    without the secret. :class:`DuplicateKey` if the same secret is already stored."""
    try:
        prf.check_key(secret, spec.key_bits)
    except ValueError:
        raise InvalidInput(f"the imported secret must be an integer in [0, 2**{spec.key_bits} - 1] "
                           f"(prf {spec.prf})") from None
    source = (source or "vllm").strip()[:MAX_SOURCE_LENGTH] or "vllm"
    now = clock.resolve(now)
    tenant_row = get_tenant(session, name=tenant, lock=True)
    check_wrapping_kek(session, keyring)
    state = VERIFY_ONLY if _active_row(session, tenant_row.id) is not None else ACTIVE
    row = _insert_key(session, keyring, tenant=tenant_row, secret=secret, spec=spec, state=state,
                      imported=True, import_source=source, now=now)
    record_audit(session, actor=actor, action="key.imported", tenant_id=tenant_row.id, key_id=row.id,
                 details={**_new_key_details(row), "source": source}, now=now)
    log.info("imported key %s (tenant %s, version %d, %s, fingerprint %s, source %s) by %s",
             row.id, tenant_row.name, row.version, row.state, row.shown_fingerprint, source, actor)
    return key_info(row, tenant_row.name)


def rotate_key(session: Session, keyring: Keyring, *, tenant: str, actor: str,
               spec_changes: Mapping[str, Any] | None = None, now: datetime | None = None) -> Rotation:
    """Atomically make a new random key active and the current active key verify-only.

    The new key keeps the current spec, with ``spec_changes`` (field names) applied.
    Concurrent rotations of one tenant serialise on the tenant's row lock, so each one
    rotates the key the previous one made and exactly one key ends active.
    """
    now = clock.resolve(now)
    tenant_row = get_tenant(session, name=tenant, lock=True)
    check_wrapping_kek(session, keyring)
    current = _active_row(session, tenant_row.id, lock=True)
    if current is None:
        has_keys = session.scalar(select(KeyRow.id).where(KeyRow.tenant_id == tenant_row.id).limit(1))
        if has_keys is None:
            raise NoActiveKey(tenant)
        raise InvalidTransition(
            f"tenant {tenant!r} has no active key to rotate (its keys are verify-only or revoked); "
            f"create one with `hallmark keys create --tenant {tenant}`"
        )
    spec = build_spec(spec_of(current), **dict(spec_changes or {}))
    current.state = VERIFY_ONLY
    current.verify_only_at = now
    # The old key must stop being active before the new one is inserted (one-active index).
    session.flush()
    row = _insert_key(session, keyring, tenant=tenant_row, secret=secrets.randbits(spec.key_bits), spec=spec,
                      state=ACTIVE, imported=False, import_source=None, now=now)
    record_audit(session, actor=actor, action="key.verify_only", tenant_id=tenant_row.id,
                 key_id=current.id, details={"version": current.version, "previous_state": ACTIVE,
                                             "replaced_by": row.id, "replaced_by_version": row.version},
                 now=now)
    record_audit(session, actor=actor, action="key.rotated", tenant_id=tenant_row.id, key_id=row.id,
                 details={**_new_key_details(row), "previous_key_id": current.id,
                          "previous_version": current.version}, now=now)
    log.info("rotated tenant %s: key %s (version %d) active, key %s (version %d) verify-only, by %s",
             tenant_row.name, row.id, row.version, current.id, current.version, actor)
    return Rotation(new=key_info(row, tenant_row.name), previous=key_info(current, tenant_row.name))


def _check_reason(reason: str) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("a revocation needs a reason (--reason TEXT)")
    reason = " ".join(reason.split())
    if len(reason) > MAX_REASON_LENGTH:
        raise InvalidInput(f"the revocation reason is longer than {MAX_REASON_LENGTH} characters")
    return reason


def revoke_key(session: Session, *, key_id: str, reason: str, actor: str,
               now: datetime | None = None) -> KeyRecord:
    """Mark a key compromised. Revoking the active key leaves the tenant without one until
    ``keys create``. :class:`InvalidTransition` if it is already revoked. Audited."""
    reason = _check_reason(reason)
    now = clock.resolve(now)
    tenant_id = session.scalar(select(KeyRow.tenant_id).where(KeyRow.id == key_id))
    if tenant_id is None:
        raise UnknownKey(key_id)
    # Tenant lock first, as every key change takes it: one lock order, no deadlocks.
    tenant_row = get_tenant_by_id(session, tenant_id=tenant_id, lock=True)
    row = session.scalar(select(KeyRow).where(KeyRow.id == key_id).with_for_update())
    if row.state == REVOKED:
        raise InvalidTransition(f"key {key_id} is already revoked (at "
                                f"{row.revoked_at:%Y-%m-%d %H:%M:%S} UTC); nothing changed")
    previous = row.state
    row.state = REVOKED
    row.revoked_at = now
    row.revocation_reason = reason
    session.flush()
    record_audit(session, actor=actor, action="key.revoked", tenant_id=tenant_id, key_id=key_id,
                 details={"version": row.version, "previous_state": previous, "reason": reason},
                 now=now)
    log.info("revoked key %s (tenant %s, version %d, was %s) by %s: %s",
                key_id, tenant_row.name, row.version, previous, actor, reason)
    return key_info(row, tenant_row.name)


def get_key(session: Session, *, key_id: str) -> KeyRecord:
    found = session.execute(
        select(KeyRow, Tenant.name).join(Tenant, Tenant.id == KeyRow.tenant_id).where(KeyRow.id == key_id)
    ).first()
    if found is None:
        raise UnknownKey(key_id)
    return key_info(found[0], found[1])


def list_keys(session: Session, *, tenant: str | None = None) -> list[KeyRecord]:
    """Keys of one tenant (a name) or of all, ordered by tenant name then version."""
    query = select(KeyRow, Tenant.name).join(Tenant, Tenant.id == KeyRow.tenant_id)
    if tenant is not None:
        query = query.where(KeyRow.tenant_id == get_tenant(session, name=tenant).id)
    return [key_info(row, name) for row, name in
            session.execute(query.order_by(Tenant.name, KeyRow.version)).all()]
