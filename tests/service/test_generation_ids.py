"""Issue 30 items 1 and 2 over real HTTP with the bundled model: a text the ledger cites as an
exact copy is scored on the generation's own token ids (proven by the recorded
``token_ids_sha256``), under its recorded salt alone, and says so (``scored_as``); k-gram
matches to other generations never add their salts (one salt per key, never a union)."""

from __future__ import annotations

import httpx
import pytest

from keys.material import detection_keys
from ledger import kgrams
from ledger.entries import record_generation
from ledger.chain import hash_token_ids
from service import detection
from service.auth import authenticate
from service.schemas import DetectBody
from tests.service import gateway as gw


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    gateway = gw.start(tmp_path_factory.mktemp("generation-ids"), secrets=gw.FIXED_SECRETS, modes={"acme": "diverse"})
    try:
        tokenizer = gateway.app.state.services.engine.tokenizer()
        # A generation the tokenizer re-encodes differently (about half of the model's texts).
        for seed in range(12):
            out = _post(gateway, "/v1/generate", {"prompt": "The function returns", "max_tokens": 100,
                                                  "seed": seed, "temperature": 1.0})
            if tokenizer.encode(out["text"], add_special_tokens=False) != out["token_ids"]:
                break
        else:
            pytest.fail("no generation of 12 re-tokenised differently")
        yield gateway, out
    finally:
        gateway.stop()


def _post(gateway, path, body):
    r = httpx.post(gateway.url + path, headers={"Authorization": f"Bearer {gateway.tokens['acme']}"}, json=body,
                   timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _detect(gateway, **body):
    """The core's full result (exact numbers; no access tier, no probe guard)."""
    services = gateway.app.state.services
    return detection.detect(services, authenticate(services, f"Bearer {gateway.tokens['acme']}"), DetectBody(**body))


def test_an_exact_copy_is_scored_on_the_generations_own_ids(served):
    gateway, out = served
    assert _post(gateway, "/v1/detect", {"text": out["text"]})["scored_as"] == "generation_ids"  # the tenant sees it
    by_text = _detect(gateway, text=out["text"])
    by_ids = _detect(gateway, token_ids=out["token_ids"])
    assert by_text["scored_as"] == "generation_ids" and by_ids["scored_as"] == "token_ids"
    # The very ids the model wrote (the report signs their hash), so the same numbers.
    assert by_text["report"]["statement"]["subject"]["token_ids_sha256"] == hash_token_ids(out["token_ids"])
    assert by_text["log10_p_value"] == by_ids["log10_p_value"]
    assert by_text["key"]["salt"] == out["watermark"]["salt"] and by_text["keys_tested"] == 1
    assert by_text["total_tokens"] == len(out["token_ids"])
    # Spans point into the text as sent.
    for span in by_text["spans"]:
        assert 0 <= span["char_start"] < span["char_end"] <= len(out["text"])


def test_a_text_that_is_not_an_exact_copy_is_scored_as_text(served):
    gateway, out = served
    edited = out["text"].replace(" ", "  ", 1)
    result = _detect(gateway, text=edited)
    assert result["scored_as"] == "text" and result["ledger_matches"] == []


def test_kgram_matches_to_other_generations_add_no_salt(served):
    gateway, out = served
    services = gateway.app.state.services
    salt = out["watermark"]["salt"]
    # Another generation of the same key, under another salt, sharing the first 60 tokens.
    with services.store.transaction() as session:
        key = next(k for k in detection_keys(session, services.store.keyring, tenant="acme")
                   if k.key_id == out["watermark"]["key_id"])
        tokens = list(out["token_ids"][:60]) + [7] * 20
        record_generation(session, tenant_id=key.tenant_id, key_id=key.key_id, key_version=key.version,
                          engine="local", model="tiny", spec=key.spec, prompt_tokens=3, watermarked_tokens=80,
                          unwatermarked_reason=None, output_text="another text", token_ids=tokens,
                          details={"salt": (salt + 3) % 16},
                          kgram_set=kgrams.kgram_set(key.key_id, key.material.secret, tokens))
    by_text = _detect(gateway, text=out["text"])
    by_ids = _detect(gateway, token_ids=out["token_ids"])
    for result in (by_text, by_ids):
        assert len(result["kgram_matches"]) == 2, result["kgram_matches"]  # both still cited
        # One salt: the exact copy's (by text), the best k-gram match's (by token ids).
        assert result["keys_tested"] == 1 and result["key"]["salt"] == salt
    assert by_text["scored_as"] == "generation_ids"
