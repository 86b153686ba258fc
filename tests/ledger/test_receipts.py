"""Signed receipts: the encoding pinned by golden files, offline verification in a fresh
process with no database, rejection of tampered receipts and texts, signing keys in the
store (wrapped under the KEK, rotated, audited, published)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from keys.audit import list_audit
from keys.errors import InvalidTransition, UnwrapError
from keys.kek import Kek, Keyring
from keys.kek_rotation import rotate_kek
from ledger.sealed import KEK_DEPENDANTS
from ledger.keyset import trusted_keys
from ledger.log.note import NoteSigner
from ledger.receipts import ReceiptInvalid, Signer, b64url, key_id_of, public_keys, signed_bytes, verify_receipt
from ledger.signing import (active_signer, create_signing_key, list_signing_keys, public_keyset,
                            rotate_signing_key)

DATA = Path(__file__).resolve().parents[1] / "data"
REPO = Path(__file__).resolve().parents[2]
GOLDEN_SEED = hashlib.sha256(b"hallmark golden receipt key (test only)").digest()
GOLDEN_TEXT = "Provenance you can prove: a golden receipt. ✓ — ünïcödé\n"
ACTOR = "test"


def _golden_signer() -> Signer:
    private = Ed25519PrivateKey.from_private_bytes(GOLDEN_SEED)
    raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return Signer(kid=key_id_of(raw), private_key=private)


def _golden_statement() -> dict:
    return {
        "type": "hallmark.receipt", "version": 1,
        "generation_id": "0123456789abcdef0123456789abcdef", "tenant_id": "ten_0123456789abcdef",
        "tenant": "acme",
        "key": {"key_id": "key_0123456789abcdef", "version": 3, "fingerprint": "fp_00112233445566778899",
                "state": "active"},
        "spec": {"algorithm": "dual_key_gumbel", "context_width": 4, "alpha": 0.1, "dedup": "single_turn",
                 "dedup_history": 8192, "prf": "philox4x32-10-v1", "keyed_coin": False},
        "model": "hallmark-tiny-dsv32", "engine": "local",
        "created_at": "2026-12-02T18:45:01.123456Z", "finished_at": "2026-12-02T18:45:02.654321Z",
        "finish_reason": "stop",
        "output_sha256": hashlib.sha256(GOLDEN_TEXT.encode()).hexdigest(),
        "token_ids_sha256": hashlib.sha256(b"".join(t.to_bytes(4, "big") for t in (17, 4242, 90001))).hexdigest(),
        "output_tokens": 3, "watermarked_tokens": 2, "watermarked_share": 0.666667,
        "unwatermarked_reason": "dedup",
        "ledger": {"seq": 42, "entry_hash": "ab" * 32},
    }


def _golden_keyset() -> dict:
    signer = _golden_signer()
    raw = signer.private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return {"keys": [{"kid": signer.kid, "alg": "Ed25519", "public_key": b64url(raw), "state": "active",
                      "created_at": "2026-12-02T00:00:00.000000Z", "retired_at": None}]}


def test_golden_files_pin_the_encoding():
    statement = _golden_statement()
    receipt = _golden_signer().sign(statement)
    if os.environ.get("HALLMARK_REGENERATE_GOLDEN") == "1":  # pragma: no cover - deliberate
        (DATA / "receipt-v1.json").write_text(json.dumps(receipt, indent=2, ensure_ascii=False) + "\n")
        (DATA / "receipt-v1-keys.json").write_text(json.dumps(_golden_keyset(), indent=2) + "\n")
        (DATA / "receipt-v1.txt").write_text(GOLDEN_TEXT)
        (DATA / "receipt-v1.signed-bytes").write_bytes(signed_bytes(statement))
    golden = json.loads((DATA / "receipt-v1.json").read_text())
    assert golden == receipt  # same statement, same (deterministic Ed25519) signature
    assert (DATA / "receipt-v1.signed-bytes").read_bytes() == signed_bytes(statement)
    assert signed_bytes(statement).startswith(b'hallmark.receipt/v1\n{"created_at":"2026-12-02T18:45:01.123456Z",')
    assert "ünïcödé".encode() not in signed_bytes(statement)  # the text itself is never in a receipt
    keys = public_keys(json.loads((DATA / "receipt-v1-keys.json").read_text()))
    assert verify_receipt(golden, keys, text=(DATA / "receipt-v1.txt").read_text()) == statement


def _tampered(field_path: tuple[str, ...], value) -> dict:
    receipt = json.loads((DATA / "receipt-v1.json").read_text())
    target = receipt
    for part in field_path[:-1]:
        target = target[part]
    target[field_path[-1]] = value
    return receipt


@pytest.mark.parametrize("path, value, reason", [
    (("statement", "tenant"), "globex", "bad signature"),
    (("statement", "output_tokens"), 4, "bad signature"),
    (("statement", "watermarked_share"), 1.0, "bad signature"),
    (("statement", "ledger", "seq"), 41, "bad signature"),
    (("statement", "key", "state"), "revoked", "bad signature"),
    (("signature", "kid"), "sk_0000000000000000", "unknown signing key"),
    (("signature", "sig"), "AAAA", "bad signature"),
    (("signature", "alg"), "HS256", "unsupported signature algorithm"),
    (("statement", "type"), "hallmark.detection_report", "not a 'hallmark.receipt'"),
])
def test_tampered_receipts_are_rejected(path, value, reason):
    keys = public_keys(json.loads((DATA / "receipt-v1-keys.json").read_text()))
    with pytest.raises(ReceiptInvalid, match=reason):
        verify_receipt(_tampered(path, value), keys)


def test_a_keyset_entry_whose_kid_does_not_match_its_key_is_ignored():
    keyset = json.loads((DATA / "receipt-v1-keys.json").read_text())
    other = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    keyset["keys"][0]["public_key"] = b64url(other)  # an attacker's key under the genuine kid
    with pytest.raises(ReceiptInvalid, match="unknown signing key"):
        verify_receipt(json.loads((DATA / "receipt-v1.json").read_text()), public_keys(keyset))


def _fresh_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`hallmark` in a fresh process with no database and no KEK configured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HALLMARK_")}
    env["HALLMARK_DATABASE_URL"] = "postgresql+psycopg://nobody@127.0.0.1:1/none"  # unreachable on purpose
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "service.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_key_set_from_before_the_log_is_not_trusted_by_the_cli(tmp_path):
    """The v1 golden key set names its key but no log holds it: `receipt verify` refuses it
    (one line), in a fresh process with no database, and asks for a pinned log key first."""
    keys, receipt = DATA / "receipt-v1-keys.json", DATA / "receipt-v1.json"
    unpinned = _fresh_cli("receipt", "verify", str(receipt), "--keys", str(keys), cwd=tmp_path)
    assert unpinned.returncode == 1 and "--trust-log-key" in unpinned.stderr and unpinned.stdout == ""
    vkey = tmp_path / "log.vkey"
    vkey.write_text(NoteSigner("example.com/log", Ed25519PrivateKey.generate()).verifier.vkey + "\n")
    refused = _fresh_cli("receipt", "verify", str(receipt), "--keys", str(keys), "--trust-log-key", str(vkey),
                         cwd=tmp_path)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 1 and len(lines) == 1 and "no transparency-log checkpoint" in lines[0]


def test_signing_keys_in_the_store(store, kek):
    with store.transaction() as session:
        first = create_signing_key(session, store.keyring, actor=ACTOR)
        with pytest.raises(InvalidTransition, match="rotate"):
            create_signing_key(session, store.keyring, actor=ACTOR)
    with store.transaction() as session:
        new, retired = rotate_signing_key(session, store.keyring, actor=ACTOR)
    assert retired.kid == first.kid and retired.state == "retired" and new.state == "active"
    with store.transaction(write=False) as session:
        signer = active_signer(session, store.keyring)
        published = public_keyset(session)
        actions = [e.action for e in list_audit(session)]
        infos = list_signing_keys(session)
    assert signer.kid == new.kid and "private" not in repr(signer).lower()
    assert {k["kid"]: k["state"] for k in published["keys"]} == {first.kid: "retired", new.kid: "active"}
    assert all("kek_id" not in k for k in published["keys"])
    assert actions == ["log_key.created", "signing_key.created", "signing_key.rotated"]
    assert {i.kek_id for i in infos} == {kek.id} and all(i.logged and i.consistent for i in infos)
    statement = {"type": "hallmark.report", "version": 1, "created_at": published["keys"][1]["not_before"]}
    from ledger.log.note import Verifier

    trusted = trusted_keys(published, Verifier.parse(published["log"]["vkey"]))
    assert set(trusted) == {first.kid, new.kid}
    from ledger.receipts import verify_signed

    assert verify_signed(signer.sign(statement), trusted) == statement
    # KEK rotation re-wraps signing keys too; the old KEK opens nothing.
    new_kek = Kek.generate()
    with store.transaction() as session:
        rotate_kek(session, current=store.keyring, new=new_kek, actor=ACTOR, dependants=KEK_DEPENDANTS)
    with store.transaction(write=False) as session:
        assert active_signer(session, Keyring([new_kek])).kid == new.kid
    # A wrapped private key moved to another row does not open.
    from keys.models import SigningKey

    with store.transaction() as session:
        rows = {row.id: row for row in session.query(SigningKey)}
        rows[new.kid].wrapped_private = rows[first.kid].wrapped_private
        rows[new.kid].nonce = rows[first.kid].nonce
    with store.transaction(write=False) as session:
        with pytest.raises(UnwrapError):
            active_signer(session, Keyring([new_kek]))


def test_signing_keys_cli(cli):
    created = cli.ok("signing-keys", "create", "--json").json()
    rotated = cli.ok("signing-keys", "rotate", "--json").json()
    assert rotated["retired"]["kid"] == created["kid"]
    listed = cli.ok("signing-keys", "list", "--json").json()
    assert [k["state"] for k in listed] == ["retired", "active"]
    assert all(k["logged"] and k["consistent"] for k in listed) and listed[0]["not_after"] is not None
    exported = json.loads(cli.ok("signing-keys", "export-public").stdout)
    assert {k["kid"] for k in exported["keys"]} == {created["kid"], rotated["new"]["kid"]}
    assert "already active" in cli.fails("signing-keys", "create").stderr
    revoked = cli.ok("signing-keys", "revoke", created["kid"], "--reason", "leaked", "--json").json()
    assert revoked["revoked"]["state"] == "revoked" and revoked["new"] is None  # it was retired already
    assert "already revoked" in cli.fails("signing-keys", "revoke", created["kid"], "--reason", "again").stderr
    assert "reason" in cli.fails("signing-keys", "revoke", rotated["new"]["kid"], "--reason", " ").stderr
    audit = [e["action"] for e in cli.ok("audit", "list", "--json").json()]
    assert "signing_key.revoked" in audit and "log_key.created" in audit
