"""HMAC-SHA-256 compiled (numba) for the 256-bit PRFs: many keys over many positions.

Each key enters as its 16 midstate words (:func:`watermark.prf.sha256.midstates`, computed
and cached by the PRF modules, which call this one), so one
HMAC over a short message costs its inner blocks plus one outer compression: two for a
``hmac-sha256-philox-v1`` context of width <= 6 (three above), three for a ``hmac-sha256-v1``
token at widths 2 to 4. Detection's passes (many positions) run LANES positions through each
compression together; every pass compresses with the x86 SHA extensions where numba's target CPU
has them (:mod:`watermark.prf.sha_ni`, :func:`sha_extensions`), with the lane arithmetic or
scalar code otherwise. Bit for bit :mod:`watermark.prf.hmac_philox` and :mod:`watermark.prf.hmac_sha256`
(tested against hashlib and vLLM's reference vectors).
"""

from __future__ import annotations

import functools

import numpy as np

from watermark import jit
from watermark.prf import lane_ops, philox, philox_compiled, sha256, sha_ni

HP_DOMAIN = b"hallmark-hmac-philox-v1\0"
"""``hmac-sha256-philox-v1``'s domain (24 bytes: six big-endian words), :mod:`watermark.prf.hmac_philox`."""
VS_DOMAIN = b"vllm-watermark-hmac-sha256-v1\0"
"""vLLM's ``hmac-sha256-v1`` domain (30 bytes), :mod:`watermark.prf.hmac_sha256`."""

_K = np.array(sha256.K, dtype=np.uint32)
_HP_DOMAIN = np.frombuffer(HP_DOMAIN, dtype=">u4").astype(np.uint32)
_VS_DOMAIN = np.frombuffer(VS_DOMAIN, dtype=np.uint8).copy()
_TOKEN_DOMAIN = np.uint32(philox.TOKEN_DOMAIN)
_DENOMINATOR = float(philox.UNIFORM_DENOMINATOR)


# numba widens uint32 arithmetic to 64 bits: every result below is cast back to uint32 (and
# no signed value meets an unsigned one, which numba would make a float).
_M32 = np.uint64(0xFFFFFFFF)
_ONES = np.uint32(0xFFFFFFFF)


def _rotr(x, n):  # pragma: no cover - compiled
    v = np.uint64(x)
    return np.uint32(((v >> np.uint64(n)) | (v << np.uint64(32 - n))) & _M32)


def _compress(state, w, sha):  # pragma: no cover - compiled
    """state uint32[8] <- compression of the block in w[:16] (w is uint32[64] scratch); with
    the SHA extensions where ``sha``."""
    if sha:
        _sha_ni_one(state, w, 0)
        return
    for i in range(16, 64):
        x, y = w[i - 15], w[i - 2]
        s0 = np.uint32(_rotr(x, 7) ^ _rotr(x, 18) ^ np.uint32(x >> np.uint32(3)))
        s1 = np.uint32(_rotr(y, 17) ^ _rotr(y, 19) ^ np.uint32(y >> np.uint32(10)))
        w[i] = np.uint32((np.uint64(w[i - 16]) + np.uint64(s0) + np.uint64(w[i - 7]) + np.uint64(s1)) & _M32)
    a, b, c, d, e, f, g, h = state[0], state[1], state[2], state[3], state[4], state[5], state[6], state[7]
    for i in range(64):
        ch = np.uint32((e & f) ^ (np.uint32(e ^ _ONES) & g))
        big1 = np.uint32(_rotr(e, 6) ^ _rotr(e, 11) ^ _rotr(e, 25))
        t1 = (np.uint64(h) + np.uint64(big1) + np.uint64(ch) + np.uint64(_K[i]) + np.uint64(w[i])) & _M32
        big0 = np.uint32(_rotr(a, 2) ^ _rotr(a, 13) ^ _rotr(a, 22))
        maj = np.uint32((a & b) ^ (a & c) ^ (b & c))
        t2 = (np.uint64(big0) + np.uint64(maj)) & _M32
        h, g, f = g, f, e
        e = np.uint32((np.uint64(d) + t1) & _M32)
        d, c, b = c, b, a
        a = np.uint32((t1 + t2) & _M32)
    state[0] = np.uint32((np.uint64(state[0]) + np.uint64(a)) & _M32)
    state[1] = np.uint32((np.uint64(state[1]) + np.uint64(b)) & _M32)
    state[2] = np.uint32((np.uint64(state[2]) + np.uint64(c)) & _M32)
    state[3] = np.uint32((np.uint64(state[3]) + np.uint64(d)) & _M32)
    state[4] = np.uint32((np.uint64(state[4]) + np.uint64(e)) & _M32)
    state[5] = np.uint32((np.uint64(state[5]) + np.uint64(f)) & _M32)
    state[6] = np.uint32((np.uint64(state[6]) + np.uint64(g)) & _M32)
    state[7] = np.uint32((np.uint64(state[7]) + np.uint64(h)) & _M32)


