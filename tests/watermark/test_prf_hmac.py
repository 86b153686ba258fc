"""The 256-bit PRFs: golden vectors (vLLM's own reference for hmac-sha256-v1), HMAC midstates
against hashlib, the compiled passes against the references, and 256-bit key derivation."""

import hashlib
import hmac
import json
import os
from pathlib import Path

import numpy as np
import pytest

from watermark import prf
from watermark.prf import hmac_compiled, hmac_philox, hmac_sha256, philox, sha256

DATA = Path(__file__).resolve().parents[1] / "data"


def _golden(name):
    return json.loads((DATA / name).read_text())


def test_versions_names_and_key_sizes():
    assert prf.lookup("hmac_sha256") is prf.lookup("hmac-sha256-v1")
    assert prf.lookup("hmac-sha256-philox-v1").key_bits == 256
    assert prf.lookup("philox").key_bits == 64
    assert prf.key_bits("philox") == 64 and prf.key_bits("hmac_sha256") == 256
    assert prf.DEFAULT == prf.PHILOX_V1  # a spec that names no prf is what it always was
    assert prf.NEW_KEY == "hmac-sha256-philox-v1"
    with pytest.raises(ValueError, match="unknown prf"):
        prf.canonical_name("hmac")


@pytest.mark.parametrize("length", [0, 1, 44, 55, 56, 63, 64, 74, 119, 120, 250])
def test_midstates_give_hashlib_hmac(length):
    key, message = os.urandom(32), os.urandom(length)
    assert sha256.hmac_from_midstates(sha256.midstates(key), message) == hmac.digest(key, message, "sha256")


def test_vllm_hmac_sha256_golden_bit_exact():
    golden = _golden("hmac-sha256-v1.json")
    assert golden["prf"] == hmac_sha256.VERSION
    for case in golden["cases"]:
        key, tokens = int(case["key"]), np.array(case["tokens"])
        contexts = np.array([case["context"]] * len(tokens))
        expected = np.array(case["uniforms"], dtype=np.float32)
        reference = philox.uniforms_from_words_numpy(hmac_sha256.words_reference(key, contexts, tokens))
        assert np.array_equal(reference, expected), case["key"]
        assert np.array_equal(prf.lookup("hmac_sha256").uniforms(key, contexts, tokens), expected)
        many = prf.lookup("hmac_sha256").uniforms_many([key, key], contexts, tokens)
        assert np.array_equal(many[1], expected)


def test_hmac_philox_golden_bit_exact():
    golden = _golden("hmac-sha256-philox-v1.json")
    assert golden["prf"] == hmac_philox.VERSION
    for case in golden["cases"]:
        key, tokens = int(case["key"]), np.array(case["tokens"])
        contexts = np.array([case["context"]] * len(tokens))
        philox_key, state = hmac_philox.context_key_state(key, case["context"])
        assert list(state) + [philox_key & 0xFFFFFFFF, philox_key >> 32] == case["digest_words"]
        assert [int(w) for w in hmac_philox.words_reference(key, contexts, tokens)] == case["words"]
        assert [int(w) for w in prf.lookup(hmac_philox.VERSION).words(key, contexts, tokens)] == case["words"]
        expected = np.array(case["uniforms"], dtype=np.float32)
        assert np.array_equal(prf.lookup(hmac_philox.VERSION).uniforms_many([key], contexts, tokens)[0], expected)


def test_domains_are_the_modules():
    assert hmac_philox.DOMAIN == b"hallmark-hmac-philox-v1\0" and len(hmac_philox.DOMAIN) == 24
    assert hmac_philox.DOMAIN_WORDS == tuple(int(w) for w in hmac_compiled._HP_DOMAIN)
    assert hmac_sha256.DOMAIN == b"vllm-watermark-hmac-sha256-v1\0"


def test_context_message_layout():
    # 24-byte domain, big-endian width, big-endian entries mod 2^32 (-1 -> 0xFFFFFFFF)
    message = hmac_philox.context_message([-1, 5])
    assert message == b"hallmark-hmac-philox-v1\0" + bytes.fromhex("00000002" "ffffffff" "00000005")
    digest = hmac.digest((7).to_bytes(32, "big"), message, "sha256")
    assert hmac_philox.context_key_state(7, [-1, 5]) == hmac_philox.key_state_of_digest(digest)
    mids = hmac_philox.midstates(7)
    assert hmac_philox.context_key_state_from_midstates(mids, [-1, 5]) == hmac_philox.key_state_of_digest(digest)


