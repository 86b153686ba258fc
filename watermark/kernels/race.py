"""The exact two-stage race over a vocabulary chunk, and the in-kernel cross-block reduction.

Reference arithmetic (:mod:`watermark.gumbel`): the winner of a Gumbel race is the first
index of the largest float32 score l + g with g = float32(-log(-log(float64(u)))); the
winner of an exponential race is the first index of the largest float32 w / E with
E = float32(-log(float64(u))). Evaluating the float64 logarithms for every token would
cost more than the rest of the kernel, so a tile is raced in two stages:

1. **approximate** scores for every token from fast float32 logarithms: the noise g~ and
   the reciprocal exponential r~ = 1 / E~ differ from the exact float32 g and 1 / E by at
   most ``NOISE_ERROR_BOUND`` (absolute) and ``RATIO_ERROR_BOUND`` (relative) -- bounds
   checked over all 2^24 uniforms on the device by :func:`measure_approximation_error`;
2. **exact** scores, in float64 exactly as the reference computes them, for the tokens
   whose approximate score is within ``threshold`` of the running approximate maximum M.

Why nothing is missed: if a token j has the largest exact score s_j, then for the token k
that reaches M, a_j >= s_j - e >= s_k - e >= a_k - 2e = M - 2e, where e bounds the
approximation error plus float32 rounding of the sum (|a| * 2^-23). The threshold M - (4e0
+ |M| 2^-20) is wider than that. NOTES.md has the full argument and the measured bounds.

Exact candidate pruning: a token whose float32 logit + NOISE_MAX is below the best exact
score so far cannot win, so its PRF word is never computed: a tile with few live tokens
queues them (with their logits) and the queue is raced BLOCK / 4 tokens at a time, one
Philox call per token; tiles with many live tokens are raced densely. Races merge
lexicographically (higher score, then lower token), so the order does not matter.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from watermark.noise import EXPONENTIAL_MIN, NOISE_MAX
from watermark.kernels import philox

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0").lower() not in ("", "0", "false", "off", "no")
# Hardware approximations (MUFU lg2/rcp) on the device; exact numpy functions under the
# interpreter, which cannot run inline assembly. Either way the bound below is measured.
FAST_MATH = tl.constexpr(not _INTERPRET)

LN2 = tl.constexpr(0.6931471805599453)
NEG_INF = tl.constexpr(float("-inf"))
POS_INF = tl.constexpr(float("inf"))
BIG_INDEX = tl.constexpr(2**31 - 1)
TWO_M24 = tl.constexpr(2.0**-24)
# d = 1 - u is exact below 2^-8 (mantissas above 2^24 - 2^16); -log(1 - d) ~= d + d^2 / 2
# there (relative error below d^2 / 3 <= 5.1e-6), the hardware log above (where its
# absolute error, ~2^-22, is at most ~5e-5 relative to -log u >= 2^-8).
SERIES_LIMIT = tl.constexpr(2**16)

# Stage-1 error budget: the measured max |g~ - g| must stay below NOISE_ERROR_BOUND and the
# measured max |r~ E - 1| below RATIO_ERROR_BOUND; the candidate window is 4x the bound.
NOISE_ERROR_BOUND = 2.0**-12
RATIO_ERROR_BOUND = 2.0**-12
LOG_WINDOW = tl.constexpr(4 * NOISE_ERROR_BOUND)
RATIO_WINDOW = tl.constexpr(4 * RATIO_ERROR_BOUND)
# Float32 rounding of a = l + g~ (or w * r~), relative to |M|: 2^-20 covers two roundings.
ROUNDING = tl.constexpr(2.0**-20)
# Below this the float32 scores w * r~ may be subnormal (or flushed to zero): no relative
# error bound holds, so every positive weight becomes a candidate (pathological rows only).
RATIO_NORMAL = tl.constexpr(2.0**-125)
# Pruning bounds with a margin for a last-ulp difference between float64 log implementations.
NOISE_BOUND = tl.constexpr(float(NOISE_MAX) + 2.0**-16)
EXPONENTIAL_FLOOR = tl.constexpr(float(EXPONENTIAL_MIN) * (1.0 - 2.0**-20))
# Compaction (LaunchConfig.compact): a tile with more than BLOCK / DENSE_SHARE live tokens
# is raced densely (one Philox call per 4 tokens); otherwise its live tokens go to the
# program's queue, raced once it holds BLOCK / QUEUE_DRAIN or more (one Philox call per
# token, BLOCK / 4 tokens per round). Queue capacity BLOCK >= BLOCK / QUEUE_DRAIN +
# BLOCK / DENSE_SHARE (3/4 BLOCK). Back to the first version's per-tile sparse race:
# git show da70ada:watermark/kernels/race.py.
DENSE_SHARE = tl.constexpr(2)
QUEUE_DRAIN = tl.constexpr(4)
# Rows x programs per row fill the resident slots (programs_per_sm x multiprocessors) in
# one wave: floor(slots / rows) programs per row (2 at B = 256 on 132 SMs: 512 programs
# of 528 slots; ceil gave 3, i.e. 768 programs, 1.45 waves, 118 us against 103 us measured).
# False restores ceil(slots / rows).
ONE_WAVE_SPLIT = True


# --------------------------------------------------------------------------- fast math


@triton.jit
def _lg2(x):
    if FAST_MATH:
        y = tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        y = tl.log2(x)
    return y


@triton.jit
def _rcp(x):
    if FAST_MATH:
        y = tl.inline_asm_elementwise("rcp.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        y = 1.0 / x
    return y


@triton.jit
def exponential_approx(word):
    """E~ ~= -ln(u) for the PRF uniform u of ``word`` (uint32), float32, any shape."""
    mant = (word >> 8).to(tl.int32)
    # u >= 2^-24: -log2(u) from the hardware log.
    x = (mant + 1).to(tl.float32) * TWO_M24
    far = -_lg2(x) * LN2
    # u near 1: d = 1 - u = (2^24 - m) 2^-24 exactly (u is (m + 1) 2^-24 minus one ulp),
    # built from the integer without a conversion; -ln(1 - d) = d + d^2/2 + ...
    nd = 16777216 - mant
    d = tl.fma((nd | 0x4B000000).to(tl.float32, bitcast=True), TWO_M24, -0.5)
    near = tl.fma(d * 0.5, d, d)
    return tl.where(nd < SERIES_LIMIT, near, far)


@triton.jit
def noise_approx(word):
    """g~ ~= -log(-log(u)), float32."""
    return -_lg2(exponential_approx(word)) * LN2


@triton.jit
def inverse_exponential_approx(word):
    """r~ ~= 1 / E, float32."""
    return _rcp(exponential_approx(word))


# --------------------------------------------------------------------------- exact values


@triton.jit
def exact_noise(mant):
    """The reference g = float32(-log(-log(float64(u)))) for a uniform's 24-bit mantissa (int32)."""
    u = philox.uniform(mant.to(tl.uint32) << 8)
    return (-tl.log(-tl.log(u.to(tl.float64)))).to(tl.float32)