def _hmac_padded(mids, msg, nblocks, w, st, sha):  # pragma: no cover - compiled
    """st <- HMAC digest words of the padded inner message msg[:16 * nblocks] (uint32, its
    length field counting the ipad block), under a key's midstates [16]."""
    for i in range(8):
        st[i] = mids[i]
    for blk in range(nblocks):
        for i in range(16):
            w[i] = msg[16 * blk + i]
        _compress(st, w, sha)
    for i in range(8):
        w[i] = st[i]
        st[i] = mids[8 + i]
    w[8] = np.uint32(0x80000000)
    for i in range(9, 15):
        w[i] = np.uint32(0)
    w[15] = np.uint32(768)  # (64 + 32) bytes, in bits
    _compress(st, w, sha)


def _pad_words(msg, nwords):  # pragma: no cover - compiled
    """Pad a word-aligned message of nwords in msg (after one 64-byte block); the block count."""
    nblocks = (nwords + 2) // 16 + 1
    msg[nwords] = np.uint32(0x80000000)
    for i in range(nwords + 1, 16 * nblocks - 1):
        msg[i] = np.uint32(0)
    msg[16 * nblocks - 1] = np.uint32((64 + 4 * nwords) * 8)
    return nblocks


def _hp_digest(mids, ctx, width, msg, w, st, sha):  # pragma: no cover - compiled
    """st <- the hmac-sha256-philox-v1 digest of one context (ctx int64 [>= width])."""
    for i in range(6):
        msg[i] = _HP_DOMAIN[i]
    msg[6] = np.uint32(width)
    for i in range(width):
        msg[7 + i] = np.uint32(ctx[i] & 0xFFFFFFFF)
    _hmac_padded(mids, msg, _pad_words(msg, 7 + width), w, st, sha)


def _hp_words_rows(mids, contexts, tokens, out, sha):  # pragma: no cover - compiled
    """out[p] = word of tokens[p] under the key of row p (mids [P, 16]) at contexts[p]."""
    msg = np.empty(64, dtype=np.uint32)
    w = np.empty(64, dtype=np.uint32)
    st = np.empty(8, dtype=np.uint32)
    width = contexts.shape[1]
    for p in range(contexts.shape[0]):
        _hp_digest(mids[p], contexts[p], width, msg, w, st, sha)
        out[p] = _token_word(tokens[p], st[0], st[1], st[2], st[3], st[4], st[5] ^ _TOKEN_DOMAIN)


def _hp_key_states(mids, contexts, widths, keys, states, sha):  # pragma: no cover - compiled
    """Sampler rows: keys[b] (uint64) and states[b, :4] of row b's context (its first widths[b] entries)."""
    msg = np.empty(64, dtype=np.uint32)
    w = np.empty(64, dtype=np.uint32)
    st = np.empty(8, dtype=np.uint32)
    for b in range(contexts.shape[0]):
        _hp_digest(mids[b], contexts[b], widths[b], msg, w, st, sha)
        keys[b] = np.uint64(st[4]) | (np.uint64(st[5]) << np.uint64(32))
        for i in range(4):
            states[b, i] = np.uint64(st[i])


