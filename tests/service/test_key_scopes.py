"""The service's detection scopes across key cache reloads (service.key_scopes): a reload
of an unchanged store gives back the very same candidate list (so its KeySet is kept), a
key revoked or created through another gateway is seen at the first reload after the key
cache's TTL as before, and every list equals opening the scope afresh."""

from __future__ import annotations

import pytest

from detector.result import salted_candidates
from keys import migrate
from keys.db import open_store
from keys.kek import generate_kek_file
from keys.lifecycle import create_key, revoke_key
from keys.material import detection_keys
from keys.settings import StoreSettings
from keys.tenants import create_tenant
from service.caching import TTLCache
from service.key_scopes import KeyScopes, candidate_of
from service.settings import ServiceSettings
from service.state import Services
from watermark.salt import SALTS
from watermark.spec import WatermarkSpec


SALTED = WatermarkSpec(mode="diverse")

@pytest.fixture
def settings(tmp_path):
    kek = tmp_path / "kek.key"
    generate_kek_file(kek)
    settings = StoreSettings(database_url=f"sqlite:///{tmp_path / 'h.db'}", kek_file=kek)
    store = open_store(settings, require_kek=True, check_schema=False, create=True)
    try:
        migrate.upgrade(store.engine)
        with store.transaction() as session:
            for tenant in ("acme", "beta"):
                create_tenant(session, name=tenant, actor="test")
                # diverse, salt scheme: one stored key, SALTS candidates (the default head scheme is one)
                create_key(session, store.keyring, tenant=tenant, actor="test", spec=SALTED)
            create_key(session, store.keyring, tenant="acme", actor="test", spec=WatermarkSpec())
    finally:
        store.close()
    return settings


@pytest.fixture
def gateways(settings):
    """Two stores on one database: this gateway's and another's (or the CLI's)."""
    ours, other = open_store(settings, require_kek=True), open_store(settings, require_kek=True)
    try:
        yield ours, other
    finally:
        ours.close()
        other.close()


def _fresh(store, tenant):
    with store.transaction(write=False) as session:
        return salted_candidates([candidate_of(k) for k in detection_keys(session, store.keyring, tenant=tenant)])


@pytest.mark.parametrize("tenant", [None, "acme"])
def test_an_unchanged_scope_is_the_same_list(gateways, tenant):
    store, _ = gateways
    scopes = KeyScopes()
    first = scopes.load(store, tenant)
    assert first == _fresh(store, tenant)
    assert len(first) == (2 * SALTS + 1 if tenant is None else SALTS + 1)
    assert scopes.load(store, tenant) is first
    scopes.clear()  # forgotten: opened afresh, equal
    again = scopes.load(store, tenant)
    assert again == first and again is not first


def test_changes_through_another_gateway_are_seen_at_the_next_load(gateways):
    store, other = gateways
    scopes = KeyScopes()
    before = scopes.load(store, "acme")
    victim = before[0].info.key_id
    with other.transaction() as session:
        revoke_key(session, key_id=victim, reason="leaked", actor="test")
        create_key(session, other.keyring, tenant="acme", actor="test", spec=SALTED)
    after = scopes.load(store, "acme")
    assert after == _fresh(store, "acme") and len(after) == len(before) + SALTS
    assert {c.info.state for c in after if c.info.key_id == victim} == {"revoked"}
    kept = [c for c in before if c.info.key_id != victim]
    assert all(any(c is d for d in after) for c in kept)  # the unchanged key's candidates, kept
    assert scopes.load(store, "beta") == _fresh(store, "beta")  # another scope: its own keys


def test_a_revocation_elsewhere_stops_the_key_within_the_cache_ttl(gateways):
    """As before incremental reloads: cached for key_cache_seconds, then the store as it is."""
    store, other = gateways
    now = [0.0]
    services = Services(settings=ServiceSettings(key_cache_seconds=2.0), store=store, engine=object())
    services.key_cache = TTLCache(2.0, clock=lambda: now[0])
    first = services.detection_candidates("acme")
    victim = first[-1].info.key_id
    with other.transaction() as session:
        revoke_key(session, key_id=victim, reason="leaked", actor="test")
    now[0] = 1.9
    assert services.detection_candidates("acme") is first  # within the TTL, as before
    now[0] = 2.1
    after = services.detection_candidates("acme")
    assert {c.info.state for c in after if c.info.key_id == victim} == {"revoked"}
    assert after == _fresh(store, "acme")
    now[0] = 4.5
    assert services.detection_candidates("acme") is after  # nothing changed since: the same list
