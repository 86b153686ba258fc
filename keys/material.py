"""Opening stored keys: the secrets the generator and the detector run under.

Everything here unwraps. A secret leaves the store only inside a :class:`StoredKey` (for
generation and detection, ``repr`` hides it) or an :class:`ExportedKey` (the audited
``keys export``). After unwrapping, the secret's fingerprint is checked against the row's,
so even a correctly sealed but misfiled secret is refused.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from keys import clock
from keys.audit import record_audit
from keys.envelope import KeyBinding, WrappedSecret, unwrap_secret
from keys.errors import KekError, KeyStoreError, StaleKek, NoActiveKey, UnknownKey, UnknownTenant, UnwrapError
from keys.kek import Keyring
from keys.models import ACTIVE, LogKey, SigningKey, StoreKek, Tenant
from keys.models import KeyRow
from keys.tenants import get_tenant
from watermark.key import WatermarkKey, check_value, fingerprint_of_check_value
from watermark.spec import WatermarkSpec

log = logging.getLogger("hallmark.keys")


@dataclass(frozen=True)
class StoredKey:
    """A stored key, opened: its identity, state and spec, and the key material itself."""

    tenant_id: str
    tenant: str
    key_id: str
    version: int
    state: str
    fingerprint: str
    spec: WatermarkSpec
    created_at: datetime
    material: WatermarkKey = field(repr=False)
    revoked_at: datetime | None = None

    def public_dict(self) -> dict[str, Any]:
        """The key as DESIGN.md's detection result names it (no secret)."""
        return {"tenant": self.tenant, "key_id": self.key_id, "version": self.version,
                "state": self.state, "fingerprint": self.fingerprint,
                "algorithm": self.spec.algorithm}


@dataclass(frozen=True)
class ExportedKey:
    """A key with its secret, for ``keys export`` only."""

    tenant: str
    key_id: str
    version: int
    state: str
    fingerprint: str
    spec: WatermarkSpec
    secret: int = field(repr=False)

    def vllm_watermark_config(self) -> dict[str, Any] | None:
        """vLLM's ``--watermark-config`` for this key (with the key), or None when vLLM cannot
        express the spec (a keyed acceptance coin, a `salt`-diverse key's per-generation salt, or a
        PRF vLLM does not have: ``hmac-sha256-philox-v1``); a `head`-diverse key is vLLM's scheme
        with dedup scope `all`."""
        from watermark.prf import VLLM_NAMES

        if self.spec.coin != "ordinary" or self.spec.salted or self.spec.prf not in VLLM_NAMES:
            return None
        return {**self.spec.to_vllm(), "key": self.secret}


def binding_of(row: KeyRow) -> KeyBinding:
    return KeyBinding(tenant_id=row.tenant_id, key_id=row.id, version=row.version)


def wrapped_of(row: KeyRow) -> WrappedSecret:
    return WrappedSecret(ciphertext=row.wrapped_secret, nonce=row.nonce, kek_id=row.kek_id)


def spec_of(row: KeyRow) -> WatermarkSpec:
    return _validated_spec(row.id, row.spec)


def open_secret(keyring: Keyring, row: KeyRow) -> int:
    """The row's secret; :class:`KekError` for a KEK not on the ring, :class:`UnwrapError`
    for anything that does not authenticate or does not match the row's fingerprint."""
    secret = unwrap_secret(keyring, wrapped=wrapped_of(row), binding=binding_of(row))
    if check_value(secret) != row.fingerprint:
        raise UnwrapError(row.id)
    return secret


def lock_store_kek(session: Session, *, exclusive: bool = False) -> StoreKek | None:
    """Lock the store's KEK row: shared by every writer of a wrapped secret, exclusive by
    KEK rotation (PostgreSQL row locks; SQLite write transactions are exclusive anyway).
    A writer holding it shared cannot interleave with a rotation: the rotation waits for
    the writer to commit and then re-wraps its row too, and a writer that starts during a
    rotation waits for it and then sees the new KEK on every row."""
    query = select(StoreKek).where(StoreKek.id == 1)
    query = query.with_for_update() if exclusive else query.with_for_update(read=True)
    return session.scalar(query)


