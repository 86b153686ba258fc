"""Signing keys people can trust: every key change is a log leaf, verifiers trust a key only
as the pinned log holds it, within its window, never after revocation; a key row forged or
changed in the database changes nothing a verifier trusts. Both databases."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from sqlalchemy import create_engine, text

from keys import clock
from keys.audit import list_audit
from ledger.chain import timestamp
from ledger.keyset import trusted_keys
from ledger.log import tlog
from ledger.log.audit import audit_log
from ledger.log.note import NoteSigner, Verifier
from ledger.receipts import ReceiptInvalid, Signer, b64url, key_id_of, verify_signed
from ledger.signing import (active_signer, create_signing_key, list_signing_keys, public_keyset, revoke_signing_key,
                            rotate_signing_key)

ACTOR = "test"


def _statement(when, kind="hallmark.receipt"):
    field = "finished_at" if kind == "hallmark.receipt" else "created_at"
    return {"type": kind, "version": 2, field: timestamp(when), "output_sha256": "0" * 64}


def _trusted(store):
    with store.transaction(write=False) as session:
        keyset = public_keyset(session)
    return keyset, trusted_keys(keyset, Verifier.parse(keyset["log"]["vkey"]))


def test_windows_rotation_and_revocation(store):
    t0 = clock.utcnow() - timedelta(hours=3)
    with store.transaction() as session:
        first = create_signing_key(session, store.keyring, actor=ACTOR, now=t0)
        old_signer = active_signer(session, store.keyring)
    t1 = t0 + timedelta(hours=1)
    with store.transaction() as session:
        second, _ = rotate_signing_key(session, store.keyring, actor=ACTOR, now=t1)
        new_signer = active_signer(session, store.keyring)
    keyset, trusted = _trusted(store)
    assert {k["kid"]: (k["not_before"], k["not_after"]) for k in keyset["keys"]} == {
        first.kid: (timestamp(t0), timestamp(t1)), second.kid: (timestamp(t1), None)}
    # A retired key's receipts from its window verify; one dated after its retirement does not.
    inside = old_signer.sign(_statement(t0 + timedelta(minutes=30)))
    assert verify_signed(inside, trusted) == inside["statement"]
    with pytest.raises(ReceiptInvalid, match="after the key was retired"):
        verify_signed(old_signer.sign(_statement(t1 + timedelta(minutes=5))), trusted)
    with pytest.raises(ReceiptInvalid, match="before the key's window opened"):
        verify_signed(new_signer.sign(_statement(t0 + timedelta(minutes=5))), trusted)
    # A detection report is dated by its created_at.
    with pytest.raises(ReceiptInvalid, match="created_at"):
        verify_signed(old_signer.sign(_statement(t1 + timedelta(hours=1), "hallmark.detection_report")), trusted)
    # Within a minute of the rotation both verify (gateways hold a key a few seconds longer).
    verify_signed(old_signer.sign(_statement(t1 + timedelta(seconds=20))), trusted)
    # Revoking the active key: nothing it signed is trusted, a new key signs.
    with store.transaction() as session:
        revoked, third = revoke_signing_key(session, store.keyring, kid=second.kid, reason="leaked", actor=ACTOR)
        assert active_signer(session, store.keyring).kid == third.kid
        actions = [e.action for e in list_audit(session)]
    assert revoked.state == "revoked" and third is not None
    _, trusted = _trusted(store)
    with pytest.raises(ReceiptInvalid, match="revoked key .*leaked"):
        verify_signed(new_signer.sign(_statement(t1 + timedelta(minutes=1))), trusted)
    assert actions[-3:] == ["signing_key.created", "signing_key.rotated", "signing_key.revoked"]


def test_a_key_row_forged_in_the_database_is_not_trusted(store, database_url):
    """The issue's attack: a "retired" key, backdated, inserted straight into signing_keys.
    It is published nowhere a verifier trusts, and `ledger verify` names it."""
    with store.transaction() as session:
        create_signing_key(session, store.keyring, actor=ACTOR)
    forger = Ed25519PrivateKey.generate()
    raw = forger.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    kid = key_id_of(raw)
    engine = create_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO signing_keys (id, public_key, wrapped_private, nonce, kek_id, state, created_at, retired_at) "
            "VALUES (:id, :pk, :w, :n, 'x', 'retired', :c, :r)"),
            {"id": kid, "pk": raw, "w": b"\0" * 48, "n": b"\0" * 12,
             "c": (clock.utcnow() - timedelta(days=400)).replace(tzinfo=None),
             "r": (clock.utcnow() - timedelta(days=300)).replace(tzinfo=None)})
    engine.dispose()
    keyset, trusted = _trusted(store)
    assert kid not in {k["kid"] for k in keyset["keys"]} and kid not in trusted
    forged = Signer(kid=kid, private_key=forger).sign(_statement(clock.utcnow() - timedelta(days=350)))
    with pytest.raises(ReceiptInvalid, match="does not contain"):
        verify_signed(forged, trusted)
    # Even a key set edited to list it (with a made-up log position) does not help.
    doctored = copy.deepcopy(keyset)
    fake = copy.deepcopy(doctored["keys"][0])
    fake["kid"] = fake["log"]["event"]["kid"] = kid
    fake["public_key"] = fake["log"]["event"]["public_key"] = b64url(raw)
    doctored["keys"].append(fake)
    with pytest.raises(ReceiptInvalid, match="does not contain"):
        verify_signed(forged, trusted_keys(doctored, Verifier.parse(keyset["log"]["vkey"])))
    with store.transaction(write=False) as session:
        report = audit_log(session, tlog.authority(session))
        infos = {i.kid: i for i in list_signing_keys(session)}
    assert not infos[kid].logged
    assert any(kid in p and "not in the log" in p for p in report.problems)


def test_retiring_the_active_key_in_the_database_changes_nothing_trusted(store, database_url):
    """The issue's attack: the gateway's role retired the active key, receipts went null.
    Now the log's word decides which key signs; `ledger verify` names the changed row."""
    with store.transaction() as session:
        key = create_signing_key(session, store.keyring, actor=ACTOR)
    engine = create_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE signing_keys SET state = 'retired', retired_at = created_at"))
    engine.dispose()
    with store.transaction(write=False) as session:
        assert active_signer(session, store.keyring).kid == key.kid
        report = audit_log(session, tlog.authority(session))
    assert any("differs from its latest logged event" in p for p in report.problems)


def test_a_key_set_under_another_log_key_or_altered_is_refused(store):
    with store.transaction() as session:
        create_signing_key(session, store.keyring, actor=ACTOR)
        signer = active_signer(session, store.keyring)
    keyset, trusted = _trusted(store)
    statement = _statement(clock.utcnow())
    verify_signed(signer.sign(statement), trusted)
    other_log = NoteSigner(keyset["log"]["origin"], Ed25519PrivateKey.generate()).verifier
    with pytest.raises(ReceiptInvalid, match="checkpoint"):
        trusted_keys(keyset, other_log)
    widened = copy.deepcopy(keyset)  # a window stretched in the document, not in the log
    widened["keys"][0]["log"]["event"]["not_before"] = "2000-01-01T00:00:00.000000Z"
    assert trusted_keys(widened, Verifier.parse(keyset["log"]["vkey"])) == {}
