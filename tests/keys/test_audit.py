"""The audit log: append-only in the ORM and in the database; filters; the CLI actor."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, select, text, update
from sqlalchemy.exc import DBAPIError

from keys.audit import default_actor, list_audit, record_audit
from keys.errors import AuditLogImmutable, InvalidInput, UnknownTenant
from keys.models import AuditEvent
from keys.tenants import create_tenant


@pytest.fixture
def events(store):
    with store.transaction() as session:
        acme = create_tenant(session, name="acme", actor="test:a")
        create_tenant(session, name="beta", actor="test:b")
        record_audit(session, actor="test:c", action="custom.thing", tenant_id=acme.id, key_id="key_x",
                     details={"n": 1})
    return acme


def test_list_filters_and_limit(store, events):
    with store.transaction(write=False) as session:
        everything = list_audit(session)
        assert [e.action for e in everything] == ["tenant.created", "tenant.created", "custom.thing"]
        assert [e.id for e in everything] == sorted(e.id for e in everything)
        assert [e.actor for e in list_audit(session, tenant="acme")] == ["test:a", "test:c"]
        assert [e.action for e in list_audit(session, action="custom.thing")] == ["custom.thing"]
        assert [e.key_id for e in list_audit(session, key_id="key_x")] == ["key_x"]
        assert [e.actor for e in list_audit(session, limit=2)] == ["test:b", "test:c"]
        assert everything[2].tenant == "acme" and everything[2].details == {"n": 1}
        with pytest.raises(UnknownTenant):
            list_audit(session, tenant="nobody")
        with pytest.raises(InvalidInput):
            list_audit(session, limit=0)


def test_the_orm_refuses_to_change_or_delete_events(store, events):
    with pytest.raises(AuditLogImmutable):
        with store.transaction() as session:
            session.scalars(select(AuditEvent)).first().actor = "mallory"
    with pytest.raises(AuditLogImmutable):
        with store.transaction() as session:
            session.delete(session.scalars(select(AuditEvent)).first())
    with pytest.raises(AuditLogImmutable):
        with store.transaction() as session:
            session.execute(update(AuditEvent).values(actor="mallory"))
    with pytest.raises(AuditLogImmutable):
        with store.transaction() as session:
            session.execute(delete(AuditEvent))
    with store.transaction(write=False) as session:
        assert [e.actor for e in list_audit(session)] == ["test:a", "test:b", "test:c"]


def test_the_database_refuses_plain_sql_changes(store, events):
    for statement in ("UPDATE audit_events SET actor = 'mallory'", "DELETE FROM audit_events"):
        with pytest.raises(DBAPIError, match="append-only"):
            with store.engine.begin() as connection:
                connection.execute(text(statement))
    with store.transaction(write=False) as session:
        assert len(list_audit(session)) == 3


@pytest.mark.parametrize("details", [{"secret": 1}, {"Token": "x"}, {"kek": "x"}, {"key": 5}])
def test_details_named_like_secrets_are_refused(store, details):
    with pytest.raises(InvalidInput, match="must not carry secrets"):
        with store.transaction() as session:
            record_audit(session, actor="test", action="x", details=details)


def test_details_must_be_json(store):
    with pytest.raises(InvalidInput, match="JSON"):
        with store.transaction() as session:
            record_audit(session, actor="test", action="x", details={"when": object()})


def test_default_actor(monkeypatch):
    monkeypatch.setenv("HALLMARK_ACTOR", "ci:deploy-bot")
    assert default_actor() == "ci:deploy-bot"
    monkeypatch.delenv("HALLMARK_ACTOR")
    assert default_actor().startswith("cli:") and len(default_actor()) > 4
