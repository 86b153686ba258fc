"""The Gumbel race of a decode step on the CPU, compiled (numba), bit-exact with the reference.

Same function as :func:`watermark.gumbel.race_numpy` (log form): per row, the first index
of the largest float32 score ``l + g``, g = float32(-log(-log(float64 u))) of the token's
Philox uniform u; rows whose logits are all -inf give token 0. The compiled pass does what
numpy cannot do cheaply, in one loop over the row: Philox words per 4 tokens, a bracket
of each token's score from tables, the logit bound; only the few tokens whose bracket
reaches the best lower bound get their float64 logarithms, in numpy, exactly as the
reference computes them.

Exactness. A uniform's noise depends only on its 24-bit mantissa m (word >> 8); g is
computed for all 2^24 mantissas once (:func:`noise_brackets`) and reduced per bucket of
256 consecutive mantissas to its minimum G_lo and maximum G_hi (no monotonicity assumed).
Float32 addition rounds monotonically, so for token t with logit l and bucket j,
lb = fl32(l + G_lo[j]) <= s_t = fl32(l + g_t) <= ub = fl32(l + G_hi[j]). With LB the
largest lb of the row, the winner w satisfies ub_w >= s_w >= s_k >= lb_k = LB for the
token k reaching LB, so every token with ub < LB is out and the rest (the candidates,
typically 1-3 per row: a bucket spans ~3e-5 in g) are scored exactly and the lexicographic
maximum (higher score, then lower index) taken. Logit pruning: a counter whose four logits
l satisfy fl32(l + NOISE_MAX) < LB0, with LB0 the lb of the row's largest logit (computed
first), cannot hold a candidate (ub <= fl32(l + NOISE_MAX)), so its Philox call is skipped:
nearly free where a row is peaked or mostly masked (top-k / top-p), never wrong elsewhere.
"""

from __future__ import annotations

import threading

import numpy as np

from watermark import stream
from watermark.noise import NOISE_MAX, noise_from_uniforms_numpy
from watermark.prf import philox as prf

try:  # numba ships with vLLM's CPU build; without it the numpy race is used instead
    import numba
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None

# Buckets of 2^12 consecutive mantissas (4,096 buckets): the table (32 KB) stays in L1.
BUCKET_SHIFT = 12
_TABLES: np.ndarray | None = None
_LOCK = threading.Lock()


def noise_brackets() -> np.ndarray:
    """float32 [4096, 2]: (G_lo, G_hi), min and max of the exact noise over each bucket of
    2^12 consecutive mantissas, computed once (~0.5 s) with the reference's own numpy
    arithmetic (no monotonicity assumed)."""
    global _TABLES
    with _LOCK:
        if _TABLES is None:
            table = np.empty((1 << (24 - BUCKET_SHIFT), 2), dtype=np.float32)
            step = 1 << 20
            for start in range(0, 1 << 24, step):
                mant = np.arange(start, start + step, dtype=np.uint64)
                g = noise_from_uniforms_numpy(prf.uniforms_from_words_numpy(mant << np.uint64(8)))
                g = g.reshape(-1, 1 << BUCKET_SHIFT)
                first = start >> BUCKET_SHIFT
                table[first:first + g.shape[0], 0] = g.min(axis=1)
                table[first:first + g.shape[0], 1] = g.max(axis=1)
            _TABLES = table
        return _TABLES


_M0 = np.uint32(prf.PHILOX_M0)
_M1 = np.uint32(prf.PHILOX_M1)
_W0 = np.uint32(prf.PHILOX_W0)
_W1 = np.uint32(prf.PHILOX_W1)
_LOW = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)
_LANE_ROUTE = stream.LANE_ROUTE


