"""Key lifecycle: create, import, rotate, revoke, export; opened keys for generation and
detection; every change audited in its own transaction, failures changing nothing."""

from __future__ import annotations

import secrets
from datetime import timezone

import pytest

from keys.audit import list_audit
from keys.errors import (
    DuplicateKey,
    InvalidInput,
    InvalidTransition,
    KekError,
    NoActiveKey,
    UnknownKey,
    UnknownTenant,
)
from keys.kek import Kek, Keyring
from keys.lifecycle import build_spec, create_key, get_key, import_key, list_keys, revoke_key, rotate_key
from keys.material import active_key, detection_keys, export_key
from keys.tenants import create_tenant
from tests.keys.conftest import snapshot
from watermark.key import WatermarkKey, fingerprint
from watermark.spec import WatermarkSpec

ACTOR = "test:ops"


@pytest.fixture
def acme(store):
    with store.transaction() as session:
        return create_tenant(session, name="acme", actor=ACTOR)


def _create(store, tenant="acme", **spec):
    with store.transaction() as session:
        return create_key(session, store.keyring, tenant=tenant, actor=ACTOR,
                          spec=build_spec(**spec) if spec else None)


def test_first_key_is_active_a_second_one_verify_only(store, acme):
    first = _create(store)
    assert (first.version, first.state, first.tenant) == (1, "active", "acme")
    assert first.activated_at == first.created_at and first.created_at.tzinfo == timezone.utc
    # New keys are diverse by an unwatermarked head (watermark.head), which needs dedup scope all,
    # on the 256-bit PRF (issue 36).
    assert first.spec == WatermarkSpec(mode="diverse", diversity="head", dedup="all",
                                       prf="hmac-sha256-philox-v1") and not first.imported
    assert first.to_dict()["key_bits"] == 256
    second = _create(store, algorithm="dual_key_gumbel", context_width=2)
    assert (second.version, second.state) == (2, "verify-only")
    assert second.activated_at is None and second.verify_only_at is not None
    with store.transaction(write=False) as session:
        assert active_key(session, store.keyring, tenant_id=acme.id).key_id == first.key_id
        actions = [(e.action, e.key_id) for e in list_audit(session, tenant="acme")]
    assert actions == [("tenant.created", None), ("key.created", first.key_id),
                       ("key.created", second.key_id)]


def test_rotation_makes_a_new_active_key_and_keeps_the_old_for_verification(store, acme):
    first = _create(store, context_width=6)
    with store.transaction() as session:
        rotation = rotate_key(session, store.keyring, tenant="acme", actor=ACTOR)
    assert rotation.previous.key_id == first.key_id and rotation.previous.state == "verify-only"
    assert (rotation.new.version, rotation.new.state) == (2, "active")
    assert rotation.new.spec.context_width == 6  # inherited
    with store.transaction() as session:
        third = rotate_key(session, store.keyring, tenant="acme", actor=ACTOR,
                           spec_changes={"algorithm": "dual_key_gumbel", "alpha": 0.25}).new
    assert (third.spec.algorithm, third.spec.alpha, third.spec.context_width) == ("dual_key_gumbel", 0.25, 6)
    with store.transaction(write=False) as session:
        states = [(k.version, k.state) for k in list_keys(session, tenant="acme")]
        assert states == [(1, "verify-only"), (2, "verify-only"), (3, "active")]
        assert get_key(session, key_id=first.key_id).verify_only_at is not None
        active = active_key(session, store.keyring, tenant_id=acme.id)
        assert active.key_id == third.key_id and active.material.spec == third.spec
        rotated = [e for e in list_audit(session, action="key.rotated")]
        assert [e.details["previous_version"] for e in rotated] == [1, 2]


def test_rotation_with_an_invalid_spec_change_changes_nothing(store, acme, database_url):
    _create(store)
    before = snapshot(database_url)
    with pytest.raises(InvalidInput, match="context_width"):
        with store.transaction() as session:
            rotate_key(session, store.keyring, tenant="acme", actor=ACTOR,
                       spec_changes={"context_width": 99})
    assert snapshot(database_url) == before


