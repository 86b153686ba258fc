"""The ledger's hash chain: lifecycle entries, `ledger verify` against raw-SQL tampering on
both databases, the append-only triggers, recovery of interrupted streams, key states."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta

import pytest
from sqlalchemy import create_engine, text

from keys import clock
from keys.errors import InvalidInput, KeyRevoked, LedgerImmutable
from keys.lifecycle import revoke_key
from keys.models import LedgerEntry
from ledger.chain import GENESIS_HASH, entry_fields, entry_hash, hash_token_ids
from ledger.entries import (checkpoint_generation, finish_generation, generation_entries, get_generation,
                            hash_output, list_generations, record_generation, recover_interrupted,
                            start_generation, verify_chain, writer_gone, writer_id)
from tests.keys.conftest import assert_refused

ACTOR = "test"


@pytest.fixture
def tenants(two_tenants):
    made = two_tenants()
    return made.acme, made.beta, made.acme_key


def _one(session, tenant_id, key=None, text_="output", **overrides):
    values = dict(tenant_id=tenant_id, key_id=key.key_id if key else None, key_version=key.version if key else None,
                  engine="local", model="tiny", spec=key.spec if key else None, prompt_tokens=3,
                  watermarked_tokens=2 if key else 0, unwatermarked_reason=None if key else "opt_out",
                  output_text=text_, token_ids=[5, 6, 7])
    values.update(overrides)
    return record_generation(session, **values)


def _populate(store, tenants) -> list[str]:
    acme, beta, key = tenants
    ids = []
    with store.transaction() as session:
        for i in range(4):
            ids.append(_one(session, acme.id, key, text_=f"acme {i}").id)
        ids.append(_one(session, beta.id, None, text_="beta 0").id)
    return ids


@contextmanager
def _raw(url):
    """A raw connection of the tables' owner with the append-only triggers out of the way,
    as an attacker holding the owner's credentials would."""
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            if engine.dialect.name == "postgresql":
                connection.exec_driver_sql("SET LOCAL session_replication_role = replica")
            else:
                connection.exec_driver_sql("DROP TRIGGER ledger_entries_no_update")
                connection.exec_driver_sql("DROP TRIGGER ledger_entries_no_delete")
            yield connection
            if engine.dialect.name == "sqlite":
                for verb in ("UPDATE", "DELETE"):
                    connection.exec_driver_sql(
                        f"CREATE TRIGGER ledger_entries_no_{verb.lower()} BEFORE {verb} ON ledger_entries "
                        "BEGIN SELECT RAISE(ABORT, 'ledger_entries is append-only'); END")
    finally:
        engine.dispose()


def _verify(store, tenant_id=None):
    with store.transaction(write=False) as session:
        return verify_chain(session, tenant_id=tenant_id)


def test_entries_chain_per_tenant_and_verify(store, tenants):
    acme, beta, _ = tenants
    _populate(store, tenants)
    with store.session_factory() if hasattr(store, "session_factory") else store.sessions() as session:
        rows = session.query(LedgerEntry).filter_by(tenant_id=acme.id).order_by(LedgerEntry.seq).all()
        assert [r.seq for r in rows] == [1, 2, 3, 4]
        assert rows[0].prev_hash == GENESIS_HASH
        for previous, row in zip(rows, rows[1:]):
            assert row.prev_hash == previous.entry_hash
        for row in rows:
            assert entry_hash(entry_fields(row)) == row.entry_hash
    report = _verify(store)
    assert report.ok
    assert {(h.tenant, h.entries) for h in report.heads} == {("acme", 4), ("beta", 1)}


