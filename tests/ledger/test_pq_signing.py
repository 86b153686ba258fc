"""Composite signing keys (ledger.sigalg: Ed25519 + ML-DSA-44), issue 32 item 5: a composite
key signs every statement with both, is bound into the log like an Ed25519 key, and every
verifier requires BOTH signatures (stripping or altering the ML-DSA-44 one fails, and so does
relabelling the document as Ed25519). Ed25519 keys are unchanged. Both databases."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest

from keys import clock
from keys.errors import InvalidInput
from keys.kek import Kek, Keyring
from keys.kek_rotation import rotate_kek
from ledger.chain import timestamp
from ledger.keyset import trusted_keys
from ledger.log import tlog
from ledger.log.audit import audit_log
from ledger.log.note import Verifier
from ledger.receipts import ReceiptInvalid, b64url, public_keys, unb64url, verify_signed
from ledger.sealed import KEK_DEPENDANTS
from ledger.signing import active_signer, create_signing_key, list_signing_keys, public_keyset, rotate_signing_key
from ledger.sigalg import COMPOSITE, ED25519, ML_DSA_SIG_FIELD

ACTOR = "test"


def _statement(when=None):
    return {"type": "hallmark.receipt", "version": 2, "finished_at": timestamp(when or clock.utcnow()),
            "output_sha256": "0" * 64}


def _trusted(store):
    with store.transaction(write=False) as session:
        keyset = public_keyset(session)
    return keyset, trusted_keys(keyset, Verifier.parse(keyset["log"]["vkey"]))


def test_a_composite_key_signs_with_both_and_verifiers_require_both(store):
    with store.transaction() as session:
        info = create_signing_key(session, store.keyring, actor=ACTOR, alg=COMPOSITE)
        signer = active_signer(session, store.keyring)
    assert info.alg == COMPOSITE and info.to_dict()["alg"] == COMPOSITE and info.logged and info.consistent
    keyset, trusted = _trusted(store)
    [entry] = keyset["keys"]
    assert entry["alg"] == entry["log"]["event"]["alg"] == COMPOSITE
    assert len(unb64url(entry["public_key"])) == 32 + 1312  # both halves, logged in the key's leaf
    document = signer.sign(_statement())
    assert document["signature"]["alg"] == COMPOSITE and len(unb64url(document["signature"][ML_DSA_SIG_FIELD])) == 2420
    assert verify_signed(document, trusted) == document["statement"]
    assert verify_signed(document, public_keys(keyset)) == document["statement"]  # the unchecked key set too

    stripped = copy.deepcopy(document)
    del stripped["signature"][ML_DSA_SIG_FIELD]
    relabelled = copy.deepcopy(stripped)
    relabelled["signature"]["alg"] = ED25519  # a valid Ed25519 signature alone, claimed as enough
    altered = copy.deepcopy(document)
    sig = bytearray(unb64url(altered["signature"][ML_DSA_SIG_FIELD]))
    sig[100] ^= 1
    altered["signature"][ML_DSA_SIG_FIELD] = b64url(bytes(sig))
    bad_ed = copy.deepcopy(document)
    bad_ed["signature"]["sig"] = b64url(b"\0" * 64)
    other = signer.sign(_statement(clock.utcnow() - timedelta(seconds=1)))
    swapped = copy.deepcopy(document)  # another statement's (valid) ML-DSA-44 signature
    swapped["signature"][ML_DSA_SIG_FIELD] = other["signature"][ML_DSA_SIG_FIELD]
    for keys in (trusted, public_keys(keyset)):
        with pytest.raises(ReceiptInvalid, match="ml_dsa_44_sig is missing"):
            verify_signed(stripped, keys)
        with pytest.raises(ReceiptInvalid, match="requires both an Ed25519 and an ML-DSA-44 signature"):
            verify_signed(relabelled, keys)
        for broken in (altered, swapped):
            with pytest.raises(ReceiptInvalid, match="bad signature.*bad ML-DSA-44 signature"):
                verify_signed(broken, keys)
        with pytest.raises(ReceiptInvalid, match="bad signature.*bad Ed25519 signature"):
            verify_signed(bad_ed, keys)


def test_a_key_set_claiming_ed25519_for_a_composite_key_trusts_nothing(store):
    """The logged algorithm decides: a key set that relabels the key (or its event) changes
    either nothing or the leaf, whose inclusion then fails."""
    with store.transaction() as session:
        create_signing_key(session, store.keyring, actor=ACTOR, alg=COMPOSITE)
    keyset, _ = _trusted(store)
    vkey = Verifier.parse(keyset["log"]["vkey"])
    relabelled = copy.deepcopy(keyset)
    relabelled["keys"][0]["alg"] = ED25519
    assert trusted_keys(relabelled, vkey) == {}
    relabelled["keys"][0]["log"]["event"]["alg"] = ED25519
    assert trusted_keys(relabelled, vkey) == {}
    half = copy.deepcopy(keyset)  # the Ed25519 half alone, under the composite key's id
    half["keys"][0]["public_key"] = half["keys"][0]["log"]["event"]["public_key"] = \
        b64url(unb64url(keyset["keys"][0]["public_key"])[:32])
    assert trusted_keys(half, vkey) == {} and public_keys(half) == {}


def test_rotation_between_algorithms_kek_rewrap_and_ledger_verify(store):
    with store.transaction() as session:
        first = create_signing_key(session, store.keyring, actor=ACTOR, now=clock.utcnow() - timedelta(hours=1))
        old = active_signer(session, store.keyring)
        new, retired = rotate_signing_key(session, store.keyring, actor=ACTOR, alg=COMPOSITE)
        pq = active_signer(session, store.keyring)
        with pytest.raises(InvalidInput, match="unknown signing algorithm"):
            rotate_signing_key(session, store.keyring, actor=ACTOR, alg="RSA")
    assert first.alg == ED25519 and new.alg == COMPOSITE and retired.kid == first.kid
    assert old.sign(_statement())["signature"].keys() == {"alg", "kid", "sig"}  # Ed25519 documents unchanged
    _, trusted = _trusted(store)
    verify_signed(old.sign(_statement(clock.utcnow() - timedelta(minutes=5))), trusted)
    verify_signed(pq.sign(_statement()), trusted)
    # Sealed under the KEK like every signing key: a KEK rotation re-wraps both seeds, and the
    # key opened under the new KEK alone still signs with both algorithms.
    new_kek = Kek.generate()
    with store.transaction() as session:
        rotate_kek(session, current=store.keyring, new=new_kek, actor=ACTOR, dependants=KEK_DEPENDANTS)
    with store.transaction(write=False) as session:
        reopened = active_signer(session, Keyring([new_kek]))
        assert reopened.kid == pq.kid and reopened.ml_dsa_key is not None
    verify_signed(reopened.sign(_statement()), trusted)
    with store.transaction(write=False) as session:
        report = audit_log(session, tlog.authority(session))
        infos = {i.kid: i for i in list_signing_keys(session)}
    assert not report.problems, report.problems
    assert infos[new.kid].alg == COMPOSITE and infos[new.kid].consistent
