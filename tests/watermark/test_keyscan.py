"""The scan statistics: the compiled CPU pass equals the numpy reference bit for bit, and
the compiled PRF words and dedup equal theirs; numba's cache falls back cleanly."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from detector import screen
from watermark import dedup, jit, keyscan, keyscan_cpu
from watermark.prf import philox, philox_compiled
from watermark import dedup_compiled

@pytest.fixture
def seed(request) -> int:
    """A new seed every run, named in failure messages."""
    import secrets

    value = secrets.randbits(31)
    request.node.user_properties.append(("seed", value))
    return value


EDGE_KEYS = [0, 1, 2**32 - 1, 2**32, 2**32 + 5, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]


def _keys(rng, count):
    keys = rng.integers(0, 2**63, count).astype(np.uint64) * np.uint64(2) + rng.integers(0, 2, count).astype(np.uint64)
    for i in range(min(count, len(EDGE_KEYS))):
        keys[i] = np.uint64(EDGE_KEYS[i])
    return keys


def _texts(rng, count):
    out = [np.array([], dtype=np.int64), np.array([3]), rng.integers(0, 4, 300)]  # empty, one, repetitive
    out += [rng.integers(0, 2**32, int(rng.integers(1, 400))) for _ in range(count - 3)]
    return out


@pytest.mark.parametrize("width", [1, 2, 4, 5, 8, 9, 16])
@pytest.mark.parametrize("form,dual", [("single", False), ("max", True), ("sidak", True)])
def test_the_compiled_pass_equals_the_reference(width, form, dual, seed):
    rng = np.random.default_rng(seed)
    contexts, tokens, offsets = keyscan.pack_positions(_texts(rng, 6), width, skip_padded=width % 2 == 0)
    keys_a = _keys(rng, 11)
    keys_b = _keys(rng, 11)[::-1].copy() if dual else None
    tables = screen.scan_tables(form, float(rng.choice([0.0, 0.1, 0.5, 1.0])), int(np.diff(offsets).max()))
    expected = keyscan.scan_stats_reference(keys_a, keys_b, contexts, tokens, offsets, tables)
    assert np.array_equal(keyscan_cpu.scan_stats(keys_a, keys_b, contexts, tokens, offsets, tables), expected), seed
    assert expected[:, :, keyscan.SUM_A].min() >= 0 and (expected[0] == 0).all()  # the empty text


def test_the_compiled_prf_and_dedup_equal_numpy(seed):
    rng = np.random.default_rng(seed)
    for width in (1, 3, 4, 6, 13):
        tokens = np.concatenate([rng.integers(0, 2**32, 200), rng.integers(0, 3, 200)])
        contexts = dedup.context_matrix(tokens, width)
        keys = _keys(rng, 9)
        words = philox_compiled.words_many(keys, contexts, tokens)
        for k, key in enumerate(keys):
            assert np.array_equal(words[k], philox.words_numpy(int(key), contexts, tokens).astype(np.uint32)), seed
        for skip in (False, True):
            assert np.array_equal(dedup_compiled.first_occurrence_mask(tokens, width, skip),
                                  dedup.first_occurrence_mask(tokens, width, skip)), (seed, width, skip)


def test_pack_positions_scores_what_the_detector_scores():
    from detector.scoring import scored_positions

    rng = np.random.default_rng(1)
    texts = [rng.integers(0, 5, 100), rng.integers(0, 1000, 50), np.array([], dtype=np.int64)]
    for width, scope in ((4, "single_turn"), (3, "all"), (2, "none")):
        contexts, tokens, offsets = keyscan.pack_positions(texts, width, skip_padded=scope == "all")
        for t, text in enumerate(texts):
            scored = scored_positions(text, width, scope)
            part = slice(offsets[t], offsets[t + 1])
            assert np.array_equal(tokens[part], scored.tokens) and np.array_equal(contexts[part], scored.contexts)


@pytest.mark.skipif(not jit.load(), reason="numba is not installed")
def test_compiled_passes_run_where_no_cache_can_be_written(tmp_path):
    """numba's cache falls back from NUMBA_CACHE_DIR to the package's __pycache__ to the user
    cache; where none is writable the passes compile per process instead of failing."""
    repo = Path(keyscan.__file__).resolve().parents[1]
    shutil.copytree(repo / "watermark", tmp_path / "watermark", ignore=shutil.ignore_patterns("__pycache__", "kernels"))
    for folder in (tmp_path / "watermark", tmp_path / "watermark" / "prf"):
        (folder / "__pycache__").write_text("")  # a file where the cache directory would go
    env = {**os.environ, "NUMBA_CACHE_DIR": "/dev/null/numba", "XDG_CACHE_HOME": "/dev/null/cache",
           "HOME": "/dev/null", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(tmp_path)}
    code = ("import numpy as np\n"
            "from watermark import jit, dedup_compiled\n"
            "from watermark.prf import philox_compiled\n"
            "print(jit.cache_writable())\n"
            "w = philox_compiled.words_many(np.array([7], dtype=np.uint64), np.zeros((3, 4), dtype=np.int64), "
            "np.arange(3))\n"
            "print(type(philox_compiled.compiled()['_words_many']._cache).__name__, w.tolist())\n"
            "print(dedup_compiled.first_occurrence_mask(np.array([1, 1, 1, 1, 1, 1]), 2).tolist())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    writable, cache_and_words, mask = done.stdout.strip().splitlines()
    cache, words = cache_and_words.split(" ", 1)
    assert (writable, cache) == ("False", "NullCache")
    expected = philox.words_numpy(7, np.zeros((3, 4), dtype=np.int64), np.arange(3)).tolist()
    assert words == str([expected])
    assert mask == str(dedup.first_occurrence_mask(np.array([1, 1, 1, 1, 1, 1]), 2).tolist())


def test_the_compiled_scored_positions_and_uniforms_equal_numpy(seed):
    rng = np.random.default_rng(seed)
    for width in (1, 4, 7):
        tokens = np.concatenate([rng.integers(0, 2**32, 150), rng.integers(0, 3, 150), np.array([], dtype=np.int64)])
        for skip in (False, True):
            positions, contexts, kept = dedup_compiled.scored(tokens, width, skip)
            expected = np.flatnonzero(dedup.first_occurrence_mask(tokens, width, skip))
            assert np.array_equal(positions, expected)
            assert np.array_equal(contexts, dedup.context_matrix(tokens, width)[expected])
            assert np.array_equal(kept, tokens[expected])
            keys = _keys(rng, 5)
            uniforms = philox_compiled.uniforms_many(keys, contexts, kept)
            for k, key in enumerate(keys):
                reference = philox.uniforms_from_words_numpy(philox.words_numpy(int(key), contexts, kept))
                assert np.array_equal(uniforms[k].view(np.int32), reference.view(np.int32)), seed
    assert dedup_compiled.scored(np.array([], dtype=np.int64), 4)[1].shape == (0, 4)


@pytest.mark.parametrize("width", [1, 3, 4])
def test_the_fused_dual_stream_pass_equals_two_single_passes(width, seed):
    """_float_rs_pair (both streams in one loop) gives each stream's _words + _float_rs values,
    bit for bit, from any start offset, for edge keys (0, 2^32, 2^64 - 1, ...)."""
    fns = keyscan_cpu._compiled()
    if fns is None:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(seed)
    n = 777
    contexts = rng.integers(-1, 2**32, (n, width))
    cols = philox_compiled.context_columns(contexts)
    tokens = rng.integers(0, 2**32, n).astype(np.uint32)
    states = np.empty((4, n), dtype=np.uint32)
    words = np.empty(n, dtype=np.uint32)
    keys = _keys(rng, 12)
    for key_a, key_b in zip(keys, keys[::-1]):
        for start, stop in ((0, n), (5, 300), (n, n)):
            ra = np.full(n, np.nan, dtype=np.float32)
            rb = np.full(n, np.nan, dtype=np.float32)
            fns["_float_rs_pair"](key_a, key_b, cols, width, tokens, start, stop, ra, rb)
            for key, got in ((key_a, ra), (key_b, rb)):
                expected = np.full(n, np.nan, dtype=np.float32)
                philox_compiled.compiled()["_words"](key, cols, width, tokens, start, stop, states, words)
                fns["_float_rs"](words, stop - start, expected)
                assert np.array_equal(got, expected, equal_nan=True), (seed, int(key), start)