@pytest.mark.parametrize("tamper, expected", [
    ("UPDATE ledger_entries SET output_sha256 = '{fake}' WHERE tenant_id = '{t}' AND seq = 2",
     "seq 2.*modified"),
    ("UPDATE ledger_entries SET entry_hash = '{fake}' WHERE tenant_id = '{t}' AND seq = 3", "seq 3.*modified"),
    ("UPDATE ledger_entries SET watermarked_tokens = 3 WHERE tenant_id = '{t}' AND seq = 1", "seq 1.*modified"),
    ("DELETE FROM ledger_entries WHERE tenant_id = '{t}' AND seq = 2", "seq 2 is missing"),
    ("DELETE FROM ledger_entries WHERE tenant_id = '{t}' AND seq IN (2, 3)", r"seq 2\.\.3 are missing"),
    # Swap two entries' places in the chain.
    ("UPDATE ledger_entries SET seq = CASE seq WHEN 2 THEN 3 ELSE 2 END WHERE tenant_id = '{t}' AND seq IN (2, 3)",
     "seq 2.*(does not follow|modified)"),
])
def test_verify_names_the_first_tampered_entry(store, tenants, database_url, tamper, expected):
    acme, _, _ = tenants
    _populate(store, tenants)
    if "seq = CASE" in tamper:
        # Unique (tenant_id, seq) forbids an in-place swap; move through a free number.
        tamper = ("UPDATE ledger_entries SET seq = 1000 WHERE tenant_id = '{t}' AND seq = 2; "
                  "UPDATE ledger_entries SET seq = 2 WHERE tenant_id = '{t}' AND seq = 3; "
                  "UPDATE ledger_entries SET seq = 3 WHERE tenant_id = '{t}' AND seq = 1000")
    with _raw(database_url) as connection:
        for statement in tamper.format(fake="f" * 64, t=acme.id).split("; "):
            connection.exec_driver_sql(statement)
    report = _verify(store)
    assert not report.ok
    (problem,) = report.problems
    assert problem.tenant == "acme"
    import re

    assert re.search(expected, str(problem)), str(problem)
    # The other tenant's chain is intact and reported as such.
    assert _verify(store, tenants[1].id).ok


def test_verify_detects_an_inserted_forged_entry(store, tenants, database_url):
    acme, _, key = tenants
    _populate(store, tenants)
    with store.sessions() as session:
        second = session.query(LedgerEntry).filter_by(tenant_id=acme.id, seq=2).one()
        forged = {c: getattr(second, c) for c in ("tenant_id", "generation_id", "kind", "writer", "key_id",
                                                  "key_version", "key_state", "engine", "model", "prompt_tokens",
                                                  "output_tokens", "watermarked_tokens", "unwatermarked_reason",
                                                  "output_sha256", "token_ids_sha256", "finish_reason")}
    # Shift entries 2.. up by one and insert a self-consistent forged entry as seq 2.
    with _raw(database_url) as connection:
        connection.exec_driver_sql(f"UPDATE ledger_entries SET seq = seq + 100 WHERE tenant_id = '{acme.id}' AND seq >= 2")
        connection.exec_driver_sql(f"UPDATE ledger_entries SET seq = seq - 99 WHERE tenant_id = '{acme.id}' AND seq >= 100")
    engine = create_engine(database_url)
    row = LedgerEntry(**{**forged, "generation_id": "f" * 32, "kind": "finished"}, seq=2, spec=None,
                      details=None, created_at=clock.utcnow(), prev_hash=second.prev_hash)
    row.entry_hash = entry_hash(entry_fields(row))
    with engine.begin() as connection:
        connection.execute(LedgerEntry.__table__.insert().values(
            **{c.name: getattr(row, c.name) for c in LedgerEntry.__table__.columns if c.name != "id"}))
    engine.dispose()
    report = _verify(store)
    (problem,) = report.problems
    # The forged entry is self-consistent; the first genuine entry after it no longer fits.
    assert problem.seq == 3 and problem.generation_id != "f" * 32
    assert "modified" in str(problem) or "does not follow" in str(problem)


def test_the_database_refuses_update_delete_and_truncate(store, tenants, database_url):
    _populate(store, tenants)
    statements = ["UPDATE ledger_entries SET output_tokens = 0", "DELETE FROM ledger_entries"]
    if database_url.startswith("postgresql"):
        statements.append("TRUNCATE ledger_entries")
    assert_refused(database_url, statements, "append-only")
    with pytest.raises(LedgerImmutable):
        with store.transaction() as session:
            row = session.query(LedgerEntry).first()
            row.output_tokens = 0
    with pytest.raises(LedgerImmutable):
        with store.transaction() as session:
            session.query(LedgerEntry).delete()
    assert _verify(store).ok


