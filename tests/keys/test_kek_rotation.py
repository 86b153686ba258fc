"""KEK rotation re-wraps every key in one transaction; the old KEK opens nothing after."""

from __future__ import annotations

import pytest
from sqlalchemy import select, update

from keys.audit import list_audit
from keys.errors import KekError, UnwrapError
from keys.kek import Kek, Keyring
from keys.kek_rotation import rotate_kek
from ledger.sealed import KEK_DEPENDANTS
from keys.lifecycle import create_key, rotate_key
from keys.material import detection_keys
from keys.models import KeyRow
from keys.tenants import create_tenant
from tests.keys.conftest import snapshot

ACTOR = "test:ops"


@pytest.fixture
def populated(store):
    with store.transaction() as session:
        for name in ("acme", "beta"):
            create_tenant(session, name=name, actor=ACTOR)
            create_key(session, store.keyring, tenant=name, actor=ACTOR)
        rotate_key(session, store.keyring, tenant="acme", actor=ACTOR)
    with store.transaction(write=False) as session:
        return {k.key_id: k.material.secret for k in detection_keys(session, store.keyring)}


def _rows(store):
    with store.transaction(write=False) as session:
        return {row.id: (row.kek_id, row.nonce, row.wrapped_secret) for row in session.scalars(select(KeyRow))}


def test_rotation_rewraps_everything_and_retires_the_old_kek(store, populated):
    old = store.keyring
    new = Kek.generate()
    before = _rows(store)
    with store.transaction() as session:
        result = rotate_kek(session, current=old, new=new, actor=ACTOR, dependants=KEK_DEPENDANTS)
    assert result.rewrapped == 3 and result.previous_kek_ids == (old.primary.id,)
    after = _rows(store)
    assert set(after) == set(before)
    for key_id, (kek_id, nonce, ciphertext) in after.items():
        assert kek_id == new.id
        assert nonce != before[key_id][1] and ciphertext != before[key_id][2]
    with store.transaction(write=False) as session:
        opened = {k.key_id: k.material.secret for k in detection_keys(session, Keyring([new]))}
        assert opened == populated
        with pytest.raises(KekError, match="KEK"):
            detection_keys(session, old)
        (event,) = list_audit(session, action="kek.rotated")
    assert event.actor == ACTOR and event.tenant_id is None
    assert event.details == {"previous_kek_ids": [old.primary.id], "new_kek_id": new.id, "rewrapped_keys": 3,
                             "rewrapped_signing_keys": 0, "rewrapped_log_keys": 0}
    # Even told which row to use, the old KEK does not authenticate the new ciphertexts.
    forged_ring = Keyring([Kek(old.primary.material)])
    with store.transaction() as session:
        session.execute(update(KeyRow).values(kek_id=old.primary.id))
    with store.transaction(write=False) as session:
        with pytest.raises(UnwrapError):
            detection_keys(session, forged_ring)


def test_rotation_with_the_wrong_current_kek_changes_nothing(store, populated, database_url):
    before = snapshot(database_url)
    with pytest.raises(KekError, match="KEK"):
        with store.transaction() as session:
            rotate_kek(session, current=Keyring([Kek.generate()]), new=Kek.generate(), actor=ACTOR,
                       dependants=KEK_DEPENDANTS)
    assert snapshot(database_url) == before


def test_rotating_to_the_kek_in_use_is_refused(store, populated, database_url):
    before = snapshot(database_url)
    with pytest.raises(KekError, match="already in use"):
        with store.transaction() as session:
            rotate_kek(session, current=store.keyring, new=store.keyring.primary, actor=ACTOR,
                       dependants=KEK_DEPENDANTS)
    assert snapshot(database_url) == before


def test_a_row_that_fails_to_open_aborts_the_whole_rotation(store, populated, database_url):
    victim = sorted(populated)[-1]
    with store.transaction() as session:
        session.execute(update(KeyRow).where(KeyRow.id == victim).values(version=99))
    before = snapshot(database_url)
    with pytest.raises(UnwrapError):
        with store.transaction() as session:
            rotate_kek(session, current=store.keyring, new=Kek.generate(), actor=ACTOR, dependants=KEK_DEPENDANTS)
    assert snapshot(database_url) == before


def test_after_rotation_new_keys_need_the_new_kek(store, populated):
    new = Kek.generate()
    with store.transaction() as session:
        rotate_kek(session, current=store.keyring, new=new, actor=ACTOR, dependants=KEK_DEPENDANTS)
    with pytest.raises(KekError, match="not the KEK this store's keys are wrapped with"):
        with store.transaction() as session:
            create_key(session, store.keyring, tenant="beta", actor=ACTOR)
    with store.transaction() as session:
        assert create_key(session, Keyring([new]), tenant="beta", actor=ACTOR).kek_id == new.id


def test_an_empty_store_rotates_trivially(store):
    with store.transaction() as session:
        result = rotate_kek(session, current=store.keyring, new=Kek.generate(), actor=ACTOR,
                            dependants=KEK_DEPENDANTS)
    assert result.rewrapped == 0 and result.previous_kek_ids == ()
