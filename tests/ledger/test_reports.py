"""Signed detection reports (format v2, ledger.reports): the encoding pinned by golden files,
verification of the signature, of the format's own consistency and of the text or token ids
a report is about, and ``hallmark report verify`` offline in a fresh process."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ledger.chain import hash_token_ids
from ledger.receipts import ReceiptInvalid, Signer, b64url, key_id_of, public_keys, signed_bytes
from ledger.reports import ReportInvalid, detector_identity, verify_report
from tests.ledger.test_receipts import DATA, _fresh_cli, _golden_signer

GOLDEN_TEXT = "A text checked for a watermark: the golden report. ✓ — ünïcödé\n"
GOLDEN_IDS = [17, 4242, 90001, 5, 5, 31337]
SETTINGS = {"threshold": 1e-06, "statistic": "auto", "test": "auto", "spans": True, "span_min_length": 32,
            "normalize": True, "ledger": {"kgram_length": 8, "shared_tokens_level": 0.001, "matches_tested": 5}}
KEYS = DATA / "receipt-v1-keys.json"  # the golden signing key signs the golden report too


def golden_statement() -> dict:
    """A fresh copy each call (tests change their copy)."""
    return json.loads(json.dumps({
        "type": "hallmark.detection_report", "version": 2,
        "created_at": "2026-12-02T18:45:03.250000Z",
        "subject": {"input": "text", "text_sha256": hashlib.sha256(GOLDEN_TEXT.encode()).hexdigest(),
                    "token_ids_sha256": hash_token_ids(GOLDEN_IDS), "tokens": len(GOLDEN_IDS)},
        "detector": detector_identity("hallmark-detector/2", SETTINGS),
        "settings": SETTINGS,
        "scope": {"keys_of": "tenant", "tenant": "acme", "tenants": 1, "keys": 2},
        "verdict": "watermarked",
        "verdict_text": "watermarked: passes the threshold 1e-06 under one of the 2 keys of tenant acme",
        "basis": ["watermark"],
        "result": {"watermarked": True, "p_value": 3.1e-09, "log10_p_value": -8.508638, "threshold": 1e-06,
                   "scored_tokens": 5, "total_tokens": 6, "keys_tested": 2, "basis": ["watermark"],
                   "key": {"tenant": "acme", "key_id": "key_0123456789abcdef", "version": 2, "state": "active",
                           "fingerprint": "a1b2c3", "algorithm": "dual_key_gumbel"},
                   "spans": [], "ledger_matches": [], "kgram_matches": [],
                   "correction": "weighted Bonferroni: max 0.15, weighted 0.45, trgof 0.15, spans 0.25",
                   "normalization": {"changed": False, "changes": {}, "scored": "as_sent"}},
    }))


def _keys():
    return public_keys(json.loads(KEYS.read_text()))


def _signed(statement: dict) -> dict:
    return _golden_signer().sign(statement)


def test_golden_files_pin_the_report_encoding():
    statement = golden_statement()
    report = _signed(statement)
    if os.environ.get("HALLMARK_REGENERATE_GOLDEN") == "1":  # pragma: no cover - deliberate
        (DATA / "report-v2.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        (DATA / "report-v2.txt").write_text(GOLDEN_TEXT)
        (DATA / "report-v2.token-ids.json").write_text(json.dumps(GOLDEN_IDS) + "\n")
        (DATA / "report-v2.signed-bytes").write_bytes(signed_bytes(statement))
    golden = json.loads((DATA / "report-v2.json").read_text())
    assert golden == report
    assert (DATA / "report-v2.signed-bytes").read_bytes() == signed_bytes(statement)
    assert signed_bytes(statement).startswith(b'hallmark.detection_report/v2\n{"basis":["watermark"],')
    check = verify_report(golden, _keys(), text=(DATA / "report-v2.txt").read_text(), token_ids=GOLDEN_IDS)
    assert check.statement == statement and check.version == 2 and check.text_matches and check.token_ids_match


@pytest.mark.parametrize("path, value, reason", [
    (("statement", "verdict"), "not_watermarked", "bad signature"),
    (("statement", "scope", "keys"), 1, "bad signature"),
    (("statement", "scope", "tenant"), "globex", "bad signature"),
    (("statement", "settings", "threshold"), 0.5, "bad signature"),
    (("statement", "result", "key", "tenant"), "globex", "bad signature"),
    (("statement", "subject", "text_sha256"), "0" * 64, "bad signature"),
    (("statement", "created_at"), "2027-01-01T00:00:00.000000Z", "bad signature"),
    (("signature", "kid"), "sk_0000000000000000", "unknown signing key"),
    (("statement", "type"), "hallmark.receipt", "not a 'hallmark.detection_report'"),
])
def test_a_tampered_report_is_rejected(path, value, reason):
    report = json.loads((DATA / "report-v2.json").read_text())
    target = report
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    with pytest.raises(ReceiptInvalid, match=reason):
        verify_report(report, _keys())


def test_a_report_about_another_text_or_other_tokens_is_rejected():
    golden = json.loads((DATA / "report-v2.json").read_text())
    with pytest.raises(ReportInvalid, match="the text does not match the report"):
        verify_report(golden, _keys(), text=GOLDEN_TEXT.replace("golden", "gilded"))
    with pytest.raises(ReportInvalid, match="the token ids do not match"):
        verify_report(golden, _keys(), token_ids=GOLDEN_IDS[:-1])
    about_ids = golden_statement()
    about_ids["subject"].update(input="token_ids", text_sha256=None)
    with pytest.raises(ReportInvalid, match="about token ids, not a text"):
        verify_report(_signed(about_ids), _keys(), text=GOLDEN_TEXT)


def test_a_report_signed_by_another_key_is_rejected():
    other = Ed25519PrivateKey.generate()
    raw = other.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    forged = Signer(kid=key_id_of(raw), private_key=other).sign(golden_statement())
    with pytest.raises(ReceiptInvalid, match="unknown signing key"):
        verify_report(forged, _keys())
    # Under the genuine kid, the other key's signature does not verify.
    forged["signature"]["kid"] = _golden_signer().kid
    with pytest.raises(ReceiptInvalid, match="bad signature"):
        verify_report(forged, _keys())
    # A key set entry whose kid is not the hash of its public key is not a key at all.
    keyset = json.loads(KEYS.read_text())
    keyset["keys"][0]["public_key"] = b64url(raw)
    with pytest.raises(ReceiptInvalid, match="unknown signing key"):
        verify_report(Signer(kid=_golden_signer().kid, private_key=other).sign(golden_statement()),
                      public_keys(keyset))


def golden_variant(**changes) -> dict:
    """The golden statement with ``changes`` (``a__b=v`` sets statement['a']['b'] = v)."""
    statement = golden_statement()
    for dotted, value in changes.items():
        target = statement
        *parents, last = dotted.split("__")
        for part in parents:
            target = target[part]
        target[last] = value
    return statement


@pytest.mark.parametrize("statement, reason", [
    # A signer that breaks the format is caught too: a lenient threshold never signs "watermarked".
    (golden_variant(settings__threshold=0.999999), "the detector id is not the hash"),
    (dict(golden_variant(settings__threshold=0.999999),
          detector=detector_identity("hallmark-detector/2", {**SETTINGS, "threshold": 0.999999})),
     "'watermarked' verdict at threshold 0.999999"),
    (golden_variant(verdict="probably"), "unknown verdict"),
    (golden_variant(basis=[]), "basis does not match its verdict"),
    (golden_variant(scope__keys_of="someone"), "whose keys were tested"),
    (golden_variant(version=3), "unsupported report version 3"),
    ({k: v for k, v in golden_statement().items() if k != "scope"}, "no 'scope' object"),
])
def test_a_signed_report_that_breaks_the_format_is_rejected(statement, reason):
    with pytest.raises(ReportInvalid, match=reason):
        verify_report(_signed(statement), _keys())


def test_a_version_1_report_verifies_and_says_so():
    v1 = {"type": "hallmark.detection_report", "version": 1, "verdict": "watermarked",
          "text_sha256": hashlib.sha256(GOLDEN_TEXT.encode()).hexdigest(), "token_ids_sha256": hash_token_ids([1]),
          "detector_version": "hallmark-detector/1", "created_at": "2026-12-01T00:00:00.000000Z"}
    check = verify_report(_signed(v1), _keys(), text=GOLDEN_TEXT)
    assert check.version == 1 and check.text_matches


def test_report_verify_offline_in_a_fresh_process(tmp_path):
    from datetime import datetime, timezone

    from tests.ledger.logged_keyset import logged_keyset

    report, text = DATA / "report-v2.json", DATA / "report-v2.txt"
    # The golden signer, as a log holds it (trust comes from the pinned log, ledger.keyset).
    keyset, vkey = logged_keyset(_golden_signer(), not_before=datetime(2026, 12, 1, tzinfo=timezone.utc))
    KEYS = tmp_path / "logged-keys.json"  # noqa: N806 - shadows the module's unlogged key set on purpose
    KEYS.write_text(json.dumps(keyset))
    (tmp_path / "log.vkey").write_text(vkey + "\n")
    pin = ("--trust-log-key", str(tmp_path / "log.vkey"))
    unlogged = _fresh_cli("report", "verify", str(report), "--keys", str(DATA / "receipt-v1-keys.json"), *pin,
                          cwd=tmp_path)
    assert unlogged.returncode == 1 and "no transparency-log checkpoint" in unlogged.stderr
    ok = _fresh_cli("report", "verify", str(report), "--text-file", str(text), "--token-ids-file",
                    str(DATA / "report-v2.token-ids.json"), "--keys", str(KEYS), *pin, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok: detection report of 2026-12-02T18:45:03.250000Z: watermarked: passes the "
                                "threshold 1e-06 under one of the 2 keys of tenant acme; basis watermark; "
                                "detector hallmark-detector/2+"), ok.stdout
    assert "the text matches; the token ids matches" not in ok.stdout and ok.stdout.rstrip().endswith(
        "the text matches; the token ids match")
    # A whole /v1/detect response works too, and --json says what was checked.
    response = tmp_path / "response.json"
    response.write_text(json.dumps({"watermarked": True, "report": json.loads(report.read_text())}))
    as_json = _fresh_cli("report", "verify", str(response), "--text", str(text), "--keys", str(KEYS), "--json",
                         *pin, cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    out = json.loads(as_json.stdout)
    assert out["valid"] and out["text_matches"] and out["token_ids_match"] is None and out["version"] == 2
    assert out["statement"]["scope"] == {"keys_of": "tenant", "tenant": "acme", "tenants": 1, "keys": 2}

    other_text = tmp_path / "other.txt"
    other_text.write_text(GOLDEN_TEXT + " ")
    tampered = tmp_path / "tampered.json"
    document = json.loads(report.read_text())
    document["statement"]["verdict"] = "not_watermarked"
    tampered.write_text(json.dumps(document))
    other = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    other_keys = tmp_path / "other-keys.json"
    other_keys.write_text(json.dumps({"keys": [{"kid": key_id_of(other), "alg": "Ed25519",
                                                "public_key": b64url(other), "state": "active"}]}))
    other_keys.write_text(json.dumps({**keyset, "keys": json.loads(other_keys.read_text())["keys"]}))
    for args, reason in [
        ((str(report), "--text-file", str(other_text), "--keys", str(KEYS), *pin), "the text does not match the report"),
        ((str(tampered), "--keys", str(KEYS), *pin), "bad signature"),
        ((str(report), "--keys", str(other_keys), *pin), "unknown signing key"),
        ((str(DATA / "receipt-v1.json"), "--keys", str(KEYS), *pin), "holds a generation receipt, not a detection report"),
        ((str(tmp_path / "missing.json"), "--keys", str(KEYS), *pin), "does not exist"),
        ((str(report), *pin), "give the public keys"),
        ((str(report), "--keys", str(KEYS)), "--trust-log-key"),
    ]:
        refused = _fresh_cli("report", "verify", *args, cwd=tmp_path)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 1 and refused.stdout == "" and len(lines) == 1, refused.stderr
        assert lines[0].startswith("error: ") and reason in lines[0], lines[0]
