"""Scan statistics on the CPU, compiled (numba): :func:`watermark.keyscan.scan_stats_reference`
bit for bit, at the speed of the PRF.

Per text and key two passes over the scored positions: the PRF
(:mod:`watermark.prf.philox_compiled`, a loop the compiler vectorises) into a word buffer,
a dual key's two streams in one loop; then the table look-ups, sums and level counts, and
``gof`` from the counts. Contexts arrive as columns (uint32 [w, P]) so that both passes read
memory in order. Without numba, :func:`scan_stats` runs the reference.
"""

from __future__ import annotations

import functools

import numpy as np

from watermark import jit
from watermark.keyscan import (CHORD_BITS, CHORD_SHIFT, FLOAT_ONE_BITS, FRACTION_BITS, GOF, LEVEL_BITS, LEVEL_SHIFT,
                               LEVELS, MANTISSA_ONE, STATS, SUM_A, SUM_B, SUM_MAX, ScanTables, scan_stats_reference)
from watermark.prf import philox_compiled
from watermark.prf.philox_compiled import _words, context_columns  # noqa: F401 - _scan calls _words (compiled in)
from watermark.prf.philox_compiled import _CONTEXT_DOMAIN, _LOW32, _S32, _TOKEN_DOMAIN, _philox, _token_word  # noqa: F401

def _float_rs(words, n, out):  # pragma: no cover - compiled
    """out[:n] = r = 2^24 - (word >> 8) as float32 (exact), whose bits give the buckets."""
    for j in range(n):
        out[j] = np.float32(np.int32(MANTISSA_ONE) - np.int32(words[j] >> np.uint32(8)))


def _float_rs_pair(key_a, key_b, ctx, width, tokens, start, stop, ra, rb):  # pragma: no cover - compiled
    """_float_rs of both streams' words (key_a into ra, key_b into rb) in one loop, for
    contexts of one block (width <= 4): the same values as two _words + _float_rs passes,
    each position's context and token read once for both keys and the two keys' Philox
    chains side by side (measured: the dual scan's PRF 64 -> 110 M key.tokens/s a core; the
    single key's two passes stay, which measured faster than one fused loop)."""
    a0 = np.uint32(key_a & _LOW32)
    a1 = np.uint32(key_a >> _S32)
    at = a1 ^ _TOKEN_DOMAIN
    b0 = np.uint32(key_b & _LOW32)
    b1 = np.uint32(key_b >> _S32)
    bt = b1 ^ _TOKEN_DOMAIN
    w32 = np.uint32(width)
    for j in range(stop - start):
        p = start + j
        c0 = _CONTEXT_DOMAIN ^ ctx[0, p]
        c1 = w32 ^ ctx[1, p]
        c2 = ctx[2, p]
        c3 = ctx[3, p]
        token = tokens[p]
        s0, s1, s2, s3 = _philox(c0, c1, c2, c3, a0, a1)
        wa = _token_word(token, s0, s1, s2, s3, a0, at)
        s0, s1, s2, s3 = _philox(c0, c1, c2, c3, b0, b1)
        wb = _token_word(token, s0, s1, s2, s3, b0, bt)
        ra[j] = np.float32(np.int32(MANTISSA_ONE) - np.int32(wa >> np.uint32(8)))
        rb[j] = np.float32(np.int32(MANTISSA_ONE) - np.int32(wb >> np.uint32(8)))


def _gof(hist, n, tn, lnt, ln1t, level_count, xlnx):  # pragma: no cover - compiled
    if n == 0:
        return 0
    half = (n + 1) // 2
    best = 0
    incl = 0
    for k in range(level_count + 1):
        incl += hist[k]
        at_or_above = n - incl + hist[k]
        above = n - incl
        i = min(at_or_above, half)
        if i > above and tn[k] * n < (i << FRACTION_BITS):
            value = xlnx[i] + xlnx[n - i] - xlnx[n] + i * lnt[k] + (n - i) * ln1t[k]
            if value > best:
                best = value
    return best + 128 + 2 * n if best > 0 else 0  # + watermark.keyscan.gof_margin(n)