@triton.jit
def exact_exponential(mant):
    """The reference E = float32(-log(float64(u)))."""
    u = philox.uniform(mant.to(tl.uint32) << 8)
    return (-tl.log(u.to(tl.float64))).to(tl.float32)


@triton.jit
def exact_ratio(w, mant):
    """float32(w / E): float64 division then one rounding is the correctly rounded float32
    quotient (53 >= 2 * 24 + 2 bits), whatever the float32 division mode of the compiler."""
    return (w.to(tl.float64) / exact_exponential(mant).to(tl.float64)).to(tl.float32)


# --------------------------------------------------------------------------- one tile
#
# A tile is LANES Philox counters c (BLOCK = 4 LANES tokens); token 4c + j takes output word j
# of counter c. Every per-token quantity is kept as four vectors over c (x0..x3), all in
# the counters' layout, so the words never move between threads (a join/reshape into a
# flat [BLOCK] tile made the compiler shuffle them through shared memory three times per
# tile). Loads are [BLOCK / 4, 4] tiles split in registers into the four lanes.


@triton.jit
def max4(x0, x1, x2, x3):
    return tl.maximum(tl.maximum(x0, x1), tl.maximum(x2, x3))


@triton.jit
def pick(j, x0, x1, x2, x3):
    """x_j for a scalar j in 0..3."""
    return tl.where(j == 0, x0, tl.where(j == 1, x1, tl.where(j == 2, x2, x3)))


@triton.jit
def first_candidate(c, k0, k1, k2, k3):
    """Smallest token id 4c + j with k_j set (BIG_INDEX if none)."""
    t = c * 4
    i01 = tl.minimum(tl.where(k0, t, BIG_INDEX), tl.where(k1, t + 1, BIG_INDEX))
    i23 = tl.minimum(tl.where(k2, t + 2, BIG_INDEX), tl.where(k3, t + 3, BIG_INDEX))
    return tl.min(tl.minimum(i01, i23), 0)


@triton.jit
def lane_value(c, i, x0, x1, x2, x3, fill):
    """The value of token i (scalar) among the tile's four vectors."""
    return tl.max(tl.where(c == (i >> 2), pick(i & 3, x0, x1, x2, x3), fill), 0)


