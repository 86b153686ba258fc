"""The gate's grouped writes (service.access.group_commit) on a real store: writes waiting
together share one commit, a refused write takes nothing with it, a failed commit fails
every write of its group and none takes effect."""

from __future__ import annotations

import asyncio
import threading

import pytest
from pydantic import SecretStr
from sqlalchemy import event, func, select

from keys import migrate
from keys.audit import record_audit
from keys.db import create_store_engine, open_store
from keys.errors import KeyStoreError
from keys.kek import Kek
from keys.models import AuditEvent
from keys.settings import StoreSettings
from service.access.group_commit import GroupCommit
from service.errors import RateLimited


@pytest.fixture
def store(tmp_path):
    url = f"sqlite:///{tmp_path / 'hallmark.db'}"
    engine = create_store_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    opened = open_store(StoreSettings(database_url=url, kek=SecretStr(Kek.generate().to_base64())), require_kek=True)
    yield opened
    opened.close()


def _audited(store) -> list[str]:
    with store.transaction(write=False) as session:
        return list(session.scalars(select(AuditEvent.actor).order_by(AuditEvent.id)))


def _audit(actor: str):
    def write(session):
        record_audit(session, actor=actor, action="detection.expert", details={"tokens": 1})
        return actor
    return write


def test_writes_waiting_together_share_one_commit_and_each_gets_its_result(store):
    commits = []
    event.listen(store.engine, "commit", lambda connection: commits.append(1))
    writes = GroupCommit(store)
    gate = threading.Event()

    def blocker(session):  # holds the thread so that the next writes queue up behind it
        gate.wait(10)
        return "first"

    first = writes.submit(blocker)
    queued = [writes.submit(_audit(f"api:{i}")) for i in range(20)]
    gate.set()
    assert first.result(10) == "first"
    assert [f.result(10) for f in queued] == [f"api:{i}" for i in range(20)]
    assert _audited(store) == [f"api:{i}" for i in range(20)]  # in the order submitted
    assert len(commits) <= 2  # the blocker's group, then the twenty queued behind it


def test_a_request_cancelled_while_its_write_waits_holds_up_no_other_write(store):
    """A request cancelled while its write waits in the queue (its awaiting task cancelled:
    a client gone, a shutdown) cancels the write's future. The write still runs and commits
    (a charge after the work must not be escaped by hanging up), and every other write of its
    group still gets its result: before, setting the cancelled future's result raised in the
    group's thread and left the writes after it waiting forever."""
    writes = GroupCommit(store)
    gate = threading.Event()
    writes.submit(lambda session: gate.wait(10))
    gone = writes.submit(_audit("api:gone"))
    after = [writes.submit(_audit(f"api:{i}")) for i in range(3)]
    assert gone.cancel()
    gate.set()
    assert [f.result(10) for f in after] == ["api:0", "api:1", "api:2"]
    assert _audited(store) == ["api:gone", "api:0", "api:1", "api:2"]
    assert writes.submit(_audit("api:later")).result(10) == "api:later"


def test_a_fault_of_the_writes_thread_fails_its_group_and_the_thread_carries_on(store, monkeypatch):
    writes = GroupCommit(store)
    commit = writes._commit
    faults = iter([RuntimeError("unexpected")])

    def faulty(group, attempt=0):
        fault = next(faults, None)
        if fault is not None:
            raise fault
        return commit(group, attempt)

    monkeypatch.setattr(writes, "_commit", faulty)
    with pytest.raises(RuntimeError, match="unexpected"):
        writes.submit(_audit("api:lost")).result(10)
    assert writes.submit(_audit("api:next")).result(10) == "api:next"


def test_a_refused_write_rolls_back_alone(store):
    writes = GroupCommit(store)
    gate = threading.Event()
    writes.submit(lambda session: gate.wait(10))

    def refused(session):
        record_audit(session, actor="api:refused", action="detection.expert", details={})
        session.flush()
        raise RateLimited("no", code="probe_guard")

    futures = [writes.submit(_audit("api:a")), writes.submit(refused), writes.submit(_audit("api:b"))]
    gate.set()
    assert futures[0].result(10) == "api:a" and futures[2].result(10) == "api:b"
    with pytest.raises(RateLimited):
        futures[1].result(10)
    assert _audited(store) == ["api:a", "api:b"]


def test_a_failed_commit_fails_every_write_of_its_group_and_none_takes_effect(store):
    writes = GroupCommit(store)
    gate = threading.Event()
    writes.submit(lambda session: gate.wait(10))
    failing = {"on": False}

    def fail_commit(connection):
        if failing["on"]:
            raise RuntimeError("disk gone")

    event.listen(store.engine, "commit", fail_commit)
    futures = [writes.submit(_audit(f"api:{i}")) for i in range(3)]
    failing["on"] = True
    gate.set()
    for future in futures:
        with pytest.raises((KeyStoreError, RuntimeError)):
            future.result(10)
    failing["on"] = False
    assert writes.submit(_audit("api:after")).result(10) == "api:after"  # the thread carries on
    with store.transaction(write=False) as session:
        assert session.scalar(select(func.count()).select_from(AuditEvent)) == 1


