"""The provenance ledger: records, tenant scoping, lookups by output hash, validation."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone

import pytest

from keys.errors import InvalidInput, UnknownKey, UnknownTenant
from ledger.entries import find_generations_by_output_hash, get_generation, hash_output, record_generation
from watermark.spec import WatermarkSpec

TEXT = "The quick brown fox — watermarked. ✓"


@pytest.fixture
def tenants(two_tenants):
    made = two_tenants(spec=WatermarkSpec(algorithm="dual_key_gumbel", context_width=3))
    return made.acme, made.beta, made.acme_key


def _record(session, tenant_id, key=None, **overrides):
    values = dict(tenant_id=tenant_id, key_id=key.key_id if key else None,
                  key_version=key.version if key else None, engine="local", model="tiny-dsv32",
                  spec=key.spec if key else None, prompt_tokens=12, output_tokens=40,
                  watermarked_tokens=37 if key else 0, unwatermarked_reason=None if key else "temperature_0",
                  output_text=TEXT)
    values.update(overrides)
    return record_generation(session, **values)


def test_record_and_fetch_a_watermarked_generation(store, tenants):
    acme, _, key = tenants
    with store.transaction() as session:
        record = _record(session, acme.id, key, unwatermarked_reason="dedup")
    assert len(record.id) == 32 and record.watermarked
    assert record.output_sha256 == hashlib.sha256(TEXT.encode("utf-8")).hexdigest() == hash_output(TEXT)
    with store.transaction(write=False) as session:
        fetched = get_generation(session, generation_id=record.id, tenant_id=acme.id)
    assert fetched == record
    assert fetched.spec == key.spec and fetched.created_at.tzinfo == timezone.utc
    assert fetched.to_dict()["key_version"] == key.version and fetched.to_dict()["tenant"] == "acme"


def test_unwatermarked_generations_have_no_key(store, tenants):
    acme, _, _ = tenants
    with store.transaction() as session:
        record = _record(session, acme.id)
    assert not record.watermarked and record.key_id is None and record.unwatermarked_reason == "temperature_0"


def test_tenant_scoping(store, tenants):
    acme, beta, key = tenants
    with store.transaction() as session:
        record = _record(session, acme.id, key)
    with store.transaction(write=False) as session:
        assert get_generation(session, generation_id=record.id, tenant_id=beta.id) is None
        assert get_generation(session, generation_id=record.id, tenant_id=None) == record
        assert get_generation(session, generation_id="0" * 32, tenant_id=None) is None


def test_find_by_output_hash_newest_first_and_scoped(store, tenants):
    acme, beta, key = tenants
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with store.transaction() as session:
        older = _record(session, acme.id, key, now=start)
        newer = _record(session, acme.id, key, now=start + timedelta(minutes=5))
        other = _record(session, beta.id, output_text=None, output_sha256=hash_output(TEXT))
        _record(session, acme.id, key, output_text="something else")
    digest = hash_output(TEXT)
    with store.transaction(write=False) as session:
        assert [r.id for r in find_generations_by_output_hash(session, output_sha256=digest, tenant_id=acme.id)] \
            == [newer.id, older.id]
        everyone = find_generations_by_output_hash(session, output_sha256=digest, tenant_id=None)
        assert {r.id for r in everyone} == {older.id, newer.id, other.id}
        assert find_generations_by_output_hash(session, output_sha256="0" * 64, tenant_id=None) == []


@pytest.mark.parametrize("overrides, message", [
    ({"output_sha256": "ab" * 32}, "exactly one of output_text"),
    ({"output_text": None}, "exactly one of output_text"),
    ({"output_text": None, "output_sha256": "XYZ"}, "64 lowercase hex"),
    ({"watermarked_tokens": 41}, "cannot exceed"),
    ({"prompt_tokens": -1}, "non-negative"),
    ({"key_version": None}, "key_id and key_version together"),
    ({"key_version": 9}, "not 9"),
    ({"unwatermarked_reason": "Not Snake"}, "lower_snake_case"),
    ({"engine": ""}, "engine"),
    ({"generation_id": "not-hex"}, "32 lowercase hex"),
])
def test_invalid_records_are_refused(store, tenants, overrides, message):
    acme, _, key = tenants
    with pytest.raises(InvalidInput, match=message):
        with store.transaction() as session:
            _record(session, acme.id, key, **overrides)


def test_keys_must_belong_to_the_tenant(store, tenants):
    _, beta, key = tenants
    with pytest.raises(UnknownKey):
        with store.transaction() as session:
            _record(session, beta.id, key)
    with pytest.raises(InvalidInput, match="without a key"):
        with store.transaction() as session:
            _record(session, beta.id, watermarked_tokens=3)
    with pytest.raises(UnknownTenant):
        with store.transaction() as session:
            _record(session, "ten_nope")