def check_wrapping_kek(session: Session, keyring: Keyring) -> None:
    """Refuse to wrap a new secret under a KEK other than the one the store already uses,
    which would leave the store split between two KEKs (run ``kek rotate`` instead). Takes
    the store's KEK lock (shared) first, so the answer holds until the caller commits."""
    marker = lock_store_kek(session)
    in_use = set(session.scalars(select(KeyRow.kek_id).distinct()))
    in_use |= set(session.scalars(select(SigningKey.kek_id).distinct()))
    in_use |= set(session.scalars(select(LogKey.kek_id)))
    if marker is not None and marker.kek_id is not None:
        in_use.add(marker.kek_id)
    other = sorted(in_use - {keyring.primary.id})
    if other:
        raise StaleKek(
            f"the configured KEK (id {keyring.primary.id}) is not the KEK this store's keys are "
            f"wrapped with (id {', '.join(other)}); set HALLMARK_KEK or HALLMARK_KEK_FILE to "
            "that KEK"
        )


def _stored(keyring: Keyring, row: KeyRow, tenant_name: str) -> StoredKey:
    spec = spec_of(row)
    return StoredKey(tenant_id=row.tenant_id, tenant=tenant_name, key_id=row.id,
                     version=row.version, state=row.state, fingerprint=row.shown_fingerprint, spec=spec,
                     created_at=row.created_at, revoked_at=row.revoked_at,
                     material=WatermarkKey(secret=open_secret(keyring, row), spec=spec))


def active_key(session: Session, keyring: Keyring, *, tenant_id: str) -> StoredKey:
    """The tenant's active key, opened (what generation runs under).

    Raises :class:`UnknownTenant`, :class:`NoActiveKey`, :class:`KekError`, :class:`UnwrapError`.
    """
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        raise UnknownTenant(tenant_id, is_id=True)
    row = session.scalar(select(KeyRow).where(KeyRow.tenant_id == tenant_id, KeyRow.state == ACTIVE))
    if row is None:
        raise NoActiveKey(tenant.name)
    return _stored(keyring, row, tenant.name)


_DETECTION_COLUMNS = (KeyRow.id, KeyRow.tenant_id, KeyRow.version, KeyRow.wrapped_secret, KeyRow.nonce,
                      KeyRow.kek_id, KeyRow.spec, KeyRow.fingerprint, KeyRow.state, KeyRow.created_at,
                      KeyRow.revoked_at, Tenant.name)


def detection_keys(session: Session, keyring: Keyring, *, tenant: str | None = None) -> list[StoredKey]:
    """Every key, whatever its state, of tenant ``tenant`` (a name) or of all tenants,
    opened, ordered by tenant name then version. A detector tests them all and reports a
    match under a revoked key as such.

    One query for all of them, read as plain rows (no ORM objects), each distinct spec
    validated once, each secret opened under its KEK's cached cipher and checked against
    its row's check value, as :func:`open_secret` does: tens of microseconds a key less
    than one ORM row at a time (``bench/multikey.py`` measures it)."""
    return OpenedKeys(tenant).load(session, keyring)


