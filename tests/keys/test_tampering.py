"""Stored ciphertexts that were altered, moved or relabelled do not open."""

from __future__ import annotations

import secrets

import pytest
from sqlalchemy import select, update

from keys.envelope import KeyBinding, wrap_secret
from keys.errors import KekError, KeyStoreError, UnwrapError
from keys.lifecycle import create_key
from keys.material import active_key, detection_keys, export_key
from keys.models import KeyRow
from keys.tenants import create_tenant

ACTOR = "test"


@pytest.fixture
def two_keys(store):
    """Tenant acme with key v1 (active) and v2 (verify-only)."""
    with store.transaction() as session:
        tenant = create_tenant(session, name="acme", actor=ACTOR)
        first = create_key(session, store.keyring, tenant="acme", actor=ACTOR)
        second = create_key(session, store.keyring, tenant="acme", actor=ACTOR)
    return tenant, first, second


def _row(store, key_id):
    with store.transaction(write=False) as session:
        return session.get(KeyRow, key_id)


def _set(store, key_id, **values):
    with store.transaction() as session:
        session.execute(update(KeyRow).where(KeyRow.id == key_id).values(**values))


def _opens(store, key_id):
    with store.transaction() as session:
        return export_key(session, store.keyring, key_id=key_id, actor=ACTOR)


def test_a_flipped_ciphertext_bit_does_not_open(store, two_keys):
    tenant, first, _ = two_keys
    row = _row(store, first.key_id)
    flipped = bytes([row.wrapped_secret[0] ^ 0x80]) + row.wrapped_secret[1:]
    _set(store, first.key_id, wrapped_secret=flipped)
    with pytest.raises(UnwrapError) as caught:
        _opens(store, first.key_id)
    assert first.key_id in caught.value.user_message
    with pytest.raises(UnwrapError):
        with store.transaction(write=False) as session:
            active_key(session, store.keyring, tenant_id=tenant.id)


def test_a_ciphertext_moved_to_another_row_does_not_open(store, two_keys):
    _, first, second = two_keys
    source = _row(store, first.key_id)
    _set(store, second.key_id, wrapped_secret=source.wrapped_secret, nonce=source.nonce)
    with pytest.raises(UnwrapError):
        _opens(store, second.key_id)
    assert _opens(store, first.key_id).fingerprint == first.fingerprint  # the original still opens


def test_an_edited_version_does_not_open(store, two_keys):
    _, first, _ = two_keys
    _set(store, first.key_id, version=7)
    with pytest.raises(UnwrapError):
        _opens(store, first.key_id)


def test_a_ciphertext_moved_to_another_tenant_does_not_open(store, two_keys):
    _, first, _ = two_keys
    with store.transaction() as session:
        create_tenant(session, name="beta", actor=ACTOR)
        beta_key = create_key(session, store.keyring, tenant="beta", actor=ACTOR)
    source = _row(store, first.key_id)
    _set(store, beta_key.key_id, wrapped_secret=source.wrapped_secret, nonce=source.nonce)
    with pytest.raises(UnwrapError):
        _opens(store, beta_key.key_id)


def test_a_relabelled_kek_id_is_a_kek_error(store, two_keys):
    _, first, _ = two_keys
    _set(store, first.key_id, kek_id="0123456789abcdef")
    with pytest.raises(KekError, match="KEK"):
        _opens(store, first.key_id)


def test_a_correctly_sealed_but_foreign_secret_fails_the_fingerprint_check(store, two_keys):
    """Someone holding the KEK re-seals another secret for the row: the row's fingerprint
    no longer matches what opens, and the store refuses it."""
    _, first, _ = two_keys
    row = _row(store, first.key_id)
    forged = wrap_secret(store.keyring, secret=secrets.randbits(64),
                         binding=KeyBinding(tenant_id=row.tenant_id, key_id=row.id, version=row.version))
    _set(store, first.key_id, wrapped_secret=forged.ciphertext, nonce=forged.nonce)
    with pytest.raises(UnwrapError):
        _opens(store, first.key_id)


def test_one_tampered_row_fails_detection_loudly(store, two_keys):
    _, first, _ = two_keys
    _set(store, first.key_id, nonce=secrets.token_bytes(12))
    with pytest.raises(UnwrapError):
        with store.transaction(write=False) as session:
            detection_keys(session, store.keyring, tenant="acme")
    with store.transaction(write=False) as session:
        assert session.scalars(select(KeyRow.state).order_by(KeyRow.version)).all() == ["active", "verify-only"]


def _detection(store):
    with store.transaction(write=False) as session:
        return detection_keys(session, store.keyring, tenant="acme")


@pytest.mark.parametrize("tamper", ["bit", "moved", "version", "forged", "kek", "spec"])
def test_opening_every_key_at_once_refuses_what_opening_one_refuses(store, two_keys, tamper):
    """detection_keys reads rows as plain columns, caches ciphers and specs: each tampering
    that stops one key from opening stops the whole detection, with the same error."""
    _, first, second = two_keys
    row = _row(store, second.key_id)
    if tamper == "bit":
        _set(store, second.key_id, wrapped_secret=bytes([row.wrapped_secret[0] ^ 1]) + row.wrapped_secret[1:])
    elif tamper == "moved":
        source = _row(store, first.key_id)
        _set(store, second.key_id, wrapped_secret=source.wrapped_secret, nonce=source.nonce)
    elif tamper == "version":
        _set(store, second.key_id, version=9)
    elif tamper == "forged":
        forged = wrap_secret(store.keyring, secret=secrets.randbits(64),
                             binding=KeyBinding(tenant_id=row.tenant_id, key_id=row.id, version=row.version))
        _set(store, second.key_id, wrapped_secret=forged.ciphertext, nonce=forged.nonce)
    elif tamper == "kek":
        _set(store, second.key_id, kek_id="0123456789abcdef")
    else:
        _set(store, second.key_id, spec={"algorithm": "gumbel", "context_width": 99})
    expected = {"kek": KekError, "spec": KeyStoreError}.get(tamper, UnwrapError)
    with pytest.raises(expected):
        _detection(store)


def test_opening_every_key_at_once_gives_what_opening_each_gives(store, two_keys):
    from keys.material import _stored

    with store.transaction() as session:
        rotate = create_key(session, store.keyring, tenant="acme", actor=ACTOR)
    opened = _detection(store)
    assert [k.key_id for k in opened] == [two_keys[1].key_id, two_keys[2].key_id, rotate.key_id]
    with store.transaction(write=False) as session:
        for key in opened:
            row = session.get(KeyRow, key.key_id)
            one = _stored(store.keyring, row, "acme")
            assert (one.material.secret, one.spec, one.fingerprint, one.state, one.version, one.created_at,
                    one.revoked_at, one.tenant_id) == (key.material.secret, key.spec, key.fingerprint, key.state,
                                                       key.version, key.created_at, key.revoked_at, key.tenant_id)