def _vs_word(mids, ctx, token, mb, msg, w, st, sha):  # pragma: no cover - compiled
    """hmac-sha256-v1's word of one (context, token): the message bytes in mb, then words."""
    width = ctx.shape[0]
    n = 0
    for i in range(_VS_DOMAIN.shape[0]):
        mb[n] = _VS_DOMAIN[i]
        n += 1
    for i in range(4):
        mb[n] = np.uint8((np.uint64(width) >> np.uint64(8 * i)) & np.uint64(0xFF))
        n += 1
    for j in range(width + 1):
        v = np.uint64(ctx[j]) if j < width else np.uint64(token)  # two's complement bits of the int64
        for i in range(8):
            mb[n] = np.uint8((v >> np.uint64(8 * i)) & np.uint64(0xFF))
            n += 1
    nblocks = (n + 8) // 64 + 1
    mb[n] = np.uint8(0x80)
    for i in range(n + 1, 64 * nblocks - 8):
        mb[i] = np.uint8(0)
    bits = np.uint64((64 + n) * 8)
    for i in range(8):
        mb[64 * nblocks - 1 - i] = np.uint8((bits >> np.uint64(8 * i)) & np.uint64(0xFF))
    for i in range(16 * nblocks):
        msg[i] = np.uint32((np.uint64(mb[4 * i]) << np.uint64(24)) | (np.uint64(mb[4 * i + 1]) << np.uint64(16))
                           | (np.uint64(mb[4 * i + 2]) << np.uint64(8)) | np.uint64(mb[4 * i + 3]))
    _hmac_padded(mids, msg, nblocks, w, st, sha)
    h = st[0]  # the digest's first 4 bytes, read little-endian
    v = np.uint64(h)
    m8 = np.uint64(0xFF)
    return np.uint32(((v & m8) << np.uint64(24)) | (((v >> np.uint64(8)) & m8) << np.uint64(16))
                     | (((v >> np.uint64(16)) & m8) << np.uint64(8)) | (v >> np.uint64(24)))


def _vs_words_rows(mids, contexts, tokens, out, sha):  # pragma: no cover - compiled
    mb = np.empty(256, dtype=np.uint8)
    msg = np.empty(64, dtype=np.uint32)
    w = np.empty(64, dtype=np.uint32)
    st = np.empty(8, dtype=np.uint32)
    for p in range(contexts.shape[0]):
        out[p] = _vs_word(mids[p], contexts[p], tokens[p], mb, msg, w, st, sha)



# --------------------------------------------------------------------------- many positions at once
# Detection hashes every scored position of a text under each key: LANES positions go through
# each compression together, so the loop over them (innermost) vectorises; a single HMAC's
# rounds are one long dependency chain and leave most of the core idle. Lane data is uint32
# and so is the arithmetic (watermark.prf.lane_ops' intrinsics: numba would widen it to 64
# bits, halving the lanes a register holds), each working variable a row of its own, and a round names its eight rows
# statically (eight rounds unrolled, the variables' roles rotating through the calls) so
# that the compiler sees eight distinct rows, not rows picked by runtime indices.
# bench/results/prf-detect-cpu.json has the figures. Where the CPU has the SHA extensions the
# same passes compress with them instead (watermark.prf.sha_ni: ~1.8x the compressions a second,
# bench/results/prf-detect-cpu-shani.md), sha_ni.GROUP lanes a call; lanes past n are scratch.
LANES = 128
_GROUP = sha_ni.GROUP


def _round_lanes(a, b, c, d, e, f, g, h, k, w, n):  # pragma: no cover - compiled
    """One SHA-256 round over n lanes: d += T1 and h <- T1 + T2 (the new a; the caller rotates)."""
    for j in range(n):
        ej = e[j]
        aj = a[j]
        t1 = _add4(h[j], _big1(ej), _ch(ej, f[j], g[j]), _add2(k, w[j]))
        d[j] = _add2(d[j], t1)
        h[j] = _add2(t1, _add2(_big0(aj), _maj(aj, b[j], c[j])))


