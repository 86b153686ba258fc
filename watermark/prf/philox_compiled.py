"""``philox4x32-10-v1`` compiled (numba): the words of one key over many positions, bit for
bit :func:`watermark.prf.philox.words_numpy`, several times faster (one pass the compiler
vectorises over 32-bit lanes, where numpy makes a dozen passes over uint64 arrays).

The plain-Python sources stay importable without numba; :func:`words` compiles them on
first use (:mod:`watermark.jit`) and falls back to numpy where numba is missing.
"""

from __future__ import annotations

import functools

import numpy as np

from watermark import jit
from watermark.prf import philox

_M0 = np.uint64(philox.PHILOX_M0)
_M1 = np.uint64(philox.PHILOX_M1)
_W0 = np.uint32(philox.PHILOX_W0)
_W1 = np.uint32(philox.PHILOX_W1)
_CONTEXT_DOMAIN = np.uint32(philox.CONTEXT_DOMAIN)
_TOKEN_DOMAIN = np.uint32(philox.TOKEN_DOMAIN)
_S32 = np.uint64(32)
_DENOMINATOR = float(philox.UNIFORM_DENOMINATOR)
_LOW32 = np.uint64(0xFFFFFFFF)


def _philox(c0, c1, c2, c3, k0, k1):  # pragma: no cover - compiled
    """Philox-4x32-10 on uint32 words (32x32 -> 64-bit products)."""
    for _ in range(10):
        p0 = np.uint64(c0) * _M0
        p1 = np.uint64(c2) * _M1
        n0 = np.uint32(p1 >> _S32) ^ c1 ^ k0
        c1 = np.uint32(p1 & _LOW32)
        c2 = np.uint32(p0 >> _S32) ^ c3 ^ k1
        c3 = np.uint32(p0 & _LOW32)
        c0 = n0
        k0 = np.uint32(k0 + _W0)
        k1 = np.uint32(k1 + _W1)
    return c0, c1, c2, c3


def _token_word(token, s0, s1, s2, s3, k0, kt):  # pragma: no cover - compiled
    w0, w1, w2, w3 = _philox(token >> np.uint32(2), s0, s1, s2, k0 ^ s3, kt)
    lane = token & np.uint32(3)
    w = w0
    w = w1 if lane == 1 else w
    w = w2 if lane == 2 else w
    return w3 if lane == 3 else w


def _words(key, ctx, width, tokens, start, stop, states, out):  # pragma: no cover - compiled
    """out[:stop - start] = the words of positions start .. stop under ``key`` (uint64):
    ctx uint32 [4 * blocks, P] (:func:`context_columns`), tokens uint32 [P], states uint32
    [4, >= stop - start] (scratch for contexts of more than one block). One block (width
    <= 4) runs as a single loop over the positions."""
    k0 = np.uint32(key & _LOW32)
    k1 = np.uint32(key >> _S32)
    kt = k1 ^ _TOKEN_DOMAIN
    n = stop - start
    blocks = ctx.shape[0] // 4
    w32 = np.uint32(width)
    if blocks == 1:
        for j in range(n):
            p = start + j
            s0, s1, s2, s3 = _philox(_CONTEXT_DOMAIN ^ ctx[0, p], w32 ^ ctx[1, p], ctx[2, p], ctx[3, p], k0, k1)
            out[j] = _token_word(tokens[p], s0, s1, s2, s3, k0, kt)
        return
    for j in range(n):
        p = start + j
        s0, s1, s2, s3 = _philox(_CONTEXT_DOMAIN ^ ctx[0, p], w32 ^ ctx[1, p], ctx[2, p], ctx[3, p], k0, k1)
        states[0, j] = s0
        states[1, j] = s1
        states[2, j] = s2
        states[3, j] = s3
    for b in range(1, blocks):
        ko = k0 ^ np.uint32(4 * b)
        for j in range(n):
            p = start + j
            s0, s1, s2, s3 = _philox(states[0, j] ^ ctx[4 * b, p], states[1, j] ^ ctx[4 * b + 1, p],
                                     states[2, j] ^ ctx[4 * b + 2, p], states[3, j] ^ ctx[4 * b + 3, p], ko, k1)
            states[0, j] = s0
            states[1, j] = s1
            states[2, j] = s2
            states[3, j] = s3
    for j in range(n):
        out[j] = _token_word(tokens[start + j], states[0, j], states[1, j], states[2, j], states[3, j], k0, kt)