def _scan(keys_a, keys_b, dual, ctx, tokens, offsets, width, chord, levels, gof, level_count, xlnx,
          out):  # pragma: no cover - compiled
    texts = offsets.shape[0] - 1
    count = keys_a.shape[0]
    longest = 0
    for t in range(texts):
        longest = max(longest, offsets[t + 1] - offsets[t])
    states = np.empty((4, longest), dtype=np.uint32)
    words = np.empty(longest, dtype=np.uint32)
    ra = np.empty(longest, dtype=np.float32)
    rb = np.empty(longest, dtype=np.float32)
    level = np.empty(longest, dtype=np.uint8)
    # Four histograms, token j counted in copy j % 4: consecutive tokens of one level then
    # do not wait on each other's store.
    hists = np.zeros((4, LEVELS), dtype=np.int64)
    hist = np.zeros(LEVELS, dtype=np.int64)
    bits_a = ra.view(np.int32)
    bits_b = rb.view(np.int32)
    single_a, single_d = chord[0, 0], chord[0, 1]
    max_a, max_d = chord[1, 0], chord[1, 1]
    levels_a, levels_b = levels[0], levels[1]
    frac_mask = (1 << CHORD_SHIFT) - 1
    chord_base = FLOAT_ONE_BITS << CHORD_BITS
    level_base = FLOAT_ONE_BITS << LEVEL_BITS
    for t in range(texts):
        start, stop = offsets[t], offsets[t + 1]
        n = stop - start
        for k in range(count):
            if dual and ctx.shape[0] == 4:
                _float_rs_pair(keys_a[k], keys_b[k], ctx, width, tokens, start, stop, ra, rb)
            else:
                _words(keys_a[k], ctx, width, tokens, start, stop, states, words)
                _float_rs(words, n, ra)
                if dual:
                    _words(keys_b[k], ctx, width, tokens, start, stop, states, words)
                    _float_rs(words, n, rb)
            sum_a = 0
            sum_b = 0
            sum_max = 0
            if dual:
                for j in range(n):
                    fa = np.int64(bits_a[j])
                    fb = np.int64(bits_b[j])
                    ia = (fa >> CHORD_SHIFT) - chord_base
                    ib = (fb >> CHORD_SHIFT) - chord_base
                    low_a = fa & frac_mask
                    low_b = fb & frac_mask
                    sum_a += single_a[ia] - ((single_d[ia] * low_a) >> CHORD_SHIFT)
                    sum_b += single_a[ib] - ((single_d[ib] * low_b) >> CHORD_SHIFT)
                    ma = max_a[ia] - ((max_d[ia] * low_a) >> CHORD_SHIFT)
                    mb = max_a[ib] - ((max_d[ib] * low_b) >> CHORD_SHIFT)
                    sum_max += max(ma, mb)
                    level[j] = max(levels_a[(fa >> LEVEL_SHIFT) - level_base], levels_b[(fb >> LEVEL_SHIFT) - level_base])
            else:
                for j in range(n):
                    fa = np.int64(bits_a[j])
                    ia = (fa >> CHORD_SHIFT) - chord_base
                    sum_a += single_a[ia] - ((single_d[ia] * (fa & frac_mask)) >> CHORD_SHIFT)
                    level[j] = levels_a[(fa >> LEVEL_SHIFT) - level_base]
            for x in range(LEVELS):
                hists[0, x] = 0
                hists[1, x] = 0
                hists[2, x] = 0
                hists[3, x] = 0
            quads = n // 4
            for q in range(quads):
                hists[0, level[4 * q]] += 1
                hists[1, level[4 * q + 1]] += 1
                hists[2, level[4 * q + 2]] += 1
                hists[3, level[4 * q + 3]] += 1
            for j in range(4 * quads, n):
                hists[0, level[j]] += 1
            for x in range(LEVELS):
                hist[x] = hists[0, x] + hists[1, x] + hists[2, x] + hists[3, x]
            out[t, k, SUM_A] = sum_a
            out[t, k, SUM_B] = sum_b
            out[t, k, SUM_MAX] = sum_max
            out[t, k, GOF] = _gof(hist, n, gof[0], gof[1], gof[2], level_count, xlnx)


@functools.cache
def _compiled():
    prf = philox_compiled.compiled()
    if prf is None:  # pragma: no cover - exercised where numba is missing
        return None
    return jit.compile_all({"_float_rs": _float_rs, "_float_rs_pair": _float_rs_pair, "_gof": _gof, "_scan": _scan},
                           helpers={"_words": prf["_words"], "_philox": prf["_philox"], "_token_word": prf["_token_word"]})


def available() -> bool:
    return _compiled() is not None


def scan_stats(keys_a: np.ndarray, keys_b: np.ndarray | None, contexts: np.ndarray, tokens: np.ndarray,
               offsets: np.ndarray, tables: ScanTables, *, columns: np.ndarray | None = None) -> np.ndarray:
    """:func:`watermark.keyscan.scan_stats_reference`, compiled. ``columns``: the contexts
    already as :func:`context_columns` (saves the conversion when the caller reuses them)."""
    compiled = _compiled()
    if compiled is None:  # pragma: no cover - exercised where numba is missing
        return scan_stats_reference(keys_a, keys_b, contexts, tokens, offsets, tables)
    keys_a = np.ascontiguousarray(keys_a, dtype=np.uint64)
    dual = keys_b is not None
    keys_b = np.ascontiguousarray(keys_b if dual else keys_a, dtype=np.uint64)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    if int(np.max(np.diff(offsets), initial=0)) >= len(tables.xlnx):
        raise ValueError("a text has more scored positions than the tables were built for")
    out = np.zeros((len(offsets) - 1, len(keys_a), len(STATS)), dtype=np.int64)
    cols = context_columns(contexts) if columns is None else columns
    toks = (np.asarray(tokens, dtype=np.int64) & 0xFFFFFFFF).astype(np.uint32)
    width = np.asarray(contexts).shape[1]
    compiled["_scan"](keys_a, keys_b, dual, cols, toks, offsets, width, tables.chord, tables.levels,
                      tables.gof, tables.level_count, tables.xlnx, out)
    return out

