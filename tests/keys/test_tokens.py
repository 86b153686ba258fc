"""API tokens: issued once, stored as a hash, authenticated, revoked."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy import select

from keys.audit import list_audit
from keys.errors import InvalidInput, InvalidTransition, UnknownTenant, UnknownToken
from keys.models import ApiToken
from keys.tenants import create_tenant
from keys.tokens import authenticate_token, issue_token, list_tokens, revoke_token
from tests.keys.conftest import snapshot

ACTOR = "test:ops"


@pytest.fixture
def acme(store):
    with store.transaction() as session:
        return create_tenant(session, name="acme", actor=ACTOR)


def test_issue_and_authenticate_a_tenant_token(store, acme):
    with store.transaction() as session:
        issued = issue_token(session, tenant="acme", actor=ACTOR)
    raw = issued.raw_token
    assert raw.startswith("hm_") and len(raw) == 46 and raw not in repr(issued)
    assert issued.info.prefix == raw[:11] and issued.info.tenant == "acme" and not issued.info.admin
    with store.transaction(write=False) as session:
        identity = authenticate_token(session, raw_token=raw)
        row = session.scalar(select(ApiToken))
    assert identity is not None
    assert (identity.token_id, identity.tenant_id, identity.tenant, identity.admin) == (
        issued.info.token_id, acme.id, "acme", False)
    assert row.token_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert raw not in {str(value) for value in vars(row).values()}


def test_a_global_admin_token(store):
    with store.transaction() as session:
        issued = issue_token(session, tenant=None, admin=True, actor=ACTOR)
    with store.transaction(write=False) as session:
        identity = authenticate_token(session, raw_token=issued.raw_token)
    assert identity.admin and identity.tenant_id is None and identity.tenant is None


def test_a_tenant_admin_token(store, acme):
    with store.transaction() as session:
        issued = issue_token(session, tenant="acme", admin=True, actor=ACTOR)
    with store.transaction(write=False) as session:
        identity = authenticate_token(session, raw_token=issued.raw_token)
    assert identity.admin and identity.tenant == "acme"


@pytest.mark.parametrize("raw", ["", "hm_", "Bearer x", "hm_" + "A" * 43, None, 42])
def test_unknown_or_malformed_tokens_authenticate_nobody(store, acme, raw):
    with store.transaction() as session:
        issue_token(session, tenant="acme", actor=ACTOR)
    with store.transaction(write=False) as session:
        assert authenticate_token(session, raw_token=raw) is None


def test_revoked_tokens_stop_working_and_cannot_be_revoked_twice(store, acme, database_url):
    with store.transaction() as session:
        issued = issue_token(session, tenant="acme", actor=ACTOR)
    with store.transaction() as session:
        revoked = revoke_token(session, token_id=issued.info.token_id, actor=ACTOR)
    assert revoked.revoked_at is not None
    with store.transaction(write=False) as session:
        assert authenticate_token(session, raw_token=issued.raw_token) is None
    before = snapshot(database_url)
    with pytest.raises(InvalidTransition, match="already revoked"):
        with store.transaction() as session:
            revoke_token(session, token_id=issued.info.token_id, actor=ACTOR)
    with pytest.raises(UnknownToken):
        with store.transaction() as session:
            revoke_token(session, token_id="tok_nope", actor=ACTOR)
    assert snapshot(database_url) == before


def test_bad_issue_requests(store, database_url):
    before = snapshot(database_url)
    with pytest.raises(InvalidInput, match="--tenant"):
        with store.transaction() as session:
            issue_token(session, tenant=None, actor=ACTOR)
    with pytest.raises(UnknownTenant):
        with store.transaction() as session:
            issue_token(session, tenant="nobody", actor=ACTOR)
    assert snapshot(database_url) == before


def test_list_and_audit_never_show_the_token(store, acme):
    with store.transaction() as session:
        create_tenant(session, name="beta", actor=ACTOR)
        tokens = [issue_token(session, tenant="acme", actor=ACTOR),
                  issue_token(session, tenant="beta", actor=ACTOR),
                  issue_token(session, tenant=None, admin=True, actor=ACTOR)]
        revoke_token(session, token_id=tokens[0].info.token_id, actor=ACTOR)
    with store.transaction(write=False) as session:
        assert [t.token_id for t in list_tokens(session, tenant="acme")] == [tokens[0].info.token_id]
        listed = list_tokens(session)
        events = list_audit(session)
    assert len(listed) == 3
    shown = repr(listed) + repr(events) + repr([t.to_dict() for t in listed])
    for token in tokens:
        assert token.raw_token not in shown
        assert hashlib.sha256(token.raw_token.encode()).hexdigest() not in shown
    assert [e.action for e in events if e.action.startswith("token.")] == ["token.issued"] * 3 + ["token.revoked"]
