"""The compiled HMAC lane passes (watermark.prf.hmac_compiled) on both of their compression
paths, the SHA extensions and the lane arithmetic (forced), against the hashlib references:
both PRFs at every context width, lane counts around the passes' chunks, vLLM's golden
vectors and the ledger's k-gram digests."""

import hashlib
import hmac
import json
from pathlib import Path

import numpy as np
import pytest

from watermark.prf import hmac_compiled, hmac_philox, hmac_sha256, philox, sha_ni

DATA = Path(__file__).resolve().parents[2] / "data"


@pytest.fixture(params=["sha-ni", "lanes"])
def path(request, monkeypatch):
    """Which compression the lane passes take (the lane arithmetic forced, or the extensions
    where numba's target has them)."""
    if request.param == "sha-ni" and not sha_ni.available():
        pytest.skip("numba's target CPU lacks the SHA extensions")
    monkeypatch.setattr(hmac_compiled, "sha_extensions", lambda: request.param == "sha-ni")
    return request.param


def _keys(rng, n):
    return [2**256 - 1, 1] + [int.from_bytes(rng.bytes(32), "big") for _ in range(n - 2)]


def _inputs(rng, count, width):
    contexts = rng.integers(-(2**40), 2**40, (count, width))
    contexts[: count // 3] = rng.integers(-1, 50_000, (count // 3, width))
    tokens = rng.integers(0, 2**40, count)  # vLLM's PRF hashes all 8 bytes of a token
    tokens[::2] = rng.integers(0, 50_000, len(tokens[::2]))
    return contexts, tokens


@pytest.mark.parametrize("width", [1, 2, 3, 4, 6, 7, 9, 12])
@pytest.mark.parametrize("count", [1, 3, 130])
def test_philox_words_many_equal_hashlib(path, width, count):
    rng = np.random.default_rng(width * 1000 + count)
    keys = _keys(rng, 3)
    contexts, tokens = _inputs(rng, count, width)
    tokens_by_key = [tokens, tokens[::-1].copy(), (tokens + 7) % 2**40]
    mids = hmac_compiled.midstates_table(hmac_philox.midstates, keys)
    words = hmac_compiled.philox_words_many(mids, contexts, tokens_by_key)
    uniforms = hmac_compiled.philox_uniforms_many(mids, contexts, tokens_by_key)
    for row, key in enumerate(keys):
        want = hmac_philox.words_reference(key, contexts, tokens_by_key[row])
        assert np.array_equal(words[row], want.astype(np.uint32)), (path, width, count, row)
        assert np.array_equal(uniforms[row], philox.uniforms_from_words_numpy(want))


@pytest.mark.parametrize("width", [0, 1, 2, 3, 4, 5, 6, 8, 11, 12])
@pytest.mark.parametrize("count", [1, 3, 130])
def test_vllm_words_many_equal_hashlib(path, width, count):
    rng = np.random.default_rng(width * 1000 + count + 1)
    keys = _keys(rng, 3)
    contexts, tokens = _inputs(rng, count, width)
    tokens_by_key = np.stack([tokens, tokens[::-1], rng.integers(-(2**62), 2**62, count)])
    words = hmac_compiled.vllm_words_many(hmac_compiled.midstates_table(hmac_sha256.midstates, keys),
                                          contexts, tokens_by_key)
    for row, key in enumerate(keys):
        want = hmac_sha256.words_reference(key, contexts, tokens_by_key[row])
        assert np.array_equal(words[row], want.astype(np.uint32)), (path, width, count, row)


def test_vllm_golden_vectors(path):
    golden = json.loads((DATA / "hmac-sha256-v1.json").read_text())
    for case in golden["cases"]:
        key, tokens = int(case["key"]), np.array(case["tokens"])
        contexts = np.array([case["context"]] * len(tokens))
        mids = hmac_compiled.midstates_table(hmac_sha256.midstates, [key, key])
        got = hmac_compiled.vllm_uniforms_many(mids, contexts, tokens)
        assert np.array_equal(got[1], np.array(case["uniforms"], dtype=np.float32)), case["key"]


@pytest.mark.parametrize("k", [1, 5, 13, 14, 20])
def test_kgram_digests_equal_hmac(path, k):
    rng = np.random.default_rng(k)
    for size in [k, k + 3, 129 + k]:
        key = rng.bytes(int(rng.choice([1, 17, 32, 64])))
        words = rng.integers(0, 2**32, size, dtype=np.uint64).astype(np.uint32)
        grams = [words[i:i + k].astype(">u4").tobytes() for i in range(size - k + 1)]
        want = [int.from_bytes(hmac.new(key, g, hashlib.sha256).digest()[:8], "big") >> 1 for g in grams]
        mids = np.array(hmac_compiled.sha256.midstates(key), dtype=np.uint32)
        assert hmac_compiled.kgram_digests(mids, words, k, 63).tolist() == want


@pytest.mark.parametrize("width", [1, 2, 4, 7, 9, 12])
def test_per_row_passes_equal_hashlib(path, width):
    # one key a row (the sampler's and PRF.words' passes): one message a compression
    rng = np.random.default_rng(width + 77)
    keys = _keys(rng, 5)
    contexts, tokens = _inputs(rng, 9, width)
    rows = [keys[i % 5] for i in range(9)]
    tables = {prf: hmac_compiled.midstates_table(prf.midstates, rows) for prf in (hmac_philox, hmac_sha256)}
    assert np.array_equal(hmac_compiled.philox_words_rows(tables[hmac_philox], contexts, tokens),
                          hmac_philox.words_reference(rows, contexts, tokens))
    assert np.array_equal(hmac_compiled.vllm_words_rows(tables[hmac_sha256], contexts, tokens),
                          hmac_sha256.words_reference(rows, contexts, tokens))
    widths = rng.integers(1, width + 1, 9)
    philox_keys, states = hmac_compiled.philox_key_states(tables[hmac_philox], contexts, widths)
    for row in range(9):
        philox_key, state = hmac_philox.context_key_state(rows[row], contexts[row, :widths[row]].tolist())
        assert int(philox_keys[row]) == philox_key and [int(s) for s in states[row]] == list(state)


_WITHOUT_SHA = """
from watermark.prf import hmac_compiled, hmac_philox, hmac_sha256, sha_ni
import numpy as np
assert not sha_ni.available() and not hmac_compiled.sha_extensions()
rng = np.random.default_rng(3)
contexts, tokens = rng.integers(-1, 2**40, (131, 4)), rng.integers(0, 2**40, 131)
keys = [2**256 - 1, 12345]
for prf, many in ((hmac_philox, hmac_compiled.philox_words_many), (hmac_sha256, hmac_compiled.vllm_words_many)):
    words = many(hmac_compiled.midstates_table(prf.midstates, keys), contexts, tokens)
    for row, key in enumerate(keys):
        assert np.array_equal(words[row], prf.words_reference(key, contexts, tokens).astype(np.uint32))
    rows = hmac_compiled.midstates_table(prf.midstates, [keys[i % 2] for i in range(5)])
    per_row = (hmac_compiled.philox_words_rows if prf is hmac_philox else hmac_compiled.vllm_words_rows)(
        rows, contexts[:5], tokens[:5])
    assert np.array_equal(per_row, prf.words_reference([keys[i % 2] for i in range(5)], contexts[:5], tokens[:5]))
print("lanes ok")
"""


@pytest.mark.slow
def test_a_cpu_without_the_extensions_compiles_and_takes_the_lanes(tmp_path):
    # numba told the CPU lacks them (its feature string with -sha): the passes still compile
    # (the SHA-NI intrinsic becomes a raise they never reach) and give hashlib's bits.
    import os
    import subprocess
    import sys

    from numba.core.registry import cpu_target

    features = ",".join("-sha" if f == "+sha" else f for f in cpu_target.target_context.codegen()._tm_features.split(","))
    env = dict(os.environ, NUMBA_CPU_FEATURES=features, NUMBA_CACHE_DIR=str(tmp_path))
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", _WITHOUT_SHA], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and "lanes ok" in done.stdout, done.stderr[-2000:]