def test_rotating_a_tenant_without_keys(store, acme, database_url):
    before = snapshot(database_url)
    with pytest.raises(NoActiveKey) as caught:
        with store.transaction() as session:
            rotate_key(session, store.keyring, tenant="acme", actor=ACTOR)
    assert "keys create --tenant acme" in caught.value.user_message
    assert snapshot(database_url) == before
    with pytest.raises(UnknownTenant):
        with store.transaction() as session:
            rotate_key(session, store.keyring, tenant="nobody", actor=ACTOR)


def test_rotating_when_only_revoked_keys_remain(store, acme):
    key = _create(store)
    with store.transaction() as session:
        revoke_key(session, key_id=key.key_id, reason="leaked", actor=ACTOR)
    with pytest.raises(InvalidTransition, match="no active key to rotate"):
        with store.transaction() as session:
            rotate_key(session, store.keyring, tenant="acme", actor=ACTOR)
    assert _create(store).state == "active"  # create restores an active key


def test_revoke(store, acme, database_url):
    key = _create(store)
    with store.transaction() as session:
        revoked = revoke_key(session, key_id=key.key_id, reason="  posted  to\na gist ", actor=ACTOR)
    assert revoked.state == "revoked" and revoked.revocation_reason == "posted to a gist"
    assert revoked.revoked_at is not None
    with store.transaction(write=False) as session:
        with pytest.raises(NoActiveKey):
            active_key(session, store.keyring, tenant_id=acme.id)
        (event,) = list_audit(session, action="key.revoked")
    assert event.details == {"version": 1, "previous_state": "active", "reason": "posted to a gist"}

    before = snapshot(database_url)
    with pytest.raises(InvalidTransition, match="already revoked"):
        with store.transaction() as session:
            revoke_key(session, key_id=key.key_id, reason="again", actor=ACTOR)
    with pytest.raises(UnknownKey):
        with store.transaction() as session:
            revoke_key(session, key_id="key_nope", reason="x", actor=ACTOR)
    with pytest.raises(InvalidInput, match="reason"):
        with store.transaction() as session:
            revoke_key(session, key_id=key.key_id, reason="  ", actor=ACTOR)
    assert snapshot(database_url) == before


def test_import_a_vllm_key(store, acme):
    secret = secrets.randbits(64)
    _, spec = WatermarkSpec.from_vllm({"key": secret, "algorithm": "dual_key_gumbel", "context_width": 3,
                                       "alpha": 0.2, "deduplicate_contexts": "all", "prf": "philox"})
    with store.transaction() as session:
        info = import_key(session, store.keyring, tenant="acme", secret=secret, spec=spec,
                          source="vllm prod", actor=ACTOR)
    assert info.imported and info.import_source == "vllm prod" and info.state == "active"
    assert info.fingerprint == fingerprint(secret)
    with store.transaction(write=False) as session:
        opened = active_key(session, store.keyring, tenant_id=acme.id)
        (event,) = list_audit(session, action="key.imported")
    assert opened.material == WatermarkKey(secret=secret, spec=spec)
    assert str(secret) not in repr(event) and event.details["source"] == "vllm prod"


def test_one_secret_cannot_be_imported_twice(store, acme):
    with store.transaction() as session:
        create_tenant(session, name="beta", actor=ACTOR)
    secret = secrets.randbits(64)
    with store.transaction() as session:
        first = import_key(session, store.keyring, tenant="acme", secret=secret, spec=WatermarkSpec(), actor=ACTOR)
    for tenant in ("acme", "beta"):
        with pytest.raises(DuplicateKey) as caught:
            with store.transaction() as session:
                import_key(session, store.keyring, tenant=tenant, secret=secret, spec=WatermarkSpec(), actor=ACTOR)
        assert first.key_id in caught.value.user_message and str(secret) not in caught.value.user_message


@pytest.mark.parametrize("secret", [-1, 2**64, True])
def test_import_refuses_non_64_bit_secrets(store, acme, secret):
    with pytest.raises(InvalidInput):
        with store.transaction() as session:
            import_key(session, store.keyring, tenant="acme", secret=secret, spec=WatermarkSpec(), actor=ACTOR)