@pytest.mark.postgres
def test_two_replicas_groups_that_deadlock_lose_no_write():
    """Two gateways' groups lock the same two rows in opposite orders (a budget each write
    locks, held to the group's commit): PostgreSQL aborts one statement as a deadlock. The
    write it aborted is run again in its own transaction, so every request's write commits
    and none gets an error that another request caused."""
    from sqlalchemy import text

    from tests.keys.conftest import reachable_pg_server

    pg = reachable_pg_server()
    postgres_url = pg.url_for(pg.create_database())
    engine = create_store_engine(postgres_url)
    migrate.upgrade(engine)
    engine.dispose()
    store = open_store(StoreSettings(database_url=postgres_url, kek=SecretStr(Kek.generate().to_base64())),
                       require_kek=True)
    try:
        with store.transaction() as session:
            session.execute(text("INSERT INTO rate_limit_buckets (name, level, updated) VALUES ('x', 0, 0), ('y', 0, 0)"))
        both_hold_one = threading.Barrier(2)

        def lock(name: str, then_wait: bool):
            def write(session):
                session.execute(text("UPDATE rate_limit_buckets SET level = level + 1 WHERE name = :n"), {"n": name})
                if then_wait:
                    both_hold_one.wait(10)
                return name
            return write

        replicas, futures = [GroupCommit(store), GroupCommit(store)], []
        gates = [threading.Event(), threading.Event()]
        for replica, gate, (first, second) in zip(replicas, gates, [("x", "y"), ("y", "x")]):
            replica.submit(lambda session, gate=gate: gate.wait(10))  # holds the thread: the next two form one group
            futures += [replica.submit(lock(first, True)), replica.submit(lock(second, False))]
        for gate in gates:
            gate.set()
        assert [f.result(30) for f in futures] == ["x", "y", "y", "x"]
        with store.transaction(write=False) as session:
            levels = dict(session.execute(text("SELECT name, level FROM rate_limit_buckets")).all())
        assert levels == {"x": 2, "y": 2}
    finally:
        store.close()
        pg.close()


def _event(actor: str) -> dict:
    return {"actor": actor, "action": "detection.expert", "tenant_id": None,
            "details": {"token_id": actor, "tier": "expert", "tokens": 200, "evidence": False, "verdict": "watermarked"}}


def test_held_audit_events_wait_for_requests_in_flight_then_commit_as_one(store):
    """group_commit.Held (an expert's audit event, service.access.gate): a request alone
    commits at once; one answered while another is in flight waits for it, and both rows
    commit in one transaction, each request getting its own outcome; the rows are those
    keys.audit.record_audit writes."""
    from service.access import gate
    from service.access.group_commit import Held

    commits = []
    event.listen(store.engine, "commit", lambda connection: commits.append(1))

    async def scenario():
        held = Held(GroupCommit(store), gate._audit_many, linger=60.0)
        held.enter()
        alone = held.add(_event("api:alone"))
        held.leave()  # nobody else in flight: no wait
        assert await asyncio.wait_for(alone, 10) is None
        assert len(commits) == 1
        held.enter()
        held.enter()  # a second request in flight
        first = held.add(_event("api:first"))
        held.leave()
        await asyncio.sleep(0.05)
        assert not first.done() and len(commits) == 1  # held while the second runs
        second = held.add(_event("api:second"))
        held.leave()
        assert await asyncio.wait_for(asyncio.gather(first, second), 10) == [None, None]
        assert len(commits) == 2 and (held.flushes, held.items) == (2, 3)

    asyncio.run(scenario())
    assert _audited(store) == ["api:alone", "api:first", "api:second"]
    with store.transaction() as session:
        record_audit(session, **_event("api:orm"))
    with store.transaction(write=False) as session:
        rows = list(session.scalars(select(AuditEvent).order_by(AuditEvent.id)))
    def columns(e):
        assert e.details["token_id"] == e.actor
        return e.action, e.tenant_id, e.key_id, {**e.details, "token_id": None}, type(e.occurred_at)

    assert [columns(e) for e in rows[:-1]] == [columns(rows[-1])] * 3


def test_held_events_go_after_linger_while_others_stay_in_flight_and_a_failure_reaches_each(store):
    from service.access import gate, group_commit
    from service.access.group_commit import Held

    async def scenario(monkeypatch_in_flight):
        held = Held(GroupCommit(store), gate._audit_many, linger=0.05)
        group_commit.in_flight = monkeypatch_in_flight  # the server counts a request not yet started
        try:
            held.enter()
            waiting = held.add(_event("api:lingered"))
            held.leave()
            assert not waiting.done()
            assert await asyncio.wait_for(waiting, 10) is None  # after linger, the other still in flight

            def refused(session, items):
                raise RateLimited("no", code="probe_guard")

            failing = Held(GroupCommit(store), refused, linger=60.0)
            group_commit.in_flight = None
            futures = [failing.add(_event("api:x")) for _ in range(2)]  # nobody counted in: each at once
            for future in futures:
                with pytest.raises(RateLimited):
                    await asyncio.wait_for(future, 10)
        finally:
            group_commit.in_flight = None

    asyncio.run(scenario(lambda: 2))
    assert _audited(store) == ["api:lingered"]