def _schedule_lanes(w, i, n):  # pragma: no cover - compiled
    """Message schedule word i (16 <= i < 64) of n lanes, from the rows before it."""
    x, y, early, mid, out = w[i - 15], w[i - 2], w[i - 16], w[i - 7], w[i]
    for j in range(n):
        out[j] = _add4(early[j], _sig0(x[j]), mid[j], _sig1(y[j]))


def _compress_lanes(st, w, n, v, sha):  # pragma: no cover - compiled
    """st [8, LANES] <- the compression of w[:16, :n] into it, lane by lane (w [64, LANES],
    v [8, LANES]: scratch; all uint32); with the SHA extensions where ``sha``."""
    if sha:
        for j in range(0, n, _GROUP):
            _sha_ni_lanes(st, w, j)
        return
    for i in range(16, 64):
        _schedule_lanes(w, i, n)
    for r in range(8):
        for j in range(n):
            v[r, j] = st[r, j]
    a, b, c, d, e, f, g, h = v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]
    for i in range(0, 64, 8):
        _round_lanes(a, b, c, d, e, f, g, h, _K[i], w[i], n)
        _round_lanes(h, a, b, c, d, e, f, g, _K[i + 1], w[i + 1], n)
        _round_lanes(g, h, a, b, c, d, e, f, _K[i + 2], w[i + 2], n)
        _round_lanes(f, g, h, a, b, c, d, e, _K[i + 3], w[i + 3], n)
        _round_lanes(e, f, g, h, a, b, c, d, _K[i + 4], w[i + 4], n)
        _round_lanes(d, e, f, g, h, a, b, c, _K[i + 5], w[i + 5], n)
        _round_lanes(c, d, e, f, g, h, a, b, _K[i + 6], w[i + 6], n)
        _round_lanes(b, c, d, e, f, g, h, a, _K[i + 7], w[i + 7], n)
    for r in range(8):
        for j in range(n):
            st[r, j] = _add2(st[r, j], v[r, j])


def _inner_lanes(st, w, v, mid, msg, nblocks, n, sha):  # pragma: no cover - compiled
    """st[:, :n] <- the inner hash's state after msg's nblocks blocks (msg [16 * nblocks, LANES]),
    from the key's inner midstate mid[:8]."""
    for r in range(8):
        for j in range(n):
            st[r, j] = mid[r]
    for blk in range(nblocks):
        for i in range(16):
            for j in range(n):
                w[i, j] = msg[16 * blk + i, j]
        _compress_lanes(st, w, n, v, sha)


def _outer_lanes(st, w, v, mid, n, sha):  # pragma: no cover - compiled
    """st[:, :n] <- HMAC's outer hash of the inner digests in st, from the outer midstate
    mid[8:] (one block: the 32-byte digest, its padding and the length 768 bits)."""
    for i in range(8):
        for j in range(n):
            w[i, j] = st[i, j]
            st[i, j] = mid[8 + i]
    for i in range(8, 16):
        for j in range(n):
            w[i, j] = np.uint32(0x80000000) if i == 8 else (np.uint32(768) if i == 15 else np.uint32(0))
    _compress_lanes(st, w, n, v, sha)


