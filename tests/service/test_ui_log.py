"""verify.js checks receipts against the transparency log in a real browser (Chromium): a
receipt verifies with its entry's inclusion proof; a broken proof, a signing key the log does
not hold, a statement dated after its key's retirement, and a key set signed by another log
key than the one this browser pinned are each refused with the reason."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from keys import clock
from ledger.chain import timestamp
from ledger.receipts import Signer, key_id_of
from tests.service.test_ui import _open, browser, generate, server  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow

SCRIPT = """const [raw, text, done] = arguments;
    const doc = HallmarkVerify.parseRaw(raw);
    HallmarkVerify.verifySigned(doc, {text: text === null ? undefined : text, expectedType: "hallmark.receipt"})
      .then(r => done(r), e => done({ok: "error", message: String(e)}));"""


def _check(browser, document, text=None):  # noqa: F811 - the fixture's value
    return browser.execute_async_script(SCRIPT, json.dumps(document, separators=(",", ":"), ensure_ascii=False), text)


def test_receipts_are_checked_against_the_log_in_the_browser(server, browser):  # noqa: F811
    from keys.db import open_store
    from ledger.signing import active_signer, rotate_signing_key

    out = generate(server, seed=31, max_tokens=16)
    receipt = out["receipt"]
    _open(browser, server, "acme")
    browser.execute_script("localStorage.clear()")
    browser.set_script_timeout(30)
    ok = _check(browser, receipt, out["text"])
    assert ok["ok"] is True and "entry in the log" in ok["message"]

    broken = json.loads(json.dumps(receipt))
    broken["log"]["inclusion_proof"] = ["A" * 43 + "="] + broken["log"]["inclusion_proof"]
    assert "not in the log" in _check(browser, broken)["message"] or "proof" in _check(browser, broken)["message"]

    forger = Ed25519PrivateKey.generate()
    kid = key_id_of(forger.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
    forged = Signer(kid=kid, private_key=forger).sign(receipt["statement"])
    forged["log"] = receipt["log"]
    refused = _check(browser, forged)
    assert refused["ok"] is False and "does not contain" in refused["message"]

    # A statement dated after its key was retired.
    store = open_store(server.store_settings, require_kek=True)
    try:
        with store.transaction(write=False) as session:
            old = active_signer(session, store.keyring)
        with store.transaction() as session:
            rotate_signing_key(session, store.keyring, actor="test")
    finally:
        store.close()
    late = dict(receipt["statement"], finished_at=timestamp(clock.utcnow() + timedelta(hours=1)))
    signed_late = old.sign(late)
    signed_late["log"] = receipt["log"]
    # The gateway serves its key set from a cache (HALLMARK_KEY_CACHE_SECONDS): wait until the
    # key set it serves shows the retirement (the event, not a fixed delay; issue 34).
    deadline = time.monotonic() + 60
    while not any(k["kid"] == old.kid and k["state"] == "retired" for k in httpx.get(
            f"{server.url}/.well-known/hallmark-keys.json", timeout=30).json()["keys"]):
        assert time.monotonic() < deadline, "the key set never showed the retired signing key"
        time.sleep(0.1)
    _open(browser, server, "acme")  # a fresh page: the key set with the retirement
    result = _check(browser, signed_late)
    assert result["ok"] is False and "after it was retired" in result["message"]
    assert _check(browser, receipt, out["text"])["ok"] is True  # its own receipts stay good

    # Another log key than the one this browser pinned on first use: refused.
    browser.execute_script("localStorage.setItem('hallmark.logKey', arguments[0])",
                           "example.com/log+00000000+AQ" + "A" * 42 + "=")
    _open(browser, server, "acme")
    pinned = _check(browser, receipt, out["text"])
    assert pinned["ok"] is False and "pinned" in pinned["message"]
    browser.execute_script("localStorage.clear()")


def test_the_page_does_not_vouch_for_a_composite_signature_it_cannot_check(server, browser):  # noqa: F811
    """Issue 32 item 5: WebCrypto has no ML-DSA, so a receipt signed Ed25519 + ML-DSA-44 is
    "cannot check here" (pointing to `hallmark receipt verify`), never a half-checked "ok"; the
    same receipt stripped of its ML-DSA-44 signature and relabelled Ed25519 is refused, since
    the key's logged algorithm requires both."""
    from keys.db import open_store
    from ledger.signing import active_signer, rotate_signing_key
    from ledger.sigalg import COMPOSITE

    out = generate(server, seed=32, max_tokens=16)
    store = open_store(server.store_settings, require_kek=True)
    try:
        with store.transaction() as session:
            new, _ = rotate_signing_key(session, store.keyring, actor="test", alg=COMPOSITE)
            signer = active_signer(session, store.keyring)
    finally:
        store.close()
    deadline = time.monotonic() + 60  # the key set is served from a cache: wait for the new key
    while not any(k["kid"] == new.kid for k in httpx.get(f"{server.url}/.well-known/hallmark-keys.json",
                                                          timeout=30).json()["keys"]):
        assert time.monotonic() < deadline, "the key set never showed the composite signing key"
        time.sleep(0.1)
    signed = signer.sign(dict(out["receipt"]["statement"], finished_at=timestamp(clock.utcnow())))
    signed["log"] = out["receipt"]["log"]
    _open(browser, server, "acme")
    browser.execute_script("localStorage.clear()")
    browser.set_script_timeout(30)
    unchecked = _check(browser, signed)
    assert unchecked["ok"] is None and "cannot check ML-DSA-44" in unchecked["message"]
    assert "hallmark receipt verify" in unchecked["message"]
    stripped = json.loads(json.dumps(signed))
    del stripped["signature"]["ml_dsa_44_sig"]
    stripped["signature"]["alg"] = "Ed25519"
    refused = _check(browser, stripped)
    assert refused["ok"] is False and "requires both" in refused["message"], refused