def test_cli_ledger_verify_exits_non_zero_naming_the_entry(cli, database_url):
    cli.ok("tenants", "create", "acme")
    cli.ok("keys", "create", "--tenant", "acme")
    from keys.db import open_store
    from keys.settings import StoreSettings

    store = open_store(StoreSettings(database_url=database_url))
    try:
        with store.transaction() as session:
            tenant_id = session.execute(text("SELECT id FROM tenants")).scalar_one()
            for i in range(3):
                _one(session, tenant_id, None, text_=f"x{i}")
    finally:
        store.close()
    ok = cli.ok("ledger", "verify")
    assert "ok: 1 chain(s) intact" in ok.stdout and "3 entries" in ok.stdout
    assert cli.ok("ledger", "verify", "--tenant", "acme", "--json").json()["ok"] is True
    with _raw(database_url) as connection:
        connection.exec_driver_sql("UPDATE ledger_entries SET output_tokens = 99 WHERE seq = 2")
    result = cli("ledger", "verify")
    assert result.exit_code == 1
    assert "tenant 'acme' entry seq 2" in result.stderr and "modified" in result.stderr
    assert cli("ledger", "verify", "--json").json()["problems"][0]["seq"] == 2


def test_stream_lifecycle_and_status(store, tenants):
    acme, beta, key = tenants
    with store.transaction() as session:
        started = start_generation(session, tenant_id=acme.id, key_id=key.key_id, key_version=key.version,
                                   engine="local", model="tiny", spec=key.spec, prompt_tokens=4,
                                   unwatermarked_reason=None)
        gid = started.id
    with store.transaction(write=False) as session:
        shown = get_generation(session, generation_id=gid, tenant_id=acme.id)
        assert shown.status == "in_progress" and shown.output_tokens == 0 and shown.output_sha256 == hash_output("")
        assert get_generation(session, generation_id=gid, tenant_id=beta.id) is None
    with store.transaction() as session:
        checkpoint_generation(session, generation_id=gid, tenant_id=acme.id, output_text="ab",
                              token_ids=[1, 2], watermarked_tokens=2)
        done = finish_generation(session, generation_id=gid, tenant_id=acme.id, finish_reason="client_disconnect",
                                 output_text="abc", token_ids=[1, 2, 3], watermarked_tokens=3)
    assert done.status == "finished" and done.finish_reason == "client_disconnect" and done.entries == 3
    assert done.token_ids_sha256 == hash_token_ids([1, 2, 3]) and done.key_state == "active"
    with store.transaction() as session:
        with pytest.raises(InvalidInput, match="already finished"):
            finish_generation(session, generation_id=gid, tenant_id=acme.id, finish_reason="stop",
                              output_text="abc", token_ids=[1, 2, 3], watermarked_tokens=3)
        with pytest.raises(InvalidInput, match="no started entry"):
            checkpoint_generation(session, generation_id=gid, tenant_id=beta.id, output_text="x",
                                  token_ids=[1], watermarked_tokens=0)
    with store.transaction(write=False) as session:
        kinds = [e.kind for e in generation_entries(session, generation_id=gid, tenant_id=None)]
        assert kinds == ["started", "checkpoint", "finished"]
        assert [g.id for g in list_generations(session, tenant_id=acme.id)] == [gid]
    assert _verify(store).ok