def _hp_uniforms_lanes(mids, contexts, tokens, out, words, store_words, sha):  # pragma: no cover - compiled
    """out[k, p] = the uniform of tokens[k, p] under key k (midstates mids[k], uint32 [K, 16]) at
    contexts[p], LANES positions at a time."""
    count, width = contexts.shape
    w = np.zeros((64, LANES), np.uint32)
    st = np.empty((8, LANES), np.uint32)
    v = np.empty((8, LANES), np.uint32)
    msg = np.zeros((32, LANES), np.uint32)
    nwords = 7 + width
    nblocks = (nwords + 2) // 16 + 1
    bits = np.uint32((64 + 4 * nwords) * 8)
    for start in range(0, count, LANES):
        n = min(LANES, count - start)
        # The inner message of each lane: the same for every key.
        for i in range(16 * nblocks):
            for j in range(n):
                msg[i, j] = 0
        for i in range(6):
            for j in range(n):
                msg[i, j] = _HP_DOMAIN[i]
        for j in range(n):
            msg[6, j] = np.uint32(width)
        for e in range(width):
            for j in range(n):
                msg[7 + e, j] = np.uint32(np.uint64(contexts[start + j, e]) & _M32)
        for j in range(n):
            msg[nwords, j] = np.uint32(0x80000000)
            msg[16 * nblocks - 1, j] = bits
        for k in range(mids.shape[0]):
            _inner_lanes(st, w, v, mids[k], msg, nblocks, n, sha)
            _outer_lanes(st, w, v, mids[k], n, sha)
            for j in range(n):
                word = _token_word(tokens[k, start + j], st[0, j], st[1, j], st[2, j], st[3, j], st[4, j],
                                   st[5, j] ^ _TOKEN_DOMAIN)
                out[k, start + j] = np.float32((np.float64(word >> np.uint32(8)) + 1.0) / _DENOMINATOR)
                if store_words:  # the many-key screen reads words (detector.multikey)
                    words[k, start + j] = word


def _vs_words_lanes(mids, contexts, tokens, out, sha):  # pragma: no cover - compiled
    """hmac-sha256-v1 words: out[k, p] of tokens[k, p] under key k (midstates mids[k], uint32
    [K, 16]) at contexts[p], LANES positions through each compression together. Each lane's
    message bytes are laid out as :func:`_vs_word` lays them out (little-endian fields), then
    read as big-endian words: the context's once a chunk of lanes, the token's 8 bytes (the
    only ones that differ between keys) merged into its words per key."""
    count, width = contexts.shape
    nbytes = _VS_DOMAIN.shape[0] + 4 + 8 * (width + 1)
    nblocks = (nbytes + 8) // 64 + 1
    template = np.zeros(64 * nblocks, np.uint8)  # domain, width, the pad byte and the length
    for i in range(_VS_DOMAIN.shape[0]):
        template[i] = _VS_DOMAIN[i]
    for i in range(4):
        template[_VS_DOMAIN.shape[0] + i] = np.uint8((np.uint64(width) >> np.uint64(8 * i)) & np.uint64(0xFF))
    template[nbytes] = np.uint8(0x80)
    bits = np.uint64((64 + nbytes) * 8)
    for i in range(8):
        template[64 * nblocks - 1 - i] = np.uint8((bits >> np.uint64(8 * i)) & np.uint64(0xFF))
    first = _VS_DOMAIN.shape[0] + 4  # the first byte of the context entries
    at = first + 8 * width  # the token's first byte (its bytes stay zero in mb)
    low, high = at // 4, (at + 7) // 4  # the words holding the token's bytes
    mb = template.copy()
    msg = np.zeros((16 * nblocks, LANES), np.uint32)
    base = np.zeros((high - low + 1, LANES), np.uint32)  # those words without the token
    w = np.zeros((64, LANES), np.uint32)
    st = np.empty((8, LANES), np.uint32)
    v = np.empty((8, LANES), np.uint32)
    m8 = np.uint64(0xFF)
    for start in range(0, count, LANES):
        n = min(LANES, count - start)
        for j in range(n):
            for e in range(width):
                value = np.uint64(contexts[start + j, e])
                for i in range(8):
                    mb[first + 8 * e + i] = np.uint8((value >> np.uint64(8 * i)) & m8)
            for i in range(16 * nblocks):
                msg[i, j] = np.uint32((np.uint64(mb[4 * i]) << np.uint64(24))
                                      | (np.uint64(mb[4 * i + 1]) << np.uint64(16))
                                      | (np.uint64(mb[4 * i + 2]) << np.uint64(8)) | np.uint64(mb[4 * i + 3]))
            for i in range(low, high + 1):
                base[i - low, j] = msg[i, j]
        for k in range(mids.shape[0]):
            for j in range(n):
                for i in range(low, high + 1):
                    msg[i, j] = base[i - low, j]
                value = np.uint64(tokens[k, start + j])
                for i in range(8):  # byte at + i is byte 3 - (at + i) % 4 of its big-endian word
                    msg[(at + i) // 4, j] |= np.uint32(((value >> np.uint64(8 * i)) & m8)
                                                       << np.uint64(24 - 8 * ((at + i) % 4)))
            _inner_lanes(st, w, v, mids[k], msg, nblocks, n, sha)
            _outer_lanes(st, w, v, mids[k], n, sha)
            for j in range(n):  # the digest's first 4 bytes, read little-endian
                h = np.uint64(st[0, j])
                out[k, start + j] = np.uint32(((h & m8) << np.uint64(24))
                                              | (((h >> np.uint64(8)) & m8) << np.uint64(16))
                                              | (((h >> np.uint64(16)) & m8) << np.uint64(8)) | (h >> np.uint64(24)))


