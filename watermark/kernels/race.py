"""The exact two-stage race over a vocabulary chunk (Gumbel, exponential) and the plain argmax.

Reference arithmetic (:mod:`watermark.gumbel`): the winner of a Gumbel race is the first
index of the largest float32 score l + g with g = float32(-log(-log(float64(u)))); the
winner of an exponential race is the first index of the largest float32 w / E with
E = float32(-log(float64(u))). Evaluating the float64 logarithms for every token would
cost more than the rest of the kernel, so a tile is raced in two stages:

1. **approximate** scores for every token from fast float32 logarithms: the noise g~ and
   the reciprocal exponential r~ = 1 / E~ differ from the exact float32 g and 1 / E by at
   most ``NOISE_ERROR_BOUND`` (absolute) and ``RATIO_ERROR_BOUND`` (relative) -- bounds
   checked over all 2^24 uniforms on the device (:mod:`watermark.kernels.approximation`);
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

The programs of a row are merged by :mod:`watermark.kernels.reduction`; how many there
are is :mod:`watermark.kernels.geometry`'s choice.
"""

from __future__ import annotations

import triton
import triton.language as tl

from watermark.noise import EXPONENTIAL_MIN, NOISE_MAX
from watermark.kernels import philox
from watermark.kernels.approximation import (LOG_WINDOW, RATIO_NORMAL, RATIO_WINDOW, ROUNDING, exact_noise,
                                             exact_ratio, noise_score, ratio_score)
from watermark.kernels.tiles import (BIG_INDEX, NEG_INF, POS_INF, count4, first_candidate, first_tile, lane_value,
                                     load_next, load_tile, max4, process, tile_counters, tile_words)

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


# --------------------------------------------------------------------------- one tile


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
def log_race_tile(c, l0, l1, l2, l3, u0, u1, u2, u3, run_max, best_s, best_i):
    """Race one tile: logits l_j (float32, -inf where masked) and PRF words u_j of tokens
    4c + j. Tiles must come in increasing token order (ties keep the earlier token)."""
    a0 = noise_score(l0, u0)
    a1 = noise_score(l1, u1)
    a2 = noise_score(l2, u2)
    a3 = noise_score(l3, u3)
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
def ratio_race_tile(c, w0, w1, w2, w3, u0, u1, u2, u3, run_max, best_s, best_i):
    """Race one tile of float32 weights w_j (>= 0, 0 where masked): argmax w / E."""
    a0 = ratio_score(w0, u0)
    a1 = ratio_score(w1, u1)
    a2 = ratio_score(w2, u2)
    a3 = ratio_score(w3, u3)
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


# --------------------------------------------------------------------------- chunk passes
#
#
# Each pass walks its tiles in increasing order: the whole tiles first, with the next
# tile's loads issued before the current tile is raced (registers as a second buffer, so
# memory latency overlaps the PRF arithmetic), then the row's partial last tile, masked.


@triton.jit
def log_race_tokens(t, l, u, run_max, best_s, best_i):
    """Race a gathered set of tokens ``t`` (int32, ascending; -1 for unused lanes, whose
    logits are -inf) with logits ``l`` and words ``u``: the one-lane form of log_race_tile."""
    a = noise_score(l, u)
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
def log_race_chunk(row_ptr, x0, x1, x2, x3, tile_begin, tile_end, vocab, temperature, scaled, s0, s1, s2, s3, k0,
                   k1, scratch_ptr, BLOCK: tl.constexpr, COMPACT: tl.constexpr):
    """Exact first argmax of l + g over the tiles [tile_begin, tile_end) of one row
    (x0..x3: the prefetched first tile, :func:`first_tile`).

    Returns (score, token); (-inf, BIG_INDEX) when every logit there is -inf or NaN.
    ``scratch_ptr``: this program's 2 BLOCK int32, the compaction queue (COMPACT only).
    """
    return log_race_chunk_seeded(row_ptr, x0, x1, x2, x3, tile_begin, tile_end, vocab, temperature, scaled, s0, s1,
                                 s2, k0 ^ s3, k1 ^ philox.TOKEN_DOMAIN, scratch_ptr,
                                 tl.full([], NEG_INF, tl.float32), tl.full([], BIG_INDEX, tl.int32), BLOCK, COMPACT)


@triton.jit
def log_race_chunk_seeded(row_ptr, x0, x1, x2, x3, tile_begin, tile_end, vocab, temperature, scaled, s0, s1, s2,
                          kk0, kk1, scratch_ptr, best_s, best_i, BLOCK: tl.constexpr, COMPACT: tl.constexpr):
    """:func:`log_race_chunk` from a known (exact score, token) of the row, e.g. a row
    bound (kk0 = k0 ^ s3, kk1 = k1 ^ TOKEN_DOMAIN): the pruning floor starts at that
    score instead of -inf, and the result is the lexicographic best of it and the chunk's."""
    run_max = tl.full([], NEG_INF, tl.float32)
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