@pytest.mark.parametrize("width", [1, 2, 4, 7, 8, 9, 12, 16])
def test_compiled_passes_equal_references_every_width(width):
    rng = np.random.default_rng(width)
    keys = [int.from_bytes(rng.bytes(32), "big") for _ in range(3)]
    count = 150  # more than one chunk of the compiled pass's lanes (hmac_compiled.LANES)
    contexts = rng.integers(-1, 300_000, (count, width))
    tokens = rng.integers(0, 300_000, count)
    rows = [keys[i % 3] for i in range(count)]
    assert np.array_equal(prf.lookup(hmac_philox.VERSION).words(rows, contexts, tokens),
                          hmac_philox.words_reference(rows, contexts, tokens))
    assert np.array_equal(prf.lookup(hmac_sha256.VERSION).words(rows, contexts, tokens),
                          hmac_sha256.words_reference(rows, contexts, tokens))
    many = prf.lookup(hmac_philox.VERSION).uniforms_many(keys, contexts, tokens)
    for row, key in enumerate(keys):
        assert np.array_equal(many[row], philox.uniforms_from_words_numpy(
            hmac_philox.words_reference(key, contexts, tokens)))


def test_sampler_key_states_equal_reference_mixed_widths():
    keys = [3, 2**256 - 1, 2**200 + 5]
    contexts = [[1, 2], [5, 6, 7, 8, 9, 10, 11, 12, 13], [-1]]
    table = np.zeros((3, 9), dtype=np.int64)
    for row, ctx in enumerate(contexts):
        table[row, :len(ctx)] = ctx
    mids = hmac_compiled.midstates_table(hmac_philox.midstates, keys)
    got_keys, got_states = hmac_compiled.philox_key_states(mids, table, np.array([len(c) for c in contexts]))
    for row, (key, ctx) in enumerate(zip(keys, contexts)):
        philox_key, state = hmac_philox.context_key_state(key, ctx)
        assert int(got_keys[row]) == philox_key and [int(s) for s in got_states[row]] == list(state)


def test_256_bit_keys_checked_and_derived():
    assert prf.check_key(2**256 - 1, 256) == 2**256 - 1
    with pytest.raises(ValueError, match=r"2\*\*256 - 1"):
        prf.check_key(2**256, 256)
    with pytest.raises(ValueError, match=r"2\*\*64 - 1"):
        prf.check_key(2**64)
    with pytest.raises(ValueError):
        hmac_philox.words_reference(2**256, np.zeros((1, 1), np.int64), np.zeros(1, np.int64))
    key = 2**255 + 12345
    expected = int.from_bytes(hashlib.sha256(b"key_a" + key.to_bytes(32, "big")).digest(), "big")
    assert prf.derive_key(key, "key_a", 256) == expected
    assert prf.derive_keys(key, (b"t",), (b"key_a",), bits=256)[0][1] == prf.derive_key(
        prf.derive_key(key, b"t", 256), b"key_a", 256)
    # 64-bit derivation unchanged (vLLM's)
    assert prf.derive_key(0, "key_a") == 15691511769010696906
    assert prf.secret_bytes(5) == (5).to_bytes(8, "big") and len(prf.secret_bytes(2**64)) == 32


def test_words_many_equal_the_references():
    # the many-key screen's input (detector.multikey._scan_wide; its parity with detect():
    # test_hmac_sampling.test_text_under_a_256_bit_key_is_detected_under_it_only)
    rng = np.random.default_rng(5)
    contexts = rng.integers(-1, 50_000, (300, 4))
    tokens = rng.integers(0, 50_000, 300)
    keys = [2**255 + 1, 2**200 + 3]
    words = prf.lookup(hmac_philox.VERSION).words_many(keys, contexts, tokens)
    for row, key in enumerate(keys):
        assert np.array_equal(words[row], hmac_philox.words_reference(key, contexts, tokens).astype(np.uint32))
    vwords = prf.lookup(hmac_sha256.VERSION).words_many(keys, contexts[:40], tokens[:40])
    assert np.array_equal(vwords[1], hmac_sha256.words_reference(keys[1], contexts[:40], tokens[:40]).astype(np.uint32))