@triton.jit
def count4(k0, k1, k2, k3):
    return tl.sum(k0.to(tl.int32) + k1.to(tl.int32) + k2.to(tl.int32) + k3.to(tl.int32), 0)


@triton.jit
def beats(s, i, best_s, best_i):
    """(s, i) beats (best_s, best_i): higher score, then lower token. Lexicographic, so the
    result does not depend on the order in which tokens are raced (the compaction queue
    races earlier tiles' tokens after later dense tiles)."""
    return (s > best_s) | ((s == best_s) & (i < best_i))


@triton.jit
def _log_threshold(m):
    thr = m - (LOG_WINDOW + tl.abs(m) * ROUNDING)
    return tl.where(m == POS_INF, m, thr)


@triton.jit
def _noise_score(l, u):
    return l - _lg2(exponential_approx(u)) * LN2


@triton.jit
def log_race_tile(c, l0, l1, l2, l3, u0, u1, u2, u3, run_max, best_s, best_i):
    """Race one tile: logits l_j (float32, -inf where masked) and PRF words u_j of tokens
    4c + j. Tiles must come in increasing token order (ties keep the earlier token)."""
    a0 = _noise_score(l0, u0)
    a1 = _noise_score(l1, u1)
    a2 = _noise_score(l2, u2)
    a3 = _noise_score(l3, u3)
    tile_max = tl.max(max4(a0, a1, a2, a3), 0)
    run_max = tl.maximum(run_max, tile_max)
    thr = _log_threshold(run_max)
    if (tile_max >= thr) & (tile_max > NEG_INF):
        k0 = (a0 >= thr) & (a0 > NEG_INF)
        k1 = (a1 >= thr) & (a1 > NEG_INF)
        k2 = (a2 >= thr) & (a2 > NEG_INF)
        k3 = (a3 >= thr) & (a3 > NEG_INF)
        n = count4(k0, k1, k2, k3)
        while n > 0:
            i = first_candidate(c, k0, k1, k2, k3)
            li = lane_value(c, i, l0, l1, l2, l3, NEG_INF)
            mi = lane_value(c, i, (u0 >> 8).to(tl.int32), (u1 >> 8).to(tl.int32), (u2 >> 8).to(tl.int32),
                            (u3 >> 8).to(tl.int32), -1)
            s = li + exact_noise(mi)
            better = beats(s, i, best_s, best_i)
            best_s = tl.where(better, s, best_s)
            best_i = tl.where(better, i, best_i)
            t = c * 4
            k0 = k0 & (t != i)
            k1 = k1 & (t + 1 != i)
            k2 = k2 & (t + 2 != i)
            k3 = k3 & (t + 3 != i)
            n = n - 1
    return run_max, best_s, best_i


@triton.jit
def _ratio_score(w, u):
    return w * _rcp(exponential_approx(u))


@triton.jit
def ratio_race_tile(c, w0, w1, w2, w3, u0, u1, u2, u3, run_max, best_s, best_i):
    """Race one tile of float32 weights w_j (>= 0, 0 where masked): argmax w / E."""
    a0 = _ratio_score(w0, u0)
    a1 = _ratio_score(w1, u1)
    a2 = _ratio_score(w2, u2)
    a3 = _ratio_score(w3, u3)
    tile_max = tl.max(max4(a0, a1, a2, a3), 0)
    run_max = tl.maximum(run_max, tile_max)
    thr = run_max * (1.0 - RATIO_WINDOW)
    thr = tl.where(thr < RATIO_NORMAL, -1.0, thr)
    if tile_max >= thr:
        k0 = (a0 >= thr) & (w0 > 0.0)
        k1 = (a1 >= thr) & (w1 > 0.0)
        k2 = (a2 >= thr) & (w2 > 0.0)
        k3 = (a3 >= thr) & (w3 > 0.0)
        n = count4(k0, k1, k2, k3)
        while n > 0:
            i = first_candidate(c, k0, k1, k2, k3)
            wi = lane_value(c, i, w0, w1, w2, w3, 0.0)
            mi = lane_value(c, i, (u0 >> 8).to(tl.int32), (u1 >> 8).to(tl.int32), (u2 >> 8).to(tl.int32),
                            (u3 >> 8).to(tl.int32), -1)
            s = exact_ratio(wi, mi)
            better = s > best_s
            best_s = tl.where(better, s, best_s)
            best_i = tl.where(better, i, best_i)
            t = c * 4
            k0 = k0 & (t != i)
            k1 = k1 & (t + 1 != i)
            k2 = k2 & (t + 2 != i)
            k3 = k3 & (t + 3 != i)
            n = n - 1
    return run_max, best_s, best_i


