"""Two gateways starting at the same moment on one PostgreSQL store both make sure the log key
and a signing key exist (service.app's start): the one that loses either race uses the
winner's key instead of failing its start (CI once saw a replica exit 3 with "a signing key
is already active"). Each race is replayed deterministically: the other replica's step runs
and commits exactly between this one's unlocked check and its locked one."""

from __future__ import annotations

import pytest

from sqlalchemy import create_engine, select

from keys.models import LedgerEntry, LogKey, LogLeaf
from keys.tenants import create_tenant
from ledger import signing
from ledger.entries import record_generation
from ledger.log import tlog
from ledger.log.key import forget_log_key
from ledger.log.tlog import ensure_log
from ledger.signing import ensure_signing_key, list_signing_keys

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_store(postgres_url, kek):
    from keys.db import open_store
    from keys.settings import StoreSettings
    from pydantic import SecretStr

    store = open_store(StoreSettings(database_url=postgres_url, kek=SecretStr(kek.to_base64())), require_kek=True)
    with store.transaction() as session:
        ensure_log(session, store.keyring, actor="test")
    try:
        yield store
    finally:
        store.close()


def test_the_replica_that_loses_the_first_key_race_uses_the_winners_key(pg_store, monkeypatch):
    may_write = signing._may_write
    raced = []

    def other_replica_commits_first(session):
        # Between this replica's unlocked "no active key" and create_signing_key's locked
        # check, the other replica creates the key and commits.
        if not raced:
            raced.append(True)
            with pg_store.transaction() as other:
                ensure_signing_key(other, pg_store.keyring, actor="service:start")
        return may_write(session)

    monkeypatch.setattr(signing, "_may_write", other_replica_commits_first)
    with pg_store.transaction() as session:
        ensure_signing_key(session, pg_store.keyring, actor="service:start")
    assert raced
    with pg_store.transaction(write=False) as session:
        keys = list_signing_keys(session)
    assert [k.state for k in keys] == ["active"]  # one key, the winner's, and it is in the log


def test_a_store_whose_key_is_refused_for_another_reason_still_fails(pg_store, monkeypatch):
    def refuse(session, keyring, *, actor, now=None):
        raise signing.InvalidTransition("refused")

    monkeypatch.setattr(signing, "create_signing_key", refuse)
    with pytest.raises(signing.InvalidTransition, match="refused"), pg_store.transaction() as session:
        ensure_signing_key(session, pg_store.keyring, actor="service:start")


def test_the_replica_that_loses_the_log_key_race_on_an_old_store_uses_the_winners_key(postgres_url, kek, monkeypatch):
    """A store from before the log (entries, no log key): the winner creates the key and adopts
    the entries; the loser, which saw no key before it waited for the head's lock, finds the
    log grown, and must not take that for a deleted key."""
    from keys.db import open_store
    from keys.settings import StoreSettings
    from pydantic import SecretStr

    store = open_store(StoreSettings(database_url=postgres_url, kek=SecretStr(kek.to_base64())), require_kek=True)
    try:
        with store.transaction() as session:
            tenant = create_tenant(session, name="acme", actor="test")
            record_generation(session, tenant_id=tenant.id, key_id=None, key_version=None, engine="local",
                              model="tiny", spec=None, prompt_tokens=1, watermarked_tokens=0,
                              unwatermarked_reason="opt_out", output_text="before the log", token_ids=[1, 2, 3],
                              kgram_set=None)
        engine = create_engine(postgres_url)
        with engine.begin() as connection:  # how migration 0008 leaves an old store: no log at all
            connection.exec_driver_sql("SET LOCAL session_replication_role = replica")
            for table in ("log_leaves", "log_nodes", "log_checkpoints", "log_keys"):
                connection.exec_driver_sql(f"DELETE FROM {table}")
            connection.exec_driver_sql("UPDATE log_head SET size = 0, border = '', mac = NULL")
        engine.dispose()
        forget_log_key(store)
        read_head = tlog.read_head
        raced = []

        def other_replica_commits_first(session, auth, *, lock=False):
            if lock and not raced:
                raced.append(True)
                with store.transaction() as other:
                    assert ensure_log(other, store.keyring, actor="service:start")[1] == 1
            return read_head(session, auth, lock=lock)

        monkeypatch.setattr(tlog, "read_head", other_replica_commits_first)
        with store.transaction() as session:
            _, adopted = ensure_log(session, store.keyring, actor="service:start")
        assert raced and adopted == 0
        with store.transaction(write=False) as session:
            assert len(session.scalars(select(LogKey)).all()) == 1
            assert [r.entry_id for r in session.scalars(select(LogLeaf).order_by(LogLeaf.idx))] == \
                list(session.scalars(select(LedgerEntry.id)))
    finally:
        store.close()