def _kgram_digests_lanes(mids, words, k, shift, out, sha):  # pragma: no cover - compiled
    """out[p] = the first 8 bytes (big-endian) of HMAC-SHA-256(key, words[p:p + k] as big-endian
    uint32s), shifted right by ``shift``, for every start p (out [n - k + 1] int64; mids [16]:
    the key's midstates): the ledger's k-gram digests (ledger.kgram_digests), LANES k-grams
    through each compression together. k + 2 words must fit the inner blocks' padding as
    :func:`_pad_words` lays it out."""
    count = out.shape[0]
    w = np.zeros((64, LANES), np.uint32)
    st = np.empty((8, LANES), np.uint32)
    v = np.empty((8, LANES), np.uint32)
    nblocks = (k + 2) // 16 + 1
    bits = np.uint32((64 + 4 * k) * 8)
    for start in range(0, count, LANES):
        n = min(LANES, count - start)
        for r in range(8):
            for j in range(n):
                st[r, j] = mids[r]
        for blk in range(nblocks):
            for i in range(16):
                at = 16 * blk + i
                if at < k:
                    for j in range(n):
                        w[i, j] = words[start + j + at]
                else:
                    fill = np.uint32(0x80000000) if at == k else (bits if at == 16 * nblocks - 1 else np.uint32(0))
                    for j in range(n):
                        w[i, j] = fill
            _compress_lanes(st, w, n, v, sha)
        _outer_lanes(st, w, v, mids, n, sha)
        for j in range(n):
            out[start + j] = np.int64(((np.uint64(st[0, j]) << np.uint64(32)) | np.uint64(st[1, j]))
                                      >> np.uint64(shift))


FUNCTIONS = {"_rotr": _rotr, "_compress": _compress, "_hmac_padded": _hmac_padded, "_pad_words": _pad_words,
             "_hp_digest": _hp_digest, "_hp_words_rows": _hp_words_rows,
             "_hp_key_states": _hp_key_states, "_vs_word": _vs_word,
             "_vs_words_rows": _vs_words_rows, "_round_lanes": _round_lanes, "_schedule_lanes": _schedule_lanes,
             "_compress_lanes": _compress_lanes, "_vs_words_lanes": _vs_words_lanes,
             "_hp_uniforms_lanes": _hp_uniforms_lanes, "_inner_lanes": _inner_lanes, "_outer_lanes": _outer_lanes,
             "_kgram_digests_lanes": _kgram_digests_lanes}
INLINE = ("_rotr", "_round_lanes", "_schedule_lanes", "_inner_lanes", "_outer_lanes")


@functools.cache
def compiled():
    """The compiled functions (name -> dispatcher), or None without numba."""
    helpers = philox_compiled.compiled()
    if helpers is None:  # pragma: no cover - exercised where numba is missing
        return None
    return jit.compile_all(FUNCTIONS, inline=INLINE,
                           helpers={"_token_word": helpers["_token_word"], **lane_ops.intrinsics(),
                                    **sha_ni.intrinsics()})


