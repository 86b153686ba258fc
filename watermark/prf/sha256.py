"""SHA-256 and HMAC-SHA-256 pieces the 256-bit PRFs share (FIPS 180-4, RFC 2104).

hashlib computes whole digests; the PRFs also need HMAC's two *midstates* (the SHA-256
state after the key's ipad and opad blocks), which depend on the key alone. With them, an
HMAC over a short message costs two compressions (inner, outer) instead of four, on the
CPU (:mod:`watermark.prf.hmac_compiled`) and in the GPU kernels
(:mod:`watermark.kernels.hmac`), which take the midstates instead of the key.

Everything here is plain Python ints (a key's midstates are computed once per key); the
tests check it against hashlib and ``hmac``.
"""

from __future__ import annotations

MASK32 = 0xFFFFFFFF
KEY_BYTES = 32
BLOCK_BYTES = 64

IV = (0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19)
K = (
    0x428A2F98, 0x71374491, 0xB5C0FBCF, 0xE9B5DBA5, 0x3956C25B, 0x59F111F1, 0x923F82A4, 0xAB1C5ED5,
    0xD807AA98, 0x12835B01, 0x243185BE, 0x550C7DC3, 0x72BE5D74, 0x80DEB1FE, 0x9BDC06A7, 0xC19BF174,
    0xE49B69C1, 0xEFBE4786, 0x0FC19DC6, 0x240CA1CC, 0x2DE92C6F, 0x4A7484AA, 0x5CB0A9DC, 0x76F988DA,
    0x983E5152, 0xA831C66D, 0xB00327C8, 0xBF597FC7, 0xC6E00BF3, 0xD5A79147, 0x06CA6351, 0x14292967,
    0x27B70A85, 0x2E1B2138, 0x4D2C6DFC, 0x53380D13, 0x650A7354, 0x766A0ABB, 0x81C2C92E, 0x92722C85,
    0xA2BFE8A1, 0xA81A664B, 0xC24B8B70, 0xC76C51A3, 0xD192E819, 0xD6990624, 0xF40E3585, 0x106AA070,
    0x19A4C116, 0x1E376C08, 0x2748774C, 0x34B0BCB5, 0x391C0CB3, 0x4ED8AA4A, 0x5B9CCA4F, 0x682E6FF3,
    0x748F82EE, 0x78A5636F, 0x84C87814, 0x8CC70208, 0x90BEFFFA, 0xA4506CEB, 0xBEF9A3F7, 0xC67178F2,
)


def _rotr(x: int, n: int) -> int:
    return ((x >> n) | (x << (32 - n))) & MASK32


def compress(state: tuple[int, ...], block: bytes) -> tuple[int, ...]:
    """One SHA-256 compression of a 64-byte block into an 8-word state."""
    w = [int.from_bytes(block[4 * i:4 * i + 4], "big") for i in range(16)]
    for i in range(16, 64):
        s0 = _rotr(w[i - 15], 7) ^ _rotr(w[i - 15], 18) ^ (w[i - 15] >> 3)
        s1 = _rotr(w[i - 2], 17) ^ _rotr(w[i - 2], 19) ^ (w[i - 2] >> 10)
        w.append((w[i - 16] + s0 + w[i - 7] + s1) & MASK32)
    a, b, c, d, e, f, g, h = state
    for i in range(64):
        t1 = (h + (_rotr(e, 6) ^ _rotr(e, 11) ^ _rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i]) & MASK32
        t2 = ((_rotr(a, 2) ^ _rotr(a, 13) ^ _rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))) & MASK32
        a, b, c, d, e, f, g, h = (t1 + t2) & MASK32, a, b, c, (d + t1) & MASK32, e, f, g
    return tuple((s + v) & MASK32 for s, v in zip(state, (a, b, c, d, e, f, g, h)))


def key_bytes(key: int) -> bytes:
    """The 32 bytes HMAC is keyed with: the 256-bit key, big-endian (Hallmark's PRFs)."""
    return key.to_bytes(KEY_BYTES, "big")


def midstates(raw_key: bytes) -> tuple[int, ...]:
    """HMAC-SHA-256's inner and outer midstates for a key of at most 64 bytes: 16 words,
    the state after (key XOR ipad) then the state after (key XOR opad)."""
    if len(raw_key) > BLOCK_BYTES:
        raise ValueError("HMAC keys longer than a block are hashed first; the PRFs use 32 bytes")
    padded = raw_key.ljust(BLOCK_BYTES, b"\0")
    inner = compress(IV, bytes(b ^ 0x36 for b in padded))
    outer = compress(IV, bytes(b ^ 0x5C for b in padded))
    return inner + outer


def hmac_from_midstates(mids: tuple[int, ...], message: bytes) -> bytes:
    """HMAC-SHA-256(key, message) from the key's :func:`midstates` (equal to ``hmac.digest``)."""
    state = mids[:8]
    padded = message + b"\x80" + b"\0" * ((55 - len(message)) % 64) + ((BLOCK_BYTES + len(message)) * 8).to_bytes(8, "big")
    for start in range(0, len(padded), BLOCK_BYTES):
        state = compress(state, padded[start:start + BLOCK_BYTES])
    inner = b"".join(v.to_bytes(4, "big") for v in state)
    tail = inner + b"\x80" + b"\0" * 23 + ((BLOCK_BYTES + 32) * 8).to_bytes(8, "big")
    return b"".join(v.to_bytes(4, "big") for v in compress(mids[8:], tail))
