"""Tenants: create, list, duplicates, names; each creation audited."""

from __future__ import annotations

import pytest

from keys.audit import list_audit
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from keys.errors import DuplicateTenant, InvalidInput, UnknownTenant
from keys.tenants import create_tenant, get_tenant, list_tenants


def test_create_and_list(store):
    with store.transaction() as session:
        acme = create_tenant(session, name="acme", actor="test:alice")
        create_tenant(session, name="Beta.Corp-2", actor="test:alice")
    assert acme.id.startswith("ten_") and acme.created_at.tzinfo is not None
    with store.transaction(write=False) as session:
        assert [t.name for t in list_tenants(session)] == ["acme", "Beta.Corp-2"]  # case-blind order
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


@pytest.mark.parametrize("first,second", [("acme", "Acme"), ("Acme", "ACME"), ("Beta.Corp-2", "beta.corp-2")])
def test_names_differing_only_in_case_are_one_name(store, first, second):
    with store.transaction() as session:
        created = create_tenant(session, name=first, actor="test")
    with pytest.raises(DuplicateTenant) as caught:
        with store.transaction() as session:
            create_tenant(session, name=second, actor="test")
    # The error names the spelling that exists; the existing one keeps the case it was typed in.
    assert f"tenant {first!r} already exists" in caught.value.user_message
    with store.transaction(write=False) as session:
        assert [t.name for t in list_tenants(session)] == [first]
        # A lookup by name matches any case and answers with the stored spelling.
        for spelling in (first, second, first.upper(), first.lower()):
            assert (get_tenant(session, name=spelling).id, get_tenant(session, name=spelling).name) == (
                created.id, first)


def test_the_database_refuses_a_case_duplicate_that_skips_the_check(store):
    # Two concurrent creations can both pass create_tenant's SELECT: the unique index on
    # lower(name) (migration 0007) stops the second, here written past the domain code.
    with store.transaction() as session:
        create_tenant(session, name="acme", actor="test")
    with pytest.raises(IntegrityError):
        with store.engine.begin() as connection:
            connection.execute(text("INSERT INTO tenants (id, name, created_at) "
                                    "VALUES ('ten_raw', 'ACME', CURRENT_TIMESTAMP)"))


def test_lookup_does_not_fold_a_non_ascii_letter_into_a_name(store):
    # Python lowers the Kelvin sign (U+212A) to 'k': "\u212acme".lower() == "kcme".
    with store.transaction() as session:
        create_tenant(session, name="kcme", actor="test")
    with pytest.raises(UnknownTenant):
        with store.transaction(write=False) as session:
            get_tenant(session, name="\u212acme")


def test_the_audit_log_is_listed_by_a_name_in_any_case(store):
    with store.transaction() as session:
        create_tenant(session, name="Acme", actor="test")
        create_tenant(session, name="kcme", actor="test")
    with store.transaction(write=False) as session:
        events = list_audit(session, tenant="ACME")
        assert [e.action for e in events] == ["tenant.created"] and events == list_audit(session, tenant="acme")
        with pytest.raises(UnknownTenant):
            list_audit(session, tenant="\u212acme")  # the Kelvin sign lowers to 'k'
