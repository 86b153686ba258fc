"""Rows the log's writer did not write (ledger.log.faults, issue 35): a forged ledger row is
never listed, signed or cited and is reported; a foreign row beyond the head blocks appends
as LogBlocked (nothing written) until `hallmark ledger repair` removes it, losing no entry.
Both databases, as whoever can write the tables without the KEK."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import create_engine, func, select, text

from keys.models import LedgerEntry, LogLeaf
from ledger.chain import entry_fields, entry_hash
from ledger.entries import get_generation, hash_output, list_generations
from ledger.read import latest_row
from ledger.log import faults, tlog
from ledger.log.audit import audit_log
from tests.ledger.log.test_tlog import _record


def _forge(store, database_url, real, output: str, generation_id: str = "f" * 32) -> None:
    """A ``finished`` row, well chained, inserted by someone who can write the table."""
    with store.transaction(write=False) as session:
        row = session.scalar(select(LedgerEntry).where(LedgerEntry.generation_id == real.id))
        fields = {c.name: getattr(row, c.name) for c in LedgerEntry.__table__.columns if c.name != "id"}
    forged = dict(fields, generation_id=generation_id, seq=row.seq + 1, prev_hash=row.entry_hash,
                  output_sha256=hash_output(output))
    forged["entry_hash"] = entry_hash(entry_fields(type("R", (), forged)))
    engine = create_engine(database_url)
    with engine.begin() as connection:
        connection.execute(LedgerEntry.__table__.insert().values(**forged))
    engine.dispose()


def test_a_forged_row_is_never_listed_and_is_reported(store, two_tenants, database_url):
    made = two_tenants()
    real = _record(store, made.acme.id, "the real one")
    _forge(store, database_url, real, "forged text")
    heard: list[tuple[str, str]] = []
    faults.listen(store, lambda kind, subject, message: heard.append((kind, subject)))
    with store.transaction(write=False) as session:
        assert get_generation(session, generation_id="f" * 32, tenant_id=None) is None
        assert get_generation(session, generation_id="f" * 32, tenant_id=made.acme.id) is None
        assert [g.id for g in list_generations(session, tenant_id=None)] == [real.id]
        assert latest_row(session, generation_id="f" * 32, tenant_id=made.acme.id) is None
        report = audit_log(session, tlog.authority(session))
    assert heard and heard[0][0] == "unlogged_entry"
    assert any("not in the log: inserted without the log key" in p for p in report.problems)


def _block(database_url: str, at: int, entry_id: int | None = None) -> None:
    """A leaf at the next index (and naming the next entry), as the gateway's role could insert."""
    engine = create_engine(database_url)
    with engine.begin() as connection:
        connection.execute(LogLeaf.__table__.insert().values(
            idx=at, leaf_hash=b"\0" * 32, kind="entry", entry_id=entry_id, tenant_id=None,
            kgrams_sha256=None, kid=None, data=None, mac=b"\0" * 32, created_at=func.now()))
    engine.dispose()


def test_a_foreign_leaf_blocks_appends_until_repair(store, two_tenants, database_url, cli):
    made = two_tenants()
    first = _record(store, made.acme.id, "one")
    with store.transaction(write=False) as session:
        size, _ = tlog.read_head(session, tlog.authority(session))
        entries = session.scalar(select(func.count()).select_from(LedgerEntry))
    _block(database_url, size)
    with pytest.raises(faults.LogBlocked, match="hallmark ledger repair"):
        _record(store, made.acme.id, "two")
    with store.transaction(write=False) as session:  # nothing of the refused generation was written
        assert session.scalar(select(func.count()).select_from(LedgerEntry)) == entries
        assert tlog.read_head(session, tlog.authority(session))[0] == size
        assert get_generation(session, generation_id=first.id, tenant_id=None) is not None
    verify = cli("ledger", "verify")
    assert verify.exit_code == 1 and "beyond the log's head" in verify.stderr
    dry = cli("ledger", "repair", "--dry-run", "--json")
    assert dry.exit_code == 0 and json.loads(dry.stdout)["count"] == 1
    repaired = cli("ledger", "repair", "--json")
    assert repaired.exit_code == 0, repaired.stderr
    assert [leaf["idx"] for leaf in json.loads(repaired.stdout)["removed"]["leaves"]] == [size]
    second = _record(store, made.acme.id, "two")
    assert second.log.leaf_index == size
    assert cli("ledger", "verify").exit_code == 0
    with store.transaction(write=False) as session:
        actions = [a for (a,) in session.execute(text("SELECT action FROM audit_events"))]
    assert "log.repaired" in actions


def test_a_leaf_naming_the_next_entry_far_ahead_also_blocks(store, two_tenants, database_url, cli):
    made = two_tenants()
    _record(store, made.acme.id, "one")
    with store.transaction(write=False) as session:
        next_id = session.scalar(select(func.max(LedgerEntry.id))) + 1
    _block(database_url, 10**9, entry_id=next_id)
    with pytest.raises(faults.LogBlocked):
        _record(store, made.acme.id, "two")
    assert cli("ledger", "repair").exit_code == 0
    _record(store, made.acme.id, "two")


def test_a_checkpoint_inserted_ahead_of_the_log_is_found_and_repaired(store, two_tenants, database_url, cli):
    """A checkpoint row at the log's next size: the writer's publication at that size skips it as
    published already, so it stays once the log reaches it; the log key did not sign it."""
    from keys.models import LogCheckpoint

    made = two_tenants()
    _record(store, made.acme.id, "one")
    with store.transaction() as session:
        auth = tlog.authority(session)
        tlog.publish(session, auth)
        size, _ = tlog.read_head(session, auth)
        real_note = session.get(LogCheckpoint, size).note
    engine = create_engine(database_url)
    with engine.begin() as connection:
        connection.execute(LogCheckpoint.__table__.insert().values(
            size=size + 1, root=b"\0" * 32, note=real_note.replace(f"\n{size}\n", f"\n{size + 1}\n"),
            published_at=func.now()))
    engine.dispose()
    _record(store, made.acme.id, "two")
    with store.transaction() as session:
        assert tlog.publish(session, tlog.authority(session)) is None  # "published already"
        found = faults.foreign_rows(session, size + 1, tlog.authority(session).verifier)
    assert found.checkpoints == [size + 1]
    assert cli("ledger", "verify").exit_code == 1
    repaired = cli("ledger", "repair", "--json")
    assert json.loads(repaired.stdout)["removed"]["checkpoints"] == [size + 1]
    with store.transaction() as session:
        stored = tlog.publish(session, tlog.authority(session))
        assert stored is not None and stored.size == size + 1
    assert cli("ledger", "verify").exit_code == 0
