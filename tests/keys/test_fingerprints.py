"""Fingerprints shown to tenants are no offline check of the 64-bit secret (issue 9, 7).

What is shown is 24 bits of an HMAC of the secret, so about 2**40 secrets share each
value; the 64-bit check value that does single out a secret stays in the store's column.
"""

from __future__ import annotations

import logging
import secrets
from collections import Counter

import pytest

from keys.audit import list_audit
from keys.errors import DuplicateKey
from keys.lifecycle import create_key, import_key, list_keys
from keys.material import active_key, export_key
from keys.models import KeyRow
from keys.tenants import create_tenant
from watermark.key import WatermarkKey, check_value, fingerprint
from watermark.spec import WatermarkSpec

ACTOR = "test:ops"


def test_a_shown_fingerprint_is_shared_by_many_secrets():
    """Birthday bound: among 2**14 secrets, 24-bit fingerprints collide about 8 times
    (P(no collision) = e**-8), a 64-bit one never does. A value that many secrets share
    cannot confirm a guessed secret; a brute force over all 2**64 keeps 2**40 candidates."""
    counts = Counter(fingerprint(secret) for secret in range(1, 2**14 + 1))
    shared = sum(n - 1 for n in counts.values() if n > 1)
    assert shared >= 1
    assert all(len(value) * 4 <= 24 for value in counts)
    # the store's private check value still tells secrets apart (duplicate imports)
    assert len({check_value(secret) for secret in range(1, 2**14 + 1)}) == 2**14


def test_nothing_shown_carries_the_check_value(store, caplog):
    caplog.set_level(logging.DEBUG)
    secret = secrets.randbits(64)
    with store.transaction() as session:
        create_tenant(session, name="acme", actor=ACTOR)
        imported = import_key(session, store.keyring, tenant="acme", secret=secret,
                              spec=WatermarkSpec(), source="vllm", actor=ACTOR)
        created = create_key(session, store.keyring, tenant="acme", actor=ACTOR)
    with store.transaction() as session:
        exported = export_key(session, store.keyring, key_id=imported.key_id, actor=ACTOR)
        opened = active_key(session, store.keyring, tenant_id=imported.tenant_id)
        listed = list_keys(session, tenant="acme")
        events = list_audit(session)
        row = session.get(KeyRow, imported.key_id)
        created_check = session.get(KeyRow, created.key_id).fingerprint
    assert row.fingerprint == check_value(secret)  # the store keeps the 64-bit value
    assert imported.fingerprint == exported.fingerprint == opened.fingerprint == fingerprint(secret)
    assert opened.material.fingerprint == fingerprint(secret) == WatermarkKey(secret).fingerprint
    shown = repr([imported, created, exported, opened.public_dict(),
                  opened.fingerprint, [k.fingerprint for k in listed], [e.details for e in events]])
    shown += caplog.text
    for check in (check_value(secret), created_check):
        assert check not in shown
    with pytest.raises(DuplicateKey) as error:
        with store.transaction() as session:
            import_key(session, store.keyring, tenant="acme", secret=secret, spec=WatermarkSpec(),
                       actor=ACTOR)
    assert check_value(secret) not in str(error.value) and fingerprint(secret) in str(error.value)
