"""The watermark PRF ``philox4x32-10-v1``: Philox-4x32-10 over (key, context, token).

Philox-4x32-10 is the counter-based generator of Salmon, Moraes, Dror and Shaw,
"Parallel random numbers: as easy as 1, 2, 3" (SC'11): multipliers 0xD2511F53 and
0xCD9E8D57, Weyl key bumps 0x9E3779B9 and 0xBB67AE85, ten rounds, no bump after the last.
The input mapping below is the one vLLM >= 0.32 uses, so keys and text move between the
two systems unchanged (golden vectors: ``shared/golden/philox4x32-10-v1.json``):

* A 64-bit key splits into k0 (low 32 bits) and k1 (high 32 bits).
* Context state: start from (0x574D4358, w, 0, 0) for context width w. For each block of
  four context entries at offset o (token ids mod 2^32, -1 before the first generated
  token; a missing entry at block position i is 0xFFFFFFFF - i), XOR the block into the
  state and run Philox with key (k0 XOR o, k1).
* Token v's word: Philox on counter (v >> 2, s0, s1, s2) with key (k0 XOR s3,
  k1 XOR 0x574D544B), output word number v & 3.
* Uniform: ((word >> 8) + 1) / (2^24 + 1), computed in float64 and rounded to float32.

This module holds the constants and the torch-free implementations: numpy for the CPU,
where uint64 arithmetic holds a 32x32-bit product exactly and detection runs fastest, and
plain Python ints for a handful of per-row scalars. The torch one (any device, per-row
keys), which the samplers and the Triton kernels' parity tests use, is
:mod:`watermark.prf.philox_torch`; the Triton building blocks are :mod:`watermark.kernels.philox`.
"""

from __future__ import annotations

import numpy as np

from watermark.prf.base import PRF, check_key
from watermark.prf.versions import PHILOX_V1

VERSION = PHILOX_V1
NAME = "philox"

MASK32 = 0xFFFFFFFF
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10
CONTEXT_DOMAIN = 0x574D4358
TOKEN_DOMAIN = 0x574D544B
UNIFORM_DENOMINATOR = 2**24 + 1


def key_words(key: int) -> tuple[int, int]:
    """A 64-bit key's (k0, k1): its low and high 32 bits."""
    check_key(key)
    return key & MASK32, key >> 32


def block_padding(index: int) -> int:
    """The value of a missing context entry at block position ``index`` (1, 2 or 3)."""
    return MASK32 - index


# --------------------------------------------------------------------------- numpy

_U64 = np.uint64
_NP_MASK = _U64(MASK32)
_NP_M0 = _U64(PHILOX_M0)
_NP_M1 = _U64(PHILOX_M1)
_NP_32 = _U64(32)


def _key_schedule(k0, k1):
    """Round keys for Philox; k0/k1 are uint64 arrays or numpy scalars."""
    keys = []
    for _ in range(PHILOX_ROUNDS):
        keys.append((k0, k1))
        k0 = (k0 + _U64(PHILOX_W0)) & _NP_MASK
        k1 = (k1 + _U64(PHILOX_W1)) & _NP_MASK
    return keys


def philox_numpy(c0, c1, c2, c3, k0, k1):
    """Philox-4x32-10 on uint64 arrays holding 32-bit words; 32x32 products are exact in uint64."""
    for rk0, rk1 in _key_schedule(k0, k1):
        p0 = c0 * _NP_M0
        p1 = c2 * _NP_M1
        c0, c1, c2, c3 = (p1 >> _NP_32) ^ c1 ^ rk0, p1 & _NP_MASK, (p0 >> _NP_32) ^ c3 ^ rk1, p0 & _NP_MASK
    return c0, c1, c2, c3


def context_state_numpy(k0, k1, contexts: np.ndarray):
    """Context state words for contexts [N, w] (any integer dtype; -1 allowed).

    k0/k1 are uint64 scalars (one key) or arrays [N] (one key per row).
    """
    n, width = contexts.shape
    ctx = contexts.astype(np.int64, copy=False).astype(np.uint64) & _NP_MASK
    state = [np.full(n, CONTEXT_DOMAIN, _U64), np.full(n, width, _U64), np.zeros(n, _U64), np.zeros(n, _U64)]
    for offset in range(0, width, 4):
        counter = [
            state[i] ^ (ctx[:, offset + i] if offset + i < width else _U64(block_padding(i)))
            for i in range(4)
        ]
        state = list(philox_numpy(*counter, k0 ^ _U64(offset), k1))
    return state


