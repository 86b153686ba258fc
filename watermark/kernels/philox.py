"""``philox4x32-10-v1`` as Triton building blocks (the spec: :mod:`watermark.prf.philox`; torch reference: :mod:`watermark.prf.philox_torch`).

All words are ``tl.uint32``; keys arrive as int64 bit patterns and split into (k0, k1).
Scalars and vectors mix freely: a counter whose words 1-3 are per-row scalars keeps the
first two rounds half scalar, which the compiler hoists out of the per-token work.
"""

from __future__ import annotations

import triton
import triton.language as tl

from watermark import stream
from watermark.prf import philox as reference

PHILOX_M0 = tl.constexpr(reference.PHILOX_M0)
PHILOX_M1 = tl.constexpr(reference.PHILOX_M1)
PHILOX_W0 = tl.constexpr(reference.PHILOX_W0)
PHILOX_W1 = tl.constexpr(reference.PHILOX_W1)
PHILOX_ROUNDS = tl.constexpr(reference.PHILOX_ROUNDS)
CONTEXT_DOMAIN = tl.constexpr(reference.CONTEXT_DOMAIN)
TOKEN_DOMAIN = tl.constexpr(reference.TOKEN_DOMAIN)
MASK32 = tl.constexpr(reference.MASK32)
STREAM_WIDTH = tl.constexpr(stream.STREAM_CONTEXT_WIDTH)
# 2^-24 as a float32 constant: (mantissa + 1) * 2^-24 is exact in float32.
TWO_M24 = tl.constexpr(2.0**-24)


@triton.jit
def philox(c0, c1, c2, c3, k0, k1):
    """Philox-4x32-10 (Salmon et al., SC'11) on uint32 words; returns the four output words."""
    for _ in tl.static_range(PHILOX_ROUNDS):
        # One 32x32 -> 64-bit product gives both halves (a single IMAD.WIDE.U32 on the
        # device, where umulhi plus a low multiply issue two instructions).
        p0 = c0.to(tl.uint64) * PHILOX_M0
        p1 = c2.to(tl.uint64) * PHILOX_M1
        hi0 = (p0 >> 32).to(tl.uint32)
        hi1 = (p1 >> 32).to(tl.uint32)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, p1.to(tl.uint32), hi0 ^ c3 ^ k1, p0.to(tl.uint32)
        k0 = k0 + PHILOX_W0
        k1 = k1 + PHILOX_W1
    return c0, c1, c2, c3


@triton.jit
def split_key(key):
    """int64 key bit pattern (scalar) -> (k0, k1): its low and high 32-bit words."""
    return key.to(tl.uint32), (key >> 32).to(tl.uint32)


@triton.jit
def _entry(ctx_ptr, index, width, pad_index: tl.constexpr):
    # Token ids mod 2^32 (-1 -> 0xFFFFFFFF); a missing entry at block position i is 0xFFFFFFFF - i.
    value = tl.load(ctx_ptr + index, mask=index < width, other=0).to(tl.uint32)
    return tl.where(index < width, value, MASK32 - pad_index)


@triton.jit
def context_state(ctx_ptr, width, k0, k1):
    """Context state of ``width`` int64 entries at ``ctx_ptr`` (runtime width 1..16) -> 4 words."""
    s0 = tl.full([], CONTEXT_DOMAIN, tl.uint32)
    s1 = width.to(tl.uint32)
    s2 = tl.full([], 0, tl.uint32)
    s3 = tl.full([], 0, tl.uint32)
    for offset in range(0, width, 4):
        e0 = _entry(ctx_ptr, offset, width, 0)
        e1 = _entry(ctx_ptr, offset + 1, width, 1)
        e2 = _entry(ctx_ptr, offset + 2, width, 2)
        e3 = _entry(ctx_ptr, offset + 3, width, 3)
        s0, s1, s2, s3 = philox(s0 ^ e0, s1 ^ e1, s2 ^ e2, s3 ^ e3, k0 ^ offset, k1)
    return s0, s1, s2, s3


@triton.jit
def stream_state(k0, k1, position, lane):
    """State of the ordinary stream's context (position lo, position hi, lane); position int64,
    lane a constant or a run-time int32."""
    lo = position.to(tl.uint32)
    hi = (position >> 32).to(tl.uint32)
    return philox(
        tl.full([], CONTEXT_DOMAIN, tl.uint32) ^ lo,
        tl.full([], STREAM_WIDTH, tl.uint32) ^ hi,
        tl.full([], 0, tl.uint32) + lane,
        tl.full([], MASK32 - 3, tl.uint32),
        k0,
        k1,
    )


@triton.jit
def token_words(counter, s0, s1, s2, s3, k0, k1):
    """Words of tokens 4c..4c+3 for counters c = token >> 2 (uint32, any shape)."""
    return philox(counter, s0, s1, s2, k0 ^ s3, k1 ^ TOKEN_DOMAIN)


@triton.jit
def token_word(token, s0, s1, s2, s3, k0, k1):
    """The word of one token id (scalar or vector, int32)."""
    t = token.to(tl.uint32)
    w0, w1, w2, w3 = token_words(t >> 2, s0, s1, s2, s3, k0, k1)
    lane = t & 3
    w = tl.where(lane == 0, w0, w1)
    w = tl.where(lane == 2, w2, w)
    return tl.where(lane == 3, w3, w)


@triton.jit
def uniform(word):
    """The PRF's float32 uniform, bit-exact: float32(((w >> 8) + 1) / (2^24 + 1)).

    That value is nextafter((m + 1) * 2^-24, 0) for m = w >> 8 (proved exhaustively in
    tests/watermark/kernels/test_philox.py), so integer arithmetic gives it exactly.
    """
    mant = (word >> 8).to(tl.int32)
    x = (mant + 1).to(tl.float32) * TWO_M24
    return (x.to(tl.int32, bitcast=True) - 1).to(tl.float32, bitcast=True)