@triton.jit
def tile_counters(tile, BLOCK: tl.constexpr):
    """The tile's Philox counters c (int32 [BLOCK / 4]); its tokens are 4c + 0..3."""
    return tile * (BLOCK // 4) + tl.arange(0, BLOCK // 4)


@triton.jit
def tile_words(c, s0, s1, s2, k0, k1):
    """Words of tokens 4c + 0..3; k0/k1 already mixed with the state (k0 ^ s3, k1 ^ TOKEN_DOMAIN)."""
    return philox.philox(c.to(tl.uint32), s0, s1, s2, k0, k1)


# --------------------------------------------------------------------------- chunk passes
#
# Each pass walks its tiles in increasing order: the whole tiles first, with the next
# tile's loads issued before the current tile is raced (registers as a second buffer, so
# memory latency overlaps the PRF arithmetic), then the row's partial last tile, masked.


@triton.jit
def load_tile(row_ptr, c, limit, fill, BLOCK: tl.constexpr):
    """Raw values (the row's dtype) of tokens 4c + j, j = 0..3, ``fill`` at or past ``limit``
    (a scalar bound: the vocabulary size, or 0 to load nothing).

    One [BLOCK / 4, 4] load (16-byte vectors for float32 rows), split in registers into
    the four lanes; the split keeps each value in the thread of its counter.
    """
    offs = c[:, None] * 4 + tl.arange(0, 4)[None, :]
    x = tl.load(row_ptr + offs, mask=offs < limit, other=fill)
    even, odd = tl.split(tl.reshape(x, [BLOCK // 4, 2, 2]))
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return x0, x1, x2, x3


@triton.jit
def load_next(row_ptr, tile, full_end, fill, BLOCK: tl.constexpr):
    """Prefetch of whole tile ``tile`` (nothing when tile >= full_end)."""
    limit = tl.where(tile < full_end, (tile + 1) * BLOCK, 0)
    return load_tile(row_ptr, tile_counters(tile, BLOCK), limit, fill, BLOCK)


@triton.jit
def process(x, temperature, scaled):
    """Processed logits: NaN -> -inf, divided by the temperature (IEEE division, as torch)
    where ``scaled``, NaN -> -inf again (process_logits, then the race's own cleaning)."""
    l = x.to(tl.float32)
    l = tl.where(l == l, l, NEG_INF)
    if scaled:
        l = tl.math.div_rn(l, temperature)
        l = tl.where(l == l, l, NEG_INF)
    return l


@triton.jit
def log_race_tokens(t, l, u, run_max, best_s, best_i):
    """Race a gathered set of tokens ``t`` (int32, ascending; -1 for unused lanes, whose
    logits are -inf) with logits ``l`` and words ``u``: the one-lane form of log_race_tile."""
    a = _noise_score(l, u)
    tile_max = tl.max(a, 0)
    run_max = tl.maximum(run_max, tile_max)
    thr = _log_threshold(run_max)
    if (tile_max >= thr) & (tile_max > NEG_INF):
        cand = (a >= thr) & (a > NEG_INF)
        n = tl.sum(cand.to(tl.int32), 0)
        mants = (u >> 8).to(tl.int32)
        while n > 0:
            i = tl.min(tl.where(cand, t, BIG_INDEX), 0)
            hit = t == i
            li = tl.max(tl.where(hit, l, NEG_INF), 0)
            mi = tl.max(tl.where(hit, mants, -1), 0)
            s = li + exact_noise(mi)
            better = beats(s, i, best_s, best_i)
            best_s = tl.where(better, s, best_s)
            best_i = tl.where(better, i, best_i)
            cand = cand & (t != i)
            n = n - 1
    return run_max, best_s, best_i


@triton.jit
def queue_append(c, l0, l1, l2, l3, k0_, k1_, k2_, k3_, fill, queue_ptr, QCAP: tl.constexpr):
    """Append the live tokens of a tile (k_j: token 4c + j can still win) and their processed
    logits to this program's queue (token ids at queue_ptr[0, QCAP), logit bits at
    queue_ptr[QCAP, 2 QCAP)), in ascending token order from slot ``fill``. Returns the new fill."""
    n0 = k0_.to(tl.int32)
    n1 = k1_.to(tl.int32)
    n2 = k2_.to(tl.int32)
    count = n0 + n1 + n2 + k3_.to(tl.int32)
    slot = fill + tl.cumsum(count, 0) - count
    t = c * 4
    tl.store(queue_ptr + slot, t, mask=k0_)
    tl.store(queue_ptr + (QCAP + slot), l0.to(tl.int32, bitcast=True), mask=k0_)
    slot = slot + n0
    tl.store(queue_ptr + slot, t + 1, mask=k1_)
    tl.store(queue_ptr + (QCAP + slot), l1.to(tl.int32, bitcast=True), mask=k1_)
    slot = slot + n1
    tl.store(queue_ptr + slot, t + 2, mask=k2_)
    tl.store(queue_ptr + (QCAP + slot), l2.to(tl.int32, bitcast=True), mask=k2_)
    slot = slot + n2
    tl.store(queue_ptr + slot, t + 3, mask=k3_)
    tl.store(queue_ptr + (QCAP + slot), l3.to(tl.int32, bitcast=True), mask=k3_)
    return fill + tl.sum(count, 0)


@triton.jit
def queue_drain(queue_ptr, fill, s0, s1, s2, k0, k1, run_max, best_s, best_i, QCAP: tl.constexpr,
                ROUND: tl.constexpr):
    """Race the ``fill`` queued tokens, ROUND at a time (one Philox call per token). Every
    queued token is raced (no re-filtering: a queued token is never wrongly dropped, and
    the lexicographic merge makes the late race order-independent)."""
    tl.debug_barrier()  # the queue's stores (every thread's) are visible to every thread
    for g in range(0, fill, ROUND):
        idx = g + tl.arange(0, ROUND)
        inside = idx < fill
        tok = tl.load(queue_ptr + idx, mask=inside, other=-1, volatile=True)
        bits = tl.load(queue_ptr + (QCAP + idx), mask=inside, other=0, volatile=True)
        l = tl.where(inside, bits.to(tl.float32, bitcast=True), NEG_INF)
        lane = tok & 3
        w0, w1, w2, w3 = philox.philox((tok >> 2).to(tl.uint32), s0, s1, s2, k0, k1)
        u = tl.where(lane == 0, w0, tl.where(lane == 1, w1, tl.where(lane == 2, w2, w3)))
        run_max, best_s, best_i = log_race_tokens(tok, l, u, run_max, best_s, best_i)
    tl.debug_barrier()  # every thread has read the queue before it is written again
    return run_max, best_s, best_i


@triton.jit
def _log_race_loaded(c, x0, x1, x2, x3, queue_ptr, fill, temperature, scaled, s0, s1, s2, k0, k1, run_max,
                     best_s, best_i, BLOCK: tl.constexpr, COMPACT: tl.constexpr):
    l0 = process(x0, temperature, scaled)
    l1 = process(x1, temperature, scaled)
    l2 = process(x2, temperature, scaled)
    l3 = process(x3, temperature, scaled)
    # Exact pruning: a token with float32 l + NOISE_MAX <= the best exact score so far
    # cannot win. ``floor`` sits a little below best - NOISE_BOUND, so l <= floor implies it
    # (the margin covers the roundings, and makes the bound strict, so ties never matter;
    # a too-low floor only keeps extra tokens).
    floor = best_s - NOISE_BOUND - (tl.abs(best_s) * ROUNDING + ROUNDING)
    live0 = l0 > floor
    live1 = l1 > floor
    live2 = l2 > floor
    live3 = l3 > floor
    n_live = count4(live0, live1, live2, live3)
    if COMPACT:
        if n_live > BLOCK // DENSE_SHARE:  # dense: cheaper than one Philox call per live token
            run_max, best_s, best_i = _log_race_dense(c, l0, l1, l2, l3, s0, s1, s2, k0, k1, run_max, best_s, best_i)
        elif n_live > 0:  # sparse: queue the live tokens, race them QUEUE_DRAIN or more at a time
            fill = queue_append(c, l0, l1, l2, l3, live0, live1, live2, live3, fill, queue_ptr, BLOCK)
            if fill >= BLOCK // QUEUE_DRAIN:
                run_max, best_s, best_i = queue_drain(queue_ptr, fill, s0, s1, s2, k0, k1, run_max, best_s,
                                                      best_i, BLOCK, BLOCK // 4)
                fill = 0
    elif n_live > 0:
        run_max, best_s, best_i = _log_race_dense(c, l0, l1, l2, l3, s0, s1, s2, k0, k1, run_max, best_s, best_i)
    return run_max, best_s, best_i, fill


@triton.jit
def _log_race_dense(c, l0, l1, l2, l3, s0, s1, s2, k0, k1, run_max, best_s, best_i):
    u0, u1, u2, u3 = tile_words(c, s0, s1, s2, k0, k1)
    return log_race_tile(c, l0, l1, l2, l3, u0, u1, u2, u3, run_max, best_s, best_i)


@triton.jit
def first_tile(row_ptr, tile_begin, tile_end, vocab, fill, BLOCK: tl.constexpr):
    """Prefetch of a chunk's first whole tile; kernels issue it before their scalar
    prologue (keys, routing coin, context state) so that memory latency overlaps it."""
    return load_next(row_ptr, tile_begin, tl.minimum(tile_end, vocab // BLOCK), fill, BLOCK)


@triton.jit
def log_race_chunk(row_ptr, x0, x1, x2, x3, tile_begin, tile_end, vocab, temperature, scaled, s0, s1, s2, s3, k0,
                   k1, scratch_ptr, BLOCK: tl.constexpr, COMPACT: tl.constexpr):
    """Exact first argmax of l + g over the tiles [tile_begin, tile_end) of one row
    (x0..x3: the prefetched first tile, :func:`first_tile`).

    Returns (score, token); (-inf, BIG_INDEX) when every logit there is -inf or NaN.
    ``scratch_ptr``: this program's 2 BLOCK int32, the compaction queue (COMPACT only).
    """
    kk0 = k0 ^ s3
    kk1 = k1 ^ philox.TOKEN_DOMAIN
    run_max = tl.full([], NEG_INF, tl.float32)
    best_s = tl.full([], NEG_INF, tl.float32)
    best_i = tl.full([], BIG_INDEX, tl.int32)
    fill = tl.full([], 0, tl.int32)
    full_end = tl.minimum(tile_end, vocab // BLOCK)
    n0, n1, n2, n3 = x0, x1, x2, x3
    for tile in range(tile_begin, full_end):
        x0, x1, x2, x3 = n0, n1, n2, n3
        n0, n1, n2, n3 = load_next(row_ptr, tile + 1, full_end, float("-inf"), BLOCK)
        run_max, best_s, best_i, fill = _log_race_loaded(tile_counters(tile, BLOCK), x0, x1, x2, x3, scratch_ptr,
                                                         fill, temperature, scaled, s0, s1, s2, kk0, kk1, run_max,
                                                         best_s, best_i, BLOCK, COMPACT)
    if full_end < tile_end:  # the row's last, partial tile
        c = tile_counters(full_end, BLOCK)
        x0, x1, x2, x3 = load_tile(row_ptr, c, vocab, float("-inf"), BLOCK)
        run_max, best_s, best_i, fill = _log_race_loaded(c, x0, x1, x2, x3, scratch_ptr, fill, temperature, scaled,
                                                         s0, s1, s2, kk0, kk1, run_max, best_s, best_i, BLOCK,
                                                         COMPACT)
    if COMPACT:
        if fill > 0:
            run_max, best_s, best_i = queue_drain(scratch_ptr, fill, s0, s1, s2, kk0, kk1, run_max, best_s, best_i,
                                                  BLOCK, BLOCK // 4)
    return best_s, best_i


@triton.jit
def ratio_race_weights(c, w0, w1, w2, w3, s0, s1, s2, k0, k1, run_max, best_s, best_i):
    """Race one tile of float32 weights, with exact pruning by EXPONENTIAL_MIN: no token
    with w / EXPONENTIAL_MIN <= the best exact score can win."""
    wmax = tl.max(max4(w0, w1, w2, w3), 0)
    if wmax.to(tl.float64) / EXPONENTIAL_FLOOR > best_s.to(tl.float64):
        u0, u1, u2, u3 = tile_words(c, s0, s1, s2, k0, k1)
        run_max, best_s, best_i = ratio_race_tile(c, w0, w1, w2, w3, u0, u1, u2, u3, run_max, best_s, best_i)
    return run_max, best_s, best_i


@triton.jit
def ratio_race_chunk(row_ptr, tile_begin, tile_end, vocab, s0, s1, s2, s3, k0, k1, BLOCK: tl.constexpr):
    """Exact first argmax of w / E over the tiles [tile_begin, tile_end) of one row of
    weights (>= 0). Returns (score, token), (0, first token of the chunk) when all are 0."""
    kk0 = k0 ^ s3
    kk1 = k1 ^ philox.TOKEN_DOMAIN
    run_max = tl.full([], 0.0, tl.float32)
    best_s = tl.full([], 0.0, tl.float32)
    best_i = tile_begin * BLOCK
    full_end = tl.minimum(tile_end, vocab // BLOCK)
    n0, n1, n2, n3 = load_next(row_ptr, tile_begin, full_end, 0.0, BLOCK)
    for tile in range(tile_begin, full_end):
        x0, x1, x2, x3 = n0, n1, n2, n3
        n0, n1, n2, n3 = load_next(row_ptr, tile + 1, full_end, 0.0, BLOCK)
        run_max, best_s, best_i = ratio_race_weights(
            tile_counters(tile, BLOCK), x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32),
            x3.to(tl.float32), s0, s1, s2, kk0, kk1, run_max, best_s, best_i)
    if full_end < tile_end:
        c = tile_counters(full_end, BLOCK)
        x0, x1, x2, x3 = load_tile(row_ptr, c, vocab, 0.0, BLOCK)
        run_max, best_s, best_i = ratio_race_weights(c, x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32),
                                                     x3.to(tl.float32), s0, s1, s2, kk0, kk1, run_max, best_s,
                                                     best_i)
    return best_s, best_i


@triton.jit
def argmax_tile(c, x0, x1, x2, x3, best_v, best_i):
    """Fold one tile of float32 values into a running first argmax (increasing token order)."""
    m = tl.max(max4(x0, x1, x2, x3), 0)
    if m > best_v:
        best_i = first_candidate(c, x0 == m, x1 == m, x2 == m, x3 == m)
        best_v = m
    return best_v, best_i


@triton.jit
def _argmax_loaded(c, x0, x1, x2, x3, best_v, best_i):
    return argmax_tile(c, process(x0, 1.0, False), process(x1, 1.0, False), process(x2, 1.0, False),
                       process(x3, 1.0, False), best_v, best_i)


@triton.jit
def argmax_chunk(row_ptr, tile_begin, tile_end, vocab, BLOCK: tl.constexpr):
    """First argmax of the cleaned values (NaN -> -inf) over tiles [tile_begin, tile_end):
    (value, token), (-inf, BIG_INDEX) when all are -inf."""
    n0, n1, n2, n3 = first_tile(row_ptr, tile_begin, tile_end, vocab, float("-inf"), BLOCK)
    return argmax_chunk_from(row_ptr, n0, n1, n2, n3, tile_begin, tile_end, vocab, BLOCK)


@triton.jit
def argmax_chunk_from(row_ptr, n0, n1, n2, n3, tile_begin, tile_end, vocab, BLOCK: tl.constexpr):
    """:func:`argmax_chunk` with the first tile already prefetched."""
    best_v = tl.full([], NEG_INF, tl.float32)
    best_i = tl.full([], BIG_INDEX, tl.int32)
    full_end = tl.minimum(tile_end, vocab // BLOCK)
    for tile in range(tile_begin, full_end):
        x0, x1, x2, x3 = n0, n1, n2, n3
        n0, n1, n2, n3 = load_next(row_ptr, tile + 1, full_end, float("-inf"), BLOCK)
        best_v, best_i = _argmax_loaded(tile_counters(tile, BLOCK), x0, x1, x2, x3, best_v, best_i)
    if full_end < tile_end:
        c = tile_counters(full_end, BLOCK)
        x0, x1, x2, x3 = load_tile(row_ptr, c, vocab, float("-inf"), BLOCK)
        best_v, best_i = _argmax_loaded(c, x0, x1, x2, x3, best_v, best_i)
    return best_v, best_i


# --------------------------------------------------------------------------- cross-block


@triton.jit
def combine_blocks(part_s_ptr, part_i_ptr, count_ptr, slot, blk, nblk, best_s, best_i, NB: tl.constexpr):
    """Cross-block reduction inside the kernel: each program of a row writes its (score,
    token), then takes a ticket; the program that arrives last reduces the row
    (lexicographic: higher score, then lower token) and resets the row's counter.

    ``slot`` indexes the row's counter and partials (nblk entries from slot * nblk).
    Returns (is_last, score, token); with one block per row every program is last.
    """
    last = nblk == 1
    s_out = best_s
    i_out = best_i
    if nblk > 1:
        base = slot.to(tl.int64) * nblk
        tl.store(part_s_ptr + base + blk, best_s)
        tl.store(part_i_ptr + base + blk, best_i)
        tl.debug_barrier()
        ticket = tl.atomic_add(count_ptr + slot, 1, sem="acq_rel", scope="gpu")
        last = ticket == nblk - 1
        if last:
            tl.debug_barrier()
            s_out = tl.full([], NEG_INF, tl.float32)
            i_out = tl.full([], BIG_INDEX, tl.int32)
            for b0 in range(0, nblk, NB):
                idx = b0 + tl.arange(0, NB)
                ps = tl.load(part_s_ptr + base + idx, mask=idx < nblk, other=float("-inf"), volatile=True)
                pi = tl.load(part_i_ptr + base + idx, mask=idx < nblk, other=2**31 - 1, volatile=True)
                cs = tl.max(ps, 0)
                ci = tl.min(tl.where(ps == cs, pi, BIG_INDEX), 0)
                better = (cs > s_out) | ((cs == s_out) & (ci < i_out))
                s_out = tl.where(better, cs, s_out)
                i_out = tl.where(better, ci, i_out)
            tl.store(count_ptr + slot, 0)
    return last, s_out, i_out


# --------------------------------------------------------------------------- host side


class Workspace:
    """Per-(device, stream) scratch of the cross-block reduction: a counter per row slot
    (kept at zero between launches: the last program of a row resets it) and partials."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.counters = torch.zeros(0, dtype=torch.int32, device=device)
        self.scores = torch.empty(0, dtype=torch.float32, device=device)
        self.tokens = torch.empty(0, dtype=torch.int32, device=device)
        self.scratch = torch.empty(0, dtype=torch.int32, device=device)

    def reserve(self, slots: int, partials: int, scratch: int = 0) -> "Workspace":
        if self.counters.numel() < slots:
            self.counters = torch.zeros(max(slots, 2 * self.counters.numel()), dtype=torch.int32,
                                        device=self.device)
        if self.scores.numel() < partials:
            size = max(partials, 2 * self.scores.numel())
            self.scores = torch.empty(size, dtype=torch.float32, device=self.device)
            self.tokens = torch.empty(size, dtype=torch.int32, device=self.device)
        if self.scratch.numel() < max(scratch, 1):
            self.scratch = torch.empty(max(scratch, 1, 2 * self.scratch.numel()), dtype=torch.int32,
                                       device=self.device)
        return self


_WORKSPACES: dict[tuple, Workspace] = {}


def workspace(device: torch.device, slots: int, partials: int, scratch: int = 0) -> Workspace:
    """The workspace for the current stream of ``device``; launches on one stream are
    ordered, so they share it safely. Grow it before capturing a CUDA graph."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device.type, device.index, stream)
    if key not in _WORKSPACES:
        _WORKSPACES[key] = Workspace(device)
    return _WORKSPACES[key].reserve(slots, partials, scratch)


_SM_COUNT: dict[tuple, int] = {}


def multiprocessors(device: torch.device) -> int:
    key = (device.type, device.index)
    if key not in _SM_COUNT:
        _SM_COUNT[key] = (torch.cuda.get_device_properties(device).multi_processor_count
                          if device.type == "cuda" else 4)
    return _SM_COUNT[key]


def split_rows(rows: int, vocab: int, block: int, device: torch.device, programs_per_sm: int = 4,
               blocks_per_row: int | None = None) -> tuple[int, int]:
    """(tiles per program, programs per row) so that rows x programs fill the device."""
    tiles = max(1, triton.cdiv(vocab, block))
    slots = programs_per_sm * multiprocessors(device)
    fit = max(1, slots // max(rows, 1)) if ONE_WAVE_SPLIT else triton.cdiv(slots, max(rows, 1))
    want = blocks_per_row or fit
    per_block = triton.cdiv(tiles, max(1, min(want, tiles)))
    return per_block, triton.cdiv(tiles, per_block)


# --------------------------------------------------------------------------- error bound


@triton.jit
def _approximation_kernel(noise_ptr, ratio_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    words = offs.to(tl.uint32) << 8
    tl.store(noise_ptr + offs, noise_approx(words), mask=offs < n)
    tl.store(ratio_ptr + offs, inverse_exponential_approx(words), mask=offs < n)


def measure_approximation_error(device: torch.device | str) -> dict[str, float]:
    """Max |g~ - g| and max |r~ E - 1| over all 2^24 uniforms, with the kernels' own
    approximation on ``device``, against float64 evaluation of the reference formulas."""
    from watermark import noise as gumbel_noise
    from watermark.prf import philox_torch

    device = torch.device(device)
    n = 2**24
    noise = torch.empty(n, dtype=torch.float32, device=device)
    ratio = torch.empty(n, dtype=torch.float32, device=device)
    block = 65536 if _INTERPRET else 1024  # the interpreter pays per program, the device per register
    _approximation_kernel[(triton.cdiv(n, block),)](noise, ratio, n, BLOCK=block)
    words = torch.arange(n, dtype=torch.int64, device=device) << 8
    u = philox_torch.uniforms_from_words_torch(words)
    g = gumbel_noise.noise_from_uniforms(u).to(torch.float64)
    e = gumbel_noise.exponentials_from_uniforms(u).to(torch.float64)
    noise_error = (noise.to(torch.float64) - g).abs().max().item()
    ratio_error = (ratio.to(torch.float64) * e - 1.0).abs().max().item()
    return {
        "noise_max_abs_error": noise_error,
        "noise_error_bound": NOISE_ERROR_BOUND,
        "ratio_max_rel_error": ratio_error,
        "ratio_error_bound": RATIO_ERROR_BOUND,
        "within_bounds": bool(noise_error <= NOISE_ERROR_BOUND and ratio_error <= RATIO_ERROR_BOUND),
    }