def test_a_dead_writers_stream_reads_interrupted_and_recovery_closes_it(store, tenants, monkeypatch):
    acme, _, key = tenants
    dead = writer_id().rsplit("/", 2)[0] + "/999999999/1"
    assert writer_gone(dead) and not writer_gone(writer_id())
    import ledger.entries as ledger

    monkeypatch.setattr(ledger, "writer_id", lambda: dead)
    with store.transaction() as session:
        gid = start_generation(session, tenant_id=acme.id, key_id=key.key_id, key_version=key.version,
                               engine="local", model="tiny", spec=key.spec, prompt_tokens=4,
                               unwatermarked_reason=None).id
        checkpoint_generation(session, generation_id=gid, tenant_id=acme.id, output_text="abcd",
                              token_ids=[1, 2, 3, 4], watermarked_tokens=4)
        live = start_generation(session, tenant_id=acme.id, key_id=None, key_version=None, engine="local",
                                model="tiny", spec=None, prompt_tokens=1, unwatermarked_reason="opt_out",
                                generation_id="a" * 32)
    monkeypatch.undo()
    with store.transaction() as session:
        # The second one is "ours" and alive: left alone.
        session.execute(text("SELECT 1"))
    with store.transaction(write=False) as session:
        assert get_generation(session, generation_id=gid, tenant_id=None).status == "interrupted"
    with store.transaction() as session:
        closed = recover_interrupted(session)
    assert gid in closed and live.id in closed  # both writers are the dead pid
    with store.transaction(write=False) as session:
        shown = get_generation(session, generation_id=gid, tenant_id=None)
    assert (shown.status, shown.finish_reason, shown.output_tokens) == ("interrupted", "interrupted", 4)
    assert shown.output_sha256 == hash_output("abcd") and shown.token_ids_sha256 == hash_token_ids([1, 2, 3, 4])
    with store.transaction() as session:
        assert recover_interrupted(session) == []
        # A live writer's stream is not touched, unless silent for longer than the limit.
        mine = start_generation(session, tenant_id=acme.id, key_id=None, key_version=None, engine="local",
                                model="tiny", spec=None, prompt_tokens=1, unwatermarked_reason="opt_out").id
    with store.transaction() as session:
        assert recover_interrupted(session) == []
        assert recover_interrupted(session, now=clock.utcnow() + timedelta(hours=1)) == [mine]
    assert _verify(store).ok


def test_a_key_revoked_meanwhile_is_never_recorded_as_active(store, tenants):
    acme, _, key = tenants
    with store.transaction() as session:
        gid = start_generation(session, tenant_id=acme.id, key_id=key.key_id, key_version=key.version,
                               engine="local", model="tiny", spec=key.spec, prompt_tokens=4,
                               unwatermarked_reason=None).id
    with store.transaction() as session:
        revoke_key(session, key_id=key.key_id, reason="leaked", actor=ACTOR)
    with store.transaction() as session:
        with pytest.raises(KeyRevoked):
            _one(session, acme.id, key, refuse_revoked_key=True)
        done = finish_generation(session, generation_id=gid, tenant_id=acme.id, finish_reason="stop",
                                 output_text="abc", token_ids=[1, 2, 3], watermarked_tokens=3)
    assert done.key_state == "revoked"
    with store.transaction(write=False) as session:
        assert [e.key_state for e in generation_entries(session, generation_id=gid, tenant_id=None)] == \
            ["active", "revoked"]


def test_migration_carries_old_records_into_the_chain(empty_database_url):
    from keys import migrate
    from keys.db import create_store_engine

    engine = create_store_engine(empty_database_url)
    try:
        migrate.upgrade(engine, "0001")
        with engine.begin() as connection:
            connection.execute(text("INSERT INTO tenants (id, name, created_at) VALUES ('t1', 'acme', :now)"),
                               {"now": clock.utcnow()})
            for i in range(3):
                connection.execute(text(
                    "INSERT INTO generation_records (id, tenant_id, key_id, key_version, engine, model, spec, "
                    "prompt_tokens, output_tokens, watermarked_tokens, unwatermarked_reason, output_sha256, "
                    "created_at) VALUES (:id, 't1', NULL, NULL, 'local', 'tiny', NULL, 1, 2, 0, 'opt_out', :h, :at)"),
                    {"id": f"{i:032x}", "h": hash_output(f"text {i}"), "at": clock.utcnow() + timedelta(seconds=i)})
        migrate.upgrade(engine)
        from sqlalchemy.orm import Session

        with Session(engine) as session:
            report = verify_chain(session)
            assert report.ok and report.heads[0].entries == 3
            old = get_generation(session, generation_id=f"{1:032x}", tenant_id="t1")
            assert (old.finish_reason, old.output_sha256, old.token_ids_sha256) == \
                ("unknown", hash_output("text 1"), None)
        migrate.downgrade(engine, "0001")
        with engine.connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM generation_records")).scalar() == 3
    finally:
        engine.dispose()
