"""Loading a scope's keys again (keys.material.OpenedKeys): only changed rows are reopened,
and every load equals a fresh :func:`detection_keys` of the store as it is now (revoked,
rotated, re-wrapped, tampered, new keys), on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from keys.errors import KekError, UnknownTenant, UnwrapError
from keys.kek import Kek, Keyring
from keys.kek_rotation import rotate_kek
from ledger.sealed import KEK_DEPENDANTS
from keys.lifecycle import create_key, revoke_key, rotate_key
from keys.material import OpenedKeys, detection_keys
from keys.models import KeyRow
from keys.tenants import create_tenant
from watermark.spec import WatermarkSpec

ACTOR = "test"


@pytest.fixture
def populated(store):
    """acme: three keys (two verify-only, one active, one of them deterministic); beta: one."""
    with store.transaction() as session:
        for name in ("acme", "beta"):
            create_tenant(session, name=name, actor=ACTOR)
            create_key(session, store.keyring, tenant=name, actor=ACTOR)
        create_key(session, store.keyring, tenant="acme", actor=ACTOR, spec=WatermarkSpec())
        rotate_key(session, store.keyring, tenant="acme", actor=ACTOR)
    return store


def _load(store, opener: OpenedKeys, keyring=None):
    with store.transaction(write=False) as session:
        return opener.load(session, keyring or store.keyring)


def _fresh(store, tenant=None, keyring=None):
    with store.transaction(write=False) as session:
        return detection_keys(session, keyring or store.keyring, tenant=tenant)


@pytest.mark.parametrize("tenant", [None, "acme"])
def test_an_unchanged_store_gives_back_the_same_keys(populated, tenant):
    opener = OpenedKeys(tenant)
    first = _load(populated, opener)
    again = _load(populated, opener)
    assert again == first == _fresh(populated, tenant)
    assert all(a is b for a, b in zip(again, first))
    assert len(first) == (4 if tenant is None else 3)


def test_a_revoked_key_and_a_new_key_are_seen_and_only_they_reopened(populated):
    opener = OpenedKeys("acme")
    before = {k.key_id: k for k in _load(populated, opener)}
    victim = next(iter(before))
    with populated.transaction() as session:  # as another gateway or the CLI would
        revoke_key(session, key_id=victim, reason="leaked", actor=ACTOR)
        rotate_key(session, populated.keyring, tenant="acme", actor=ACTOR)
    after = _load(populated, opener)
    assert after == _fresh(populated, "acme")
    assert len(after) == len(before) + 1
    by_id = {k.key_id: k for k in after}
    assert by_id[victim].state == "revoked" and by_id[victim].revoked_at is not None
    assert before[victim].state != "revoked"  # the earlier load's object is left as it was
    # The active key became verify-only (a changed row); the untouched keys are the same objects.
    changed = {victim} | {k for k, v in before.items() if v.state == "active"} | (set(by_id) - set(before))
    for key_id, key in by_id.items():
        assert (key is before.get(key_id)) == (key_id not in changed)


def test_a_kek_rotation_reopens_every_key_under_the_new_kek(populated):
    opener = OpenedKeys()
    before = _load(populated, opener)
    new = Keyring([Kek.generate()])
    with populated.transaction() as session:
        rotate_kek(session, current=populated.keyring, new=new.primary, actor=ACTOR, dependants=KEK_DEPENDANTS)
    with pytest.raises(KekError):  # the rows changed: the old ring no longer opens them
        _load(populated, opener)
    after = _load(populated, opener, new)
    assert after == before == _fresh(populated, keyring=new)
    assert not any(a is b for a, b in zip(after, before))


def test_another_keyring_reuses_nothing(populated):
    opener = OpenedKeys()
    before = _load(populated, opener)
    other = Keyring([Kek.generate()])  # lacks the store's KEK: every row must fail, none reused
    with pytest.raises(KekError):
        _load(populated, opener, other)
    assert _load(populated, opener) == before


def test_a_tampered_row_fails_and_leaves_the_previous_keys(populated):
    opener = OpenedKeys("acme")
    before = _load(populated, opener)
    victim = before[0]
    with populated.transaction(write=False) as session:
        original = session.get(KeyRow, victim.key_id).wrapped_secret
    flipped = bytes([original[0] ^ 1]) + original[1:]
    with populated.transaction() as session:
        session.execute(update(KeyRow).where(KeyRow.id == victim.key_id).values(wrapped_secret=flipped))
    with pytest.raises(UnwrapError):
        _load(populated, opener)
    with populated.transaction() as session:
        session.execute(update(KeyRow).where(KeyRow.id == victim.key_id).values(wrapped_secret=original))
    again = _load(populated, opener)
    assert again == before and all(a is b for a, b in zip(again, before))


def test_an_unknown_tenant_is_refused(populated):
    with pytest.raises(UnknownTenant):
        _load(populated, OpenedKeys("nobody"))