def sha_extensions() -> bool:
    """Whether the lane passes compress with the x86 SHA extensions (:func:`watermark.prf.sha_ni.available`,
    decided once); the lane arithmetic otherwise (tests force it)."""
    return sha_ni.available()


def midstates_table(midstates, keys) -> np.ndarray:
    """uint32 [K, 16]: each key's HMAC midstates, ``midstates(key)`` (the PRF module's, cached)."""
    return np.array([midstates(int(k)) for k in keys], dtype=np.uint32).reshape(len(keys), 16)


def _tokens_table(tokens_by_key, k: int, p: int) -> np.ndarray:
    if isinstance(tokens_by_key, np.ndarray) and tokens_by_key.ndim == 1:
        return np.ascontiguousarray(np.broadcast_to((tokens_by_key & 0xFFFFFFFF).astype(np.uint32), (k, p)))
    if isinstance(tokens_by_key, np.ndarray):
        return np.ascontiguousarray((tokens_by_key & 0xFFFFFFFF).astype(np.uint32))
    return np.stack([(np.asarray(t, dtype=np.int64) & 0xFFFFFFFF).astype(np.uint32) for t in tokens_by_key]) \
        if k else np.zeros((0, p), np.uint32)


def philox_uniforms_many(mids: np.ndarray, contexts: np.ndarray, tokens_by_key) -> np.ndarray:
    """hmac-sha256-philox-v1 uniforms [K, P] of keys given by their midstates [K, 16] at contexts [P, w]."""
    contexts = np.ascontiguousarray(contexts, dtype=np.int64)
    out = np.empty((len(mids), contexts.shape[0]), dtype=np.float32)
    if contexts.shape[0] and len(mids):
        compiled()["_hp_uniforms_lanes"](np.ascontiguousarray(mids, np.uint32), contexts,
                                         _tokens_table(tokens_by_key, len(mids), contexts.shape[0]), out,
                                         np.zeros((1, 1), np.uint32), False, sha_extensions())
    return out


def philox_words_many(mids: np.ndarray, contexts: np.ndarray, tokens_by_key) -> np.ndarray:
    """hmac-sha256-philox-v1 words [K, P] (uint32) of keys given by their midstates [K, 16]."""
    contexts = np.ascontiguousarray(contexts, dtype=np.int64)
    count = contexts.shape[0]
    words = np.empty((len(mids), count), dtype=np.uint32)
    if count and len(mids):
        compiled()["_hp_uniforms_lanes"](np.ascontiguousarray(mids, np.uint32), contexts,
                                         _tokens_table(tokens_by_key, len(mids), count),
                                         np.empty((len(mids), count), np.float32), words, True, sha_extensions())
    return words