def _words_many(keys, ctx, width, tokens, out):  # pragma: no cover - compiled
    """out[k, :] = the words of every position under keys[k]."""
    n = tokens.shape[0]
    states = np.empty((4, n), dtype=np.uint32)
    for k in range(keys.shape[0]):
        _words(keys[k], ctx, width, tokens, 0, n, states, out[k])


def _uniforms_many(keys, ctx, width, tokens, out):  # pragma: no cover - compiled
    """out[k, :] = the float32 uniforms of every position under keys[k]:
    float32(((word >> 8) + 1) / (2^24 + 1)), the division in float64 as numpy does it."""
    n = tokens.shape[0]
    states = np.empty((4, n), dtype=np.uint32)
    words = np.empty(n, dtype=np.uint32)
    for k in range(keys.shape[0]):
        _words(keys[k], ctx, width, tokens, 0, n, states, words)
        for j in range(n):
            out[k, j] = np.float32((np.float64(words[j] >> np.uint32(8)) + 1.0) / _DENOMINATOR)


FUNCTIONS = {"_philox": _philox, "_token_word": _token_word, "_words": _words, "_words_many": _words_many,
             "_uniforms_many": _uniforms_many}
INLINE = ("_philox", "_token_word")


@functools.cache
def compiled():
    """The compiled functions (name -> dispatcher), or None without numba."""
    return jit.compile_all(FUNCTIONS, inline=INLINE)


def context_columns(contexts: np.ndarray) -> np.ndarray:
    """Contexts [P, w] (int64, -1 padded) as the PRF's 32-bit words by column, padded to
    whole blocks of four with the PRF's missing-entry words: uint32 [4 * ceil(w / 4), P]."""
    contexts = np.asarray(contexts, dtype=np.int64)
    count, width = contexts.shape
    blocks = (width + 3) // 4
    out = np.empty((4 * blocks, count), dtype=np.uint32)
    out[:width] = (contexts & 0xFFFFFFFF).astype(np.uint32).T
    for column in range(width, 4 * blocks):
        out[column] = philox.block_padding(column % 4)
    return out


def words_many(keys: np.ndarray, contexts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """uint32 words [K, P] of keys [K] (uint64) over contexts [P, w] and tokens [P]: the
    compiled pass, or numpy's where numba is missing."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64).reshape(-1)
    contexts = np.asarray(contexts, dtype=np.int64)
    tokens = np.asarray(tokens, dtype=np.int64)
    fns = compiled()
    if fns is None:  # pragma: no cover - exercised where numba is missing
        return np.stack([philox.words_numpy(int(k), contexts, tokens).astype(np.uint32) for k in keys]) \
            if len(keys) else np.zeros((0, len(tokens)), dtype=np.uint32)
    out = np.empty((len(keys), len(tokens)), dtype=np.uint32)
    if len(tokens):
        fns["_words_many"](keys, context_columns(contexts), contexts.shape[1],
                           (tokens & 0xFFFFFFFF).astype(np.uint32), out)
    return out


def uniforms_many(keys: np.ndarray, contexts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """float32 uniforms [K, P]: :func:`watermark.prf.philox.uniforms_from_words_numpy` of
    :func:`words_many`, in the same compiled pass."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64).reshape(-1)
    contexts = np.asarray(contexts, dtype=np.int64)
    tokens = np.asarray(tokens, dtype=np.int64)
    fns = compiled()
    if fns is None:  # pragma: no cover - exercised where numba is missing
        return philox.uniforms_from_words_numpy(words_many(keys, contexts, tokens).astype(np.uint64))
    out = np.empty((len(keys), len(tokens)), dtype=np.float32)
    if len(tokens):
        fns["_uniforms_many"](keys, context_columns(contexts), contexts.shape[1],
                              (tokens & 0xFFFFFFFF).astype(np.uint32), out)
    return out