def _philox_counters(counters, n, s0, s1, s2, k0, k1, o0, o1, o2, o3):  # pragma: no cover - compiled
    """Philox-4x32-10 of counters[:n] (uint32) with counter words (c, s0, s1, s2) and key
    (k0, k1): branch-free over 32-bit lanes, so the compiler vectorises it (vpmuludq)."""
    for i in range(n):
        c0 = counters[i]
        c1 = s0
        c2 = s1
        c3 = s2
        a = k0
        b = k1
        for _ in range(10):
            p0 = np.uint64(c0) * np.uint64(_M0)
            p1 = np.uint64(c2) * np.uint64(_M1)
            n0 = np.uint32(p1 >> _SHIFT) ^ c1 ^ a
            c1 = np.uint32(p1 & _LOW)
            c2 = np.uint32(p0 >> _SHIFT) ^ c3 ^ b
            c3 = np.uint32(p0 & _LOW)
            c0 = n0
            a = np.uint32(a + _W0)
            b = np.uint32(b + _W1)
        o0[i] = c0
        o1[i] = c1
        o2[i] = c2
        o3[i] = c3


def _bracket_pass(values, keys, states, brackets, noise_max, cand_rows, cand_tokens, cand_mants,
                  degenerate):  # pragma: no cover - compiled
    """Candidates of every row into cand_* (returns their count); degenerate[b] = all -inf.
    keys [B, 2] uint32 (k0, k1), states [B, 4] uint32, brackets [buckets, 2] (G_lo, G_hi)."""
    batch, vocab = values.shape
    ncounter = (vocab + 3) // 4
    count = 0
    row = np.full(ncounter * 4, -np.inf, dtype=np.float32)  # the row, padded to whole counters
    counters = np.empty(ncounter, dtype=np.uint32)
    words = np.empty((4, ncounter), dtype=np.uint32)
    ubs = np.empty(ncounter * 4, dtype=np.float32)
    mants = np.empty(ncounter * 4, dtype=np.int32)
    one = np.empty(1, dtype=np.uint32)
    w1 = np.empty((4, 1), dtype=np.uint32)
    shift = np.uint32(8 + BUCKET_SHIFT)
    for b in range(batch):
        s0 = states[b, 0]
        s1 = states[b, 1]
        s2 = states[b, 2]
        kk0 = keys[b, 0] ^ states[b, 3]
        kk1 = keys[b, 1] ^ np.uint32(prf.TOKEN_DOMAIN)
        row[:vocab] = values[b]
        top = 0
        top_l = row[0]
        for t in range(1, vocab):
            if row[t] > top_l:
                top_l = row[t]
                top = t
        if top_l == -np.inf:
            degenerate[b] = True
            continue
        degenerate[b] = False
        # A first lower bound: the bracket of the largest logit's score.
        one[0] = np.uint32(top >> 2)
        _philox_counters(one, 1, s0, s1, s2, kk0, kk1, w1[0], w1[1], w1[2], w1[3])
        best = np.float32(top_l + brackets[np.int64(w1[top & 3, 0] >> shift), 0])
        # Counters with a token that may still reach it (the others cannot hold a candidate).
        n = 0
        for c in range(ncounter):
            t = c * 4
            hi = max(max(row[t], row[t + 1]), max(row[t + 2], row[t + 3]))
            if np.float32(hi + noise_max) >= best:
                counters[n] = np.uint32(c)
                n += 1
            else:
                ubs[t] = -np.inf
                ubs[t + 1] = -np.inf
                ubs[t + 2] = -np.inf
                ubs[t + 3] = -np.inf
        _philox_counters(counters, n, s0, s1, s2, kk0, kk1, words[0], words[1], words[2], words[3])
        for i in range(n):
            base = np.int64(counters[i]) * 4
            for j in range(4):
                t = base + j
                word = words[j, i]
                mants[t] = np.int32(word >> np.uint32(8))
                bucket = np.int64(word >> shift)
                l = row[t]
                lb = np.float32(l + brackets[bucket, 0])
                if lb > best:
                    best = lb
                ubs[t] = np.float32(l + brackets[bucket, 1])
        for t in range(vocab):
            if ubs[t] >= best:
                cand_rows[count] = b
                cand_tokens[count] = t
                cand_mants[count] = mants[t]
                count += 1
    return count


def _philox1(c0, c1, c2, c3, k0, k1):  # pragma: no cover - compiled
    for _ in range(10):
        p0 = np.uint64(c0) * np.uint64(_M0)
        p1 = np.uint64(c2) * np.uint64(_M1)
        n0 = np.uint32(p1 >> _SHIFT) ^ c1 ^ k0
        c1 = np.uint32(p1 & _LOW)
        c2 = np.uint32(p0 >> _SHIFT) ^ c3 ^ k1
        c3 = np.uint32(p0 & _LOW)
        c0 = n0
        k0 = np.uint32(k0 + _W0)
        k1 = np.uint32(k1 + _W1)
    return c0, c1, c2, c3


