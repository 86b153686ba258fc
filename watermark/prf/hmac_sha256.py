"""The watermark PRF ``hmac-sha256-v1``: vLLM's HMAC-SHA-256 PRF (``prf: hmac_sha256``), bit for bit.

vLLM's construction (golden vectors from its own reference: ``tests/data/hmac-sha256-v1.json``):
one HMAC-SHA-256 per (context, token), keyed with the 256-bit key as 32 bytes
*little*-endian, over the 30 bytes ``vllm-watermark-hmac-sha256-v1\\0``, the context width as
a 32-bit little-endian word, each context entry and then the token as signed 64-bit
little-endian integers. The word is the digest's first four bytes read little-endian; the
uniform is Philox's formula ((word >> 8) + 1) / (2^24 + 1).

Detection costs one HMAC per scored token, as ``hmac-sha256-philox-v1`` does. Sampling does
not scale: a step needs one HMAC per vocabulary entry (129k per row), which vLLM computes on
the CPU and which a GPU kernel would do at about 2 compressions x 129k per row, an order of
magnitude over Philox. So this version is for keys that must match a vLLM deployment's
``hmac_sha256`` text; new keys use ``hmac-sha256-philox-v1``.
"""

from __future__ import annotations

import functools
import hmac
import struct
from typing import Sequence

import numpy as np

from watermark.prf import hmac_compiled, sha256
from watermark.prf.base import check_key
from watermark.prf.hmac_prf import HmacPRF
from watermark.prf.versions import HMAC_SHA256_V1

VERSION = HMAC_SHA256_V1
KEY_BITS = 256
DOMAIN = hmac_compiled.VS_DOMAIN


def key_bytes(key: int) -> bytes:
    return check_key(key, KEY_BITS).to_bytes(32, "little")


def message(context: Sequence[int], token: int) -> bytes:
    return DOMAIN + struct.pack(f"<I{len(context) + 1}q", len(context), *(int(c) for c in context), int(token))


def word_py(key: int, context: Sequence[int], token: int) -> int:
    return int.from_bytes(hmac.digest(key_bytes(key), message(context, token), "sha256")[:4], "little")


@functools.lru_cache(maxsize=4096)
def midstates(key: int) -> tuple[int, ...]:
    return sha256.midstates(key_bytes(key))


def words_reference(keys, contexts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    contexts = np.asarray(contexts, dtype=np.int64)
    tokens = np.asarray(tokens, dtype=np.int64)
    n = len(tokens)
    rows = [keys] * n if isinstance(keys, int) else [int(k) for k in keys]
    raw = {k: key_bytes(k) for k in set(rows)}
    out = np.empty(n, dtype=np.uint64)
    for i, (k, context, token) in enumerate(zip(rows, contexts.tolist(), tokens.tolist())):
        out[i] = int.from_bytes(hmac.digest(raw[k], message(context, token), "sha256")[:4], "little")
    return out


class HmacSha256(HmacPRF):
    """``hmac-sha256-v1`` on the CPU: keys are Python ints (256 bits)."""

    version = VERSION
    reference = staticmethod(words_reference)
    midstates = staticmethod(midstates)
    compiled_rows = staticmethod(hmac_compiled.vllm_words_rows)
    compiled_uniforms_many = staticmethod(hmac_compiled.vllm_uniforms_many)
    compiled_words_many = staticmethod(hmac_compiled.vllm_words_many)


HMAC_SHA256 = HmacSha256()
