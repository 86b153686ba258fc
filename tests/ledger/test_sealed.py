"""What the ledger keeps sealed under the KEK (ledger.sealed) is what a rotation given it
re-wraps: every table with a ``kek_id`` column ends under the new KEK, and `kek status`
counts each one. The key store re-wraps them without importing the ledger, so a sealed
table the ledger adds without a dependant would stay under the old KEK; this test names it.
Both databases."""

from __future__ import annotations

from sqlalchemy import select

from keys.kek import Kek, Keyring
from keys.kek_rotation import kek_status, rotate_kek
from keys.models import Base
from ledger.log.key import load_log_key
from ledger.log.tlog import ensure_log
from ledger.sealed import KEK_DEPENDANTS
from ledger.signing import active_signer, create_signing_key

ACTOR = "test:ops"
# The tables the key store re-wraps itself (watermark keys) or that name the KEK in use.
KEY_STORE_OWN = {"watermark_keys", "store_kek"}


def _kek_ids(session) -> dict[str, set[str | None]]:
    """Per table with a ``kek_id`` column, the KEK ids its rows name."""
    return {table.name: set(session.scalars(select(table.c.kek_id)))
            for table in Base.metadata.sorted_tables if "kek_id" in table.c}


def test_a_rotation_given_the_ledgers_dependants_leaves_nothing_under_the_old_kek(store, two_tenants):
    two_tenants(beta_key=True)
    with store.transaction() as session:
        ensure_log(session, store.keyring, actor=ACTOR)
        create_signing_key(session, store.keyring, actor=ACTOR)
    old, new = store.keyring.primary, Kek.generate()
    with store.transaction(write=False) as session:
        before = _kek_ids(session)
    sealed = set(before) - KEY_STORE_OWN
    # Every sealed table has a row here (a new one must be populated above to be tested).
    assert sealed == {"signing_keys", "log_keys"}, f"a new table sealed under the KEK: {sealed}"
    assert all(ids == {old.id} for name, ids in before.items() if name != "store_kek"), before

    with store.transaction() as session:
        rotation = rotate_kek(session, current=store.keyring, new=new, actor=ACTOR, dependants=KEK_DEPENDANTS)
    assert rotation.rewrapped == 2 + 1 + 1  # two watermark keys, the signing key, the log key
    with store.transaction(write=False) as session:
        assert _kek_ids(session) == {name: {new.id} for name in before}
        status = kek_status(session, Keyring([new]), KEK_DEPENDANTS).to_dict()
        assert {d.name for d in KEK_DEPENDANTS} <= set(status)
        assert status["signing_keys"] == {new.id: 1} and status["log_key"] == {new.id: 1}
        assert status["watermark_keys"] == {new.id: 2} and status["unopenable"] == []
        # Each re-wrapped secret opens under the new KEK alone.
        assert active_signer(session, Keyring([new])) is not None
        assert load_log_key(session, Keyring([new])) is not None