def test_detection_keys_cover_every_state_and_tenant(store, acme):
    with store.transaction() as session:
        create_tenant(session, name="beta", actor=ACTOR)
    first = _create(store)
    with store.transaction() as session:
        rotate_key(session, store.keyring, tenant="acme", actor=ACTOR)
        revoke_key(session, key_id=first.key_id, reason="lost laptop", actor=ACTOR)
    beta = _create(store, tenant="beta")
    with store.transaction(write=False) as session:
        acme_keys = detection_keys(session, store.keyring, tenant="acme")
        every = detection_keys(session, store.keyring)
        with pytest.raises(UnknownTenant):
            detection_keys(session, store.keyring, tenant="nobody")
    assert [(k.version, k.state) for k in acme_keys] == [(1, "revoked"), (2, "active")]
    assert acme_keys[0].revoked_at is not None
    assert acme_keys[0].public_dict() == {"tenant": "acme", "key_id": first.key_id, "version": 1,
                                          "state": "revoked", "fingerprint": first.fingerprint,
                                          "algorithm": "gumbel"}
    assert [k.key_id for k in every] == [k.key_id for k in acme_keys] + [beta.key_id]
    for key in every:
        assert key.material.fingerprint == key.fingerprint
        assert str(key.material.secret) not in repr(key)


def test_export_returns_the_secret_and_is_audited(store, acme):
    secret = secrets.randbits(64)
    with store.transaction() as session:
        info = import_key(session, store.keyring, tenant="acme", secret=secret, spec=WatermarkSpec(), actor=ACTOR)
    with store.transaction() as session:
        exported = export_key(session, store.keyring, key_id=info.key_id, actor="test:exporter")
    assert exported.secret == secret and str(secret) not in repr(exported)
    assert exported.vllm_watermark_config()["key"] == secret
    assert WatermarkSpec.from_vllm(exported.vllm_watermark_config()) == (secret, WatermarkSpec())
    with store.transaction(write=False) as session:
        (event,) = list_audit(session, action="key.exported")
    assert event.actor == "test:exporter" and event.key_id == info.key_id
    with pytest.raises(UnknownKey):
        with store.transaction() as session:
            export_key(session, store.keyring, key_id="key_nope", actor=ACTOR)


def test_keyed_coin_has_no_vllm_config(store, acme):
    _create(store, algorithm="dual_key_gumbel", coin="keyed")
    with store.transaction() as session:
        (key,) = list_keys(session, tenant="acme")
        assert export_key(session, store.keyring, key_id=key.key_id, actor=ACTOR).vllm_watermark_config() is None


def test_unknown_tenant_creates_nothing(store, database_url):
    before = snapshot(database_url)
    with pytest.raises(UnknownTenant):
        _create(store, tenant="nobody")
    assert snapshot(database_url) == before


def test_a_different_kek_is_refused_before_anything_changes(store, acme, database_url):
    key = _create(store)
    other = Keyring([Kek.generate()])
    before = snapshot(database_url)
    for change in (
        lambda s: create_key(s, other, tenant="acme", actor=ACTOR),
        lambda s: import_key(s, other, tenant="acme", secret=secrets.randbits(64), spec=WatermarkSpec(), actor=ACTOR),
        lambda s: rotate_key(s, other, tenant="acme", actor=ACTOR),
        lambda s: export_key(s, other, key_id=key.key_id, actor=ACTOR),
        lambda s: active_key(s, other, tenant_id=acme.id),
    ):
        with pytest.raises(KekError) as caught:
            with store.transaction() as session:
                change(session)
        assert "KEK" in caught.value.user_message
    assert snapshot(database_url) == before


def test_build_spec_reports_problems_in_one_line():
    with pytest.raises(InvalidInput) as caught:
        build_spec(algorithm="nope", context_width=0)
    message = caught.value.user_message
    assert "algorithm" in message and "context_width" in message and "\n" not in message