class OpenedKeys:
    """One scope's keys (tenant ``tenant``'s, or every tenant's) as :func:`detection_keys`
    opens them, kept between loads so that loading again reopens only the rows that changed.

    A service reloads its scopes every few seconds (its key cache's TTL) to see keys
    created, rotated or revoked through other gateways; at thousands of keys, unwrapping
    every secret again each time was most of that cost. :meth:`load` reads every row as
    :func:`detection_keys` does and compares it, column by column, with the row its key was
    opened from: an equal row gives back the same :class:`StoredKey` object (its secret was
    authenticated from exactly these bytes), any other row is opened as new. So a load
    returns exactly what a fresh open returns now (a revoked key shows revoked, a re-wrapped
    one is unwrapped again, a vanished one is gone, a row that no longer authenticates
    fails), and its caller can keep whatever it derived from an unchanged key by identity.
    Not thread-safe: one caller at a time (the service holds a lock per scope)."""

    def __init__(self, tenant: str | None = None) -> None:
        self.tenant = tenant
        self._keyring: Keyring | None = None
        self._opened: dict[str, tuple[tuple, StoredKey]] = {}

    def load(self, session: Session, keyring: Keyring) -> list[StoredKey]:
        """The scope's keys now, ordered by tenant name then version (see the class)."""
        query = select(*_DETECTION_COLUMNS).join(Tenant, Tenant.id == KeyRow.tenant_id)
        if self.tenant is not None:
            query = query.where(KeyRow.tenant_id == get_tenant(session, name=self.tenant).id)
        # Opened under another keyring (one that may lack a KEK), nothing is reused.
        previous = self._opened if keyring is self._keyring else {}
        specs: dict[Any, WatermarkSpec] = {}
        opened: dict[str, tuple[tuple, StoredKey]] = {}
        out = []
        for row in session.execute(query.order_by(Tenant.name, KeyRow.version)):
            row = tuple(row)
            found = previous.get(row[0])
            key = found[1] if found is not None and found[0] == row else _opened_row(keyring, specs, row)
            opened[row[0]] = (row, key)
            out.append(key)
        # Replaced only once every row opened: a failing row leaves the previous state as it was.
        self._keyring, self._opened = keyring, opened
        return out


def _opened_row(keyring: Keyring, specs: dict[Any, WatermarkSpec], row: tuple) -> StoredKey:
    (key_id, tenant_id, version, ciphertext, nonce, kek_id, spec_json, check, state, created_at, revoked_at,
     name) = row
    spec = _spec_once(specs, key_id, spec_json)
    secret = unwrap_secret(keyring, wrapped=WrappedSecret(ciphertext=ciphertext, nonce=nonce, kek_id=kek_id),
                           binding=KeyBinding(tenant_id=tenant_id, key_id=key_id, version=version))
    if check_value(secret) != check:
        raise UnwrapError(key_id)
    return StoredKey(tenant_id=tenant_id, tenant=name, key_id=key_id, version=version, state=state,
                     fingerprint=fingerprint_of_check_value(check), spec=spec, created_at=created_at,
                     revoked_at=revoked_at, material=WatermarkKey(secret=secret, spec=spec))


def _spec_once(specs: dict[Any, WatermarkSpec], key_id: str, spec_json: Any) -> WatermarkSpec:
    """The row's spec, validated once per distinct stored value (a store's keys share a few)."""
    try:
        memo = tuple(sorted(spec_json.items()))
        hash(memo)
    except (AttributeError, TypeError):  # not a flat JSON object: validate (and fail) as usual
        return _validated_spec(key_id, spec_json)
    spec = specs.get(memo)
    if spec is None:
        spec = specs[memo] = _validated_spec(key_id, spec_json)
    return spec


def _validated_spec(key_id: str, spec_json: Any) -> WatermarkSpec:
    try:
        return WatermarkSpec.model_validate(spec_json)
    except ValidationError:
        raise KeyStoreError(f"the stored spec of key {key_id} is not a valid watermark spec; "
                            "restore the row from a backup") from None


def export_key(session: Session, keyring: Keyring, *, key_id: str, actor: str,
               now: datetime | None = None) -> ExportedKey:
    """The key with its secret (audited as ``key.exported``; the event holds no secret)."""
    row = session.get(KeyRow, key_id)
    if row is None:
        raise UnknownKey(key_id)
    tenant = session.get(Tenant, row.tenant_id)
    secret = open_secret(keyring, row)
    record_audit(session, actor=actor, action="key.exported", tenant_id=row.tenant_id, key_id=row.id,
                 details={"version": row.version, "fingerprint": row.shown_fingerprint, "state": row.state},
                 now=clock.resolve(now))
    log.info("exported key %s (fingerprint %s) with its secret, by %s", row.id, row.shown_fingerprint, actor)
    return ExportedKey(tenant=tenant.name if tenant else row.tenant_id, key_id=row.id,
                       version=row.version, state=row.state, fingerprint=row.shown_fingerprint,
                       spec=spec_of(row), secret=secret)