def words_numpy(key: int, contexts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """One key; contexts [N, w] and tokens [N] give the N words (uint64 in [0, 2^32))."""
    k0, k1 = (_U64(w) for w in key_words(key))
    return words_for_rows_numpy(k0, k1, contexts, tokens)


def words_for_rows_numpy(k0, k1, contexts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Like :func:`words_numpy` with k0/k1 uint64 scalars or per-row arrays [N]."""
    s0, s1, s2, s3 = context_state_numpy(k0, k1, contexts)
    return _token_stage_numpy(k0, k1, (s0, s1, s2, s3), tokens)


def _token_stage_numpy(k0, k1, state, tokens: np.ndarray) -> np.ndarray:
    s0, s1, s2, s3 = state
    tok = tokens.astype(np.int64, copy=False).astype(np.uint64) & _NP_MASK
    out = philox_numpy(tok >> _U64(2), s0, s1, s2, k0 ^ s3, k1 ^ _U64(TOKEN_DOMAIN))
    lane = (tok & _U64(3)).astype(np.intp)
    return np.choose(lane, out)


def words_from_states_numpy(keys: np.ndarray, states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """The token stage alone: per-row 64-bit keys [N] (uint64), states [N, 4] and tokens [N]
    give the words. (``hmac-sha256-philox-v1`` supplies its own per-context keys and states.)"""
    keys = np.asarray(keys, dtype=np.uint64)
    states = np.asarray(states, dtype=np.uint64)
    return _token_stage_numpy(keys & _NP_MASK, keys >> _NP_32, tuple(states[:, i] for i in range(4)), tokens)


def uniforms_from_words_numpy(words: np.ndarray) -> np.ndarray:
    return (((words >> _U64(8)).astype(np.float64) + 1.0) / UNIFORM_DENOMINATOR).astype(np.float32)


class Philox(PRF):
    """``philox4x32-10-v1`` on the CPU (numpy): what :func:`watermark.prf.lookup` returns for it."""

    version = VERSION

    def words(self, keys, contexts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        keys = np.asarray(keys, dtype=np.uint64)
        return words_for_rows_numpy(keys & _NP_MASK, keys >> _NP_32, np.asarray(contexts), np.asarray(tokens))

    def uniforms_from_words(self, words: np.ndarray) -> np.ndarray:
        return uniforms_from_words_numpy(words)


PHILOX = Philox()


# --------------------------------------------------------------------------- python ints
# Per-row scalars (a row's context state, a routing coin) on the CPU: a handful of values per
# decode step, where a plain-int Philox beats dozens of tiny tensor operations.


def philox_py(c0: int, c1: int, c2: int, c3: int, k0: int, k1: int) -> tuple[int, int, int, int]:
    for _ in range(PHILOX_ROUNDS):
        p0 = c0 * PHILOX_M0
        p1 = c2 * PHILOX_M1
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32
        k0 = (k0 + PHILOX_W0) & MASK32
        k1 = (k1 + PHILOX_W1) & MASK32
    return c0, c1, c2, c3


def context_state_py(key: int, context) -> tuple[int, int, int, int]:
    """The context state of one row (key an unsigned 64-bit int, context a sequence of ints)."""
    k0, k1 = key & MASK32, key >> 32
    width = len(context)
    state = (CONTEXT_DOMAIN, width, 0, 0)
    for offset in range(0, width, 4):
        block = [(int(context[offset + i]) & MASK32) if offset + i < width else block_padding(i) for i in range(4)]
        state = philox_py(state[0] ^ block[0], state[1] ^ block[1], state[2] ^ block[2], state[3] ^ block[3],
                          k0 ^ offset, k1)
    return state


def word_py(key: int, state: tuple[int, int, int, int], token: int) -> int:
    k0, k1 = key & MASK32, key >> 32
    token &= MASK32
    out = philox_py(token >> 2, state[0], state[1], state[2], k0 ^ state[3], k1 ^ TOKEN_DOMAIN)
    return out[token & 3]


def uniform_py(word: int) -> float:
    """The float32 uniform of a word, as a Python float (exactly the float32 value)."""
    return float(np.float32(((word >> 8) + 1) / UNIFORM_DENOMINATOR))