def _context_state(key, ctx, width):  # pragma: no cover - compiled
    k0 = np.uint32(key & _LOW)
    k1 = np.uint32(key >> _SHIFT)
    s0 = np.uint32(prf.CONTEXT_DOMAIN)
    s1 = np.uint32(width)
    s2 = np.uint32(0)
    s3 = np.uint32(0)
    for offset in range(0, width, 4):
        block = np.empty(4, dtype=np.uint32)
        for i in range(4):
            if offset + i < width:
                block[i] = np.uint32(np.uint64(ctx[offset + i]) & _LOW)
            else:
                block[i] = np.uint32(0xFFFFFFFF - i)
        s0, s1, s2, s3 = _philox1(s0 ^ block[0], s1 ^ block[1], s2 ^ block[2], s3 ^ block[3],
                                  k0 ^ np.uint32(offset), k1)
    return s0, s1, s2, s3


def _row_states(key_a, key_b, alpha, stream_keys, contexts, widths, watermark, positions, lane,
                keys_out, states_out, use_b_out):  # pragma: no cover - compiled
    """Per row: the dual-key routing coin, the routed key (or the stream key) and its state
    (context state, or the stream state at the row's position) -- sampler.sample_cpu's setup."""
    stream_ctx = np.empty(3, dtype=np.int64)
    for b in range(key_a.shape[0]):
        skey = stream_keys[b]
        stream_ctx[0] = positions[b] & 0xFFFFFFFF
        stream_ctx[1] = (positions[b] >> 32) & 0xFFFFFFFF
        use_b = alpha[b] >= 1.0
        if alpha[b] > 0.0 and not use_b:
            stream_ctx[2] = _LANE_ROUTE
            r0, r1, r2, r3 = _context_state(skey, stream_ctx, 3)
            word = _philox1(np.uint32(0), r0, r1, r2, np.uint32(skey & _LOW) ^ r3,
                            np.uint32(skey >> _SHIFT) ^ np.uint32(prf.TOKEN_DOMAIN))[0]
            coin = np.float32((np.float64(word >> np.uint32(8)) + 1.0) / 16777217.0)
            use_b = coin < alpha[b]
        if watermark[b]:
            key = key_b[b] if use_b else key_a[b]
            s0, s1, s2, s3 = _context_state(key, contexts[b], widths[b])
        else:
            key = skey
            stream_ctx[2] = lane
            s0, s1, s2, s3 = _context_state(skey, stream_ctx, 3)
        keys_out[b] = key
        use_b_out[b] = use_b
        states_out[b, 0] = s0
        states_out[b, 1] = s1
        states_out[b, 2] = s2
        states_out[b, 3] = s3


def row_states(key_a, key_b, alpha, stream_keys, contexts, widths, watermark, positions,
               lane: int) -> tuple[np.ndarray, np.ndarray]:
    """(keys [B] uint64, states [B, 4] uint64) of a step's rows, as sampler.sample_cpu sets
    them up; contexts [B, C] int64 hold each row's context in its first widths[b] entries."""
    keys, states, _ = row_setup(key_a, key_b, alpha, stream_keys, contexts, widths, watermark, positions, lane)
    return keys, states


