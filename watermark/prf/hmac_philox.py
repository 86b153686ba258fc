"""The watermark PRF ``hmac-sha256-philox-v1``: 256-bit keys at Philox's speed over the vocabulary.

Construction (Hallmark's; golden vectors: ``tests/data/hmac-sha256-philox-v1.json``):

* Context message: the 24 bytes ``hallmark-hmac-philox-v1\\0``, the context width w as a
  32-bit big-endian word, then each context entry (token id mod 2^32; -1 before the first
  generated token) as a 32-bit big-endian word.
* Digest: HMAC-SHA-256 keyed with the 256-bit key as 32 bytes big-endian, read as eight
  big-endian words d0 .. d7.
* The context's Philox state is (d0, d1, d2, d3) and its Philox key is k = d4 + 2^32 d5;
  token v's word is ``philox4x32-10-v1``'s token stage under that key and state: Philox-4x32-10
  on counter (v >> 2, d0, d1, d2) with key (d4 XOR d3, d5 XOR 0x574D544B), output word v & 3.
  The uniform is Philox's: ((word >> 8) + 1) / (2^24 + 1) in float64, rounded to float32.

Why this shape: HMAC-SHA-256 is a PRF under a 256-bit key (RFC 2104; Bellare 2006), so the
per-context values (d0 .. d5) are indistinguishable from independent random 192-bit values
to anyone without the key, and recovering the key from any number of them costs a 2^256
search. Philox only expands one context's random values over the vocabulary: learning a
context's Philox key and state (say by brute force over its 160 effective bits, or from a
Philox weakness) tells nothing about any other context or about the 256-bit key. Per context
one HMAC (two SHA-256 compressions with the key's midstates, :mod:`watermark.prf.sha256`,
for w <= 7), then one Philox call per four tokens: the sampler's cost over a 129k vocabulary
is Philox's, and the HMAC is once per row.

The numba pass (many keys, many positions) is :mod:`watermark.prf.hmac_compiled`; the Triton
one is :mod:`watermark.kernels.hmac`.
"""

from __future__ import annotations

import functools
import hmac
import struct
from typing import Sequence

import numpy as np

from watermark.prf import hmac_compiled, philox, sha256
from watermark.prf.base import check_key
from watermark.prf.hmac_prf import HmacPRF, per_row_keys
from watermark.prf.versions import HMAC_PHILOX_V1

VERSION = HMAC_PHILOX_V1
KEY_BITS = 256
DOMAIN = hmac_compiled.HP_DOMAIN
DOMAIN_WORDS = tuple(int.from_bytes(DOMAIN[i:i + 4], "big") for i in range(0, len(DOMAIN), 4))
MASK32 = philox.MASK32


def context_message(context: Sequence[int]) -> bytes:
    """The bytes HMAC authenticates for one context."""
    return DOMAIN + struct.pack(f">{len(context) + 1}I", len(context), *(int(c) & MASK32 for c in context))


def key_state_of_digest(digest: bytes) -> tuple[int, tuple[int, int, int, int]]:
    """(context's 64-bit Philox key, its state (d0, d1, d2, d3)) from the HMAC digest."""
    d = struct.unpack(">8I", digest)
    return d[4] | (d[5] << 32), (d[0], d[1], d[2], d[3])


def context_key_state(key: int, context: Sequence[int]) -> tuple[int, tuple[int, int, int, int]]:
    """One context's Philox key and state under the 256-bit ``key`` (hashlib's HMAC)."""
    return key_state_of_digest(hmac.digest(sha256.key_bytes(check_key(key, KEY_BITS)), context_message(context),
                                           "sha256"))


def context_key_state_from_midstates(mids: tuple[int, ...], context: Sequence[int]):
    """:func:`context_key_state` from the key's HMAC midstates (what rows carry, not keys)."""
    return key_state_of_digest(sha256.hmac_from_midstates(mids, context_message(context)))


@functools.lru_cache(maxsize=4096)
def midstates(key: int) -> tuple[int, ...]:
    """The key's 16 HMAC midstate words (inner then outer): all a sampler row needs of it.
    Cached: a few pure-Python compressions per key, and a service reuses its keys."""
    return sha256.midstates(sha256.key_bytes(check_key(key, KEY_BITS)))


def word_py(key: int, context: Sequence[int], token: int) -> int:
    philox_key, state = context_key_state(key, context)
    return philox.word_py(philox_key, state, token)


def words_reference(keys, contexts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Words (uint64 in [0, 2^32)) of N rows: keys one int or N ints; hashlib per row, then
    numpy's Philox token stage. The reference the compiled and GPU passes are tested against."""
    contexts = np.asarray(contexts, dtype=np.int64)
    tokens = np.asarray(tokens, dtype=np.int64)
    n = len(tokens)
    philox_keys = np.empty(n, dtype=np.uint64)
    states = np.empty((n, 4), dtype=np.uint64)
    cache: dict[tuple[int, tuple[int, ...]], tuple[int, tuple[int, ...]]] = {}
    for row, (key, context) in enumerate(zip(per_row_keys(keys, n), contexts.tolist())):
        got = cache.get((key, tuple(context)))
        if got is None:
            got = cache[(key, tuple(context))] = context_key_state(key, context)
        philox_keys[row], states[row] = got
    return philox.words_from_states_numpy(philox_keys, states, tokens)


class HmacPhilox(HmacPRF):
    """``hmac-sha256-philox-v1`` on the CPU: keys are Python ints (256 bits)."""

    version = VERSION
    reference = staticmethod(words_reference)
    midstates = staticmethod(midstates)
    compiled_rows = staticmethod(hmac_compiled.philox_words_rows)
    compiled_uniforms_many = staticmethod(hmac_compiled.philox_uniforms_many)
    compiled_words_many = staticmethod(hmac_compiled.philox_words_many)


HMAC_PHILOX = HmacPhilox()