def philox_words_rows(mids: np.ndarray, contexts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """hmac-sha256-philox-v1 words (uint64) of N rows, one key (midstates [N, 16]) per row."""
    contexts = np.ascontiguousarray(contexts, dtype=np.int64)
    out = np.empty(len(tokens), dtype=np.uint32)
    if len(tokens):
        compiled()["_hp_words_rows"](np.ascontiguousarray(mids, np.uint32), contexts,
                                     (np.asarray(tokens, np.int64) & 0xFFFFFFFF).astype(np.uint32), out,
                                     sha_extensions())
    return out.astype(np.uint64)


def philox_key_states(mids: np.ndarray, contexts: np.ndarray, widths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sampler rows: (per-context Philox keys [B] uint64, states [B, 4] uint64) from each row's
    midstates [B, 16] and its context (the first widths[b] entries of contexts [B, C])."""
    batch = contexts.shape[0]
    keys, states = np.empty(batch, np.uint64), np.empty((batch, 4), np.uint64)
    if batch:
        compiled()["_hp_key_states"](np.ascontiguousarray(mids, np.uint32), np.ascontiguousarray(contexts, np.int64),
                                     np.asarray(widths, np.int64), keys, states, sha_extensions())
    return keys, states


def vllm_words_many(mids: np.ndarray, contexts: np.ndarray, tokens_by_key) -> np.ndarray:
    """hmac-sha256-v1 words [K, P] (uint32) of keys given by their midstates [K, 16]."""
    contexts = np.ascontiguousarray(contexts, dtype=np.int64)
    out = np.empty((len(mids), contexts.shape[0]), dtype=np.uint32)
    if contexts.shape[0] and len(mids):
        tokens = np.asarray(tokens_by_key if isinstance(tokens_by_key, np.ndarray) else np.stack(tokens_by_key))
        tokens = np.ascontiguousarray(np.broadcast_to(tokens.astype(np.int64), (len(mids), contexts.shape[0])))
        compiled()["_vs_words_lanes"](np.ascontiguousarray(mids, np.uint32), contexts, tokens, out, sha_extensions())
    return out


def vllm_uniforms_many(mids: np.ndarray, contexts: np.ndarray, tokens_by_key) -> np.ndarray:
    """hmac-sha256-v1 uniforms [K, P]."""
    return philox.uniforms_from_words_numpy(vllm_words_many(mids, contexts, tokens_by_key).astype(np.uint64))


def vllm_words_rows(mids: np.ndarray, contexts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """hmac-sha256-v1 words (uint64) of N rows, one key (midstates [N, 16]) per row."""
    contexts = np.ascontiguousarray(contexts, dtype=np.int64)
    out = np.empty(len(tokens), dtype=np.uint32)
    if len(tokens):
        compiled()["_vs_words_rows"](np.ascontiguousarray(mids, np.uint32), contexts,
                                     np.asarray(tokens, np.int64), out, sha_extensions())
    return out.astype(np.uint64)


def kgram_digests(mids: np.ndarray, words: np.ndarray, k: int, bits: int) -> np.ndarray:
    """int64 [n - k + 1]: the first ``bits`` (at most 63) bits of HMAC-SHA-256 under the key of
    midstates ``mids`` [16] over each run of ``k`` consecutive ``words`` [n] (uint32), each word
    4 bytes big-endian: what ``hmac.new(key, gram).digest()[:8] >> (64 - bits)`` gives."""
    if not 0 < bits <= 63 or k < 1:
        raise ValueError("k-gram digests need 1 <= bits <= 63 and k >= 1")
    count = max(0, len(words) - k + 1)
    out = np.empty(count, dtype=np.int64)
    if count:
        compiled()["_kgram_digests_lanes"](np.ascontiguousarray(mids, np.uint32),
                                           np.ascontiguousarray(words, np.uint32), k, 64 - bits, out,
                                           sha_extensions())
    return out


def kgram_digest_array(token_ids, key: bytes, k: int, bits: int) -> np.ndarray | None:
    """int64 [n - k + 1]: :func:`kgram_digests` of ``token_ids`` (mod 2^32) under the HMAC key
    ``key`` itself; None without numba, in a process not worth loading it for, for a key longer
    than one SHA-256 block, or for ids beyond 64 bits (the caller's Python path answers those:
    ledger.kgram_digests)."""
    # A one-off process (a CLI command) stays on Python rather than load numba (~0.3 s) for a
    # few k-grams (watermark.jit.worth_loading: a k-gram in Python costs ~30 PRF evaluations).
    if not jit.worth_loading(32 * max(0, len(token_ids) - k + 1)):
        return None
    mids = _key_midstates(bytes(key))
    if mids is None or compiled() is None:
        return None
    try:
        words = (np.asarray(token_ids, dtype=np.int64).reshape(-1) & 0xFFFFFFFF).astype(np.uint32)
    except OverflowError:
        return None
    return kgram_digests(mids, words, k, bits)


@functools.lru_cache(maxsize=256)
def _key_midstates(key: bytes) -> np.ndarray | None:
    # The HMAC midstates [16] of a key (uint32, read-only); None for a key over one block.
    if len(key) > sha256.BLOCK_BYTES:
        return None
    out = np.array(sha256.midstates(key), dtype=np.uint32)
    out.flags.writeable = False
    return out