def row_setup(key_a, key_b, alpha, stream_keys, contexts, widths, watermark, positions,
              lane: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`row_states` and whether each row's routing coin picked key B ([B] bool; False
    where alpha is 0)."""
    batch = len(key_a)
    keys = np.empty(batch, dtype=np.uint64)
    states = np.empty((batch, 4), dtype=np.uint64)
    use_b = np.empty(batch, dtype=np.bool_)
    # Contiguous arrays only: numba compiles one specialisation per layout, and a strided
    # view (a column of the engine's packed step tensor) would otherwise compile at request time.
    c = np.ascontiguousarray
    _row_states(c(key_a, dtype=np.uint64), c(key_b, dtype=np.uint64), c(alpha, dtype=np.float32),
                c(stream_keys, dtype=np.uint64), c(contexts, dtype=np.int64), c(widths, dtype=np.int64),
                c(watermark, dtype=np.bool_), c(positions, dtype=np.int64), lane, keys, states, use_b)
    return keys, states, use_b


if numba is not None:  # compiled lazily, on the first call (warm_up() does it at start)
    _philox_counters = numba.njit(cache=True, nogil=True)(_philox_counters)
    _philox1 = numba.njit(cache=True, nogil=True, inline="always")(_philox1)
    _context_state = numba.njit(cache=True, nogil=True)(_context_state)
    _row_states = numba.njit(cache=True, nogil=True)(_row_states)
    _bracket_pass = numba.njit(cache=True, nogil=True)(_bracket_pass)


_NOISE_MAX: np.float32 | None = None


def _noise_max(brackets: np.ndarray) -> np.float32:
    """An upper bound of every noise value (NOISE_MAX, or the table's maximum if larger)."""
    global _NOISE_MAX
    if _NOISE_MAX is None:
        _NOISE_MAX = np.float32(max(NOISE_MAX, float(brackets[:, 1].max())))
    return _NOISE_MAX


def available() -> bool:
    return numba is not None


def race(values: np.ndarray, keys: np.ndarray, states: np.ndarray) -> np.ndarray:
    """values [B, V] float32 (NaN already -inf), keys [B] uint64, states [B, 4] uint64 ->
    tokens [B] int64: the same tokens as ``race_numpy(values, keys, states, ratio=False)``."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    batch, vocab = values.shape
    if batch == 0:
        return np.zeros(0, dtype=np.int64)
    if numba is None:  # the same tokens, uncompiled
        from watermark.gumbel import race_numpy

        return race_numpy(values, np.asarray(keys, dtype=np.uint64), np.asarray(states, dtype=np.uint64),
                          ratio=False)
    brackets = noise_brackets()
    capacity = batch * vocab
    cand_rows = np.empty(capacity, dtype=np.int64)
    cand_tokens = np.empty(capacity, dtype=np.int64)
    cand_mants = np.empty(capacity, dtype=np.int32)
    degenerate = np.zeros(batch, dtype=np.bool_)
    keys = np.asarray(keys, dtype=np.uint64)
    key_words = np.stack([keys & np.uint64(0xFFFFFFFF), keys >> np.uint64(32)], axis=1).astype(np.uint32)
    n = _bracket_pass(values, key_words, np.ascontiguousarray(np.asarray(states).astype(np.uint32)),
                      brackets, _noise_max(brackets), cand_rows, cand_tokens, cand_mants, degenerate)
    rows, tokens = cand_rows[:n], cand_tokens[:n]
    words = cand_mants[:n].astype(np.uint64) << np.uint64(8)
    with np.errstate(invalid="ignore", over="ignore"):
        scores = values[rows, tokens] + noise_from_uniforms_numpy(prf.uniforms_from_words_numpy(words))
    result = np.zeros(batch, dtype=np.int64)
    _pick(rows, tokens, scores, result)
    result[degenerate] = 0
    return result


def _pick(rows, tokens, scores, result):  # pragma: no cover - compiled
    """Per row, the candidate with the highest score, then the lowest token (NaN as -inf);
    candidates come grouped by row."""
    best = np.float32(0.0)
    current = -1
    for i in range(rows.shape[0]):
        s = scores[i]
        if s != s:
            s = np.float32(-np.inf)
        if rows[i] != current:
            current = rows[i]
            best = s
            result[current] = tokens[i]
        elif s > best or (s == best and tokens[i] < result[current]):
            best = s
            result[current] = tokens[i]


if numba is not None:
    _pick = numba.njit(cache=True, nogil=True)(_pick)


def warm_up() -> None:
    """Build the tables and compile the passes (seconds), so no request pays for it."""
    if available():
        race(np.zeros((1, 8), dtype=np.float32), np.zeros(1, dtype=np.uint64), np.zeros((1, 4), dtype=np.uint64))
        row_states(np.zeros(1, np.uint64), np.zeros(1, np.uint64), np.full(1, 0.5, np.float32),
                   np.zeros(1, np.uint64), np.zeros((1, 16), np.int64), np.ones(1, np.int64), np.ones(1, bool),
                   np.zeros(1, np.int64), 0)
