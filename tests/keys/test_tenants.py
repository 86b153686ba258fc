"""Tenants: create, list, duplicates, names; each creation audited."""

from __future__ import annotations

import pytest

from keys.audit import list_audit
from keys.errors import DuplicateTenant, InvalidInput, UnknownTenant
from keys.tenants import create_tenant, get_tenant, list_tenants


def test_create_and_list(store):
    with store.transaction() as session:
        acme = create_tenant(session, name="acme", actor="test:alice")
        create_tenant(session, name="Beta.Corp-2", actor="test:alice")
    assert acme.id.startswith("ten_") and acme.created_at.tzinfo is not None
    with store.transaction(write=False) as session:
        assert [t.name for t in list_tenants(session)] == ["Beta.Corp-2", "acme"]
        events = list_audit(session, tenant="acme")
    assert [(e.action, e.actor, e.details) for e in events] == [
        ("tenant.created", "test:alice", {"name": "acme"})]


def test_duplicate_tenant_is_refused_and_changes_nothing(store):
    with store.transaction() as session:
        create_tenant(session, name="acme", actor="test")
    with pytest.raises(DuplicateTenant) as caught:
        with store.transaction() as session:
            create_tenant(session, name="other", actor="test")
            create_tenant(session, name="acme", actor="test")
    assert "already exists" in caught.value.user_message
    with store.transaction(write=False) as session:
        assert [t.name for t in list_tenants(session)] == ["acme"]  # 'other' rolled back too
        assert len(list_audit(session)) == 1


@pytest.mark.parametrize("name", ["", "-lead", "has space", "a" * 65, "semi;colon", "ünïcode"])
def test_invalid_names_are_refused(store, name):
    with pytest.raises(InvalidInput, match="invalid tenant name"):
        with store.transaction() as session:
            create_tenant(session, name=name, actor="test")


def test_unknown_tenant(store):
    with pytest.raises(UnknownTenant) as caught:
        with store.transaction(write=False) as session:
            get_tenant(session, name="nobody")
    assert "unknown tenant 'nobody'" in caught.value.user_message
