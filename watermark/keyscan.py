"""Scan statistics: integer summaries of many keys' PRF evidence over the scored positions
of many texts, the reference (numpy) of :mod:`watermark.keyscan_cpu` (numba) and
:mod:`watermark.kernels.keyscan` (Triton). All three return the same integers, bit for bit.

Why integers. Detecting one text against thousands of keys (and a corpus against every
key) must first find the few keys that can matter (:mod:`detector.screen`); what finds
them needs bounds on each key's whole-text statistics, not their float values. Bounds
made of table look-ups and integer sums are exact and associative, so a GPU, a compiled
CPU loop and this reference agree bit for bit whatever their order of summation.

Per scored token and PRF stream x (the key of a ``gumbel`` key; key A and key B of a dual
key): m = word >> 8 (the uniform's 24-bit mantissa) and r = 2^24 - m in [1, 2^24]; the
token's 1 - u is d = r 2^-24 when r <= 2^23 and lies in ((r - 1) 2^-24, r 2^-24) above,
so every per-token score is a decreasing function of r. r is exact in float32, whose bits
give a bucket: exponent and the top ``CHORD_BITS`` (or ``LEVEL_BITS``) mantissa bits.

Per (text, key) the four int64 statistics (``STATS``), fixed point with
``FRACTION_BITS`` fractional bits:

* ``sum_a``, ``sum_b``: sums over the scored tokens of an upper bound on -ln(1 - u) of
  stream A and B (B: 0 for a single key), each a chord of the (convex) score over the
  token's bucket, read from ``chord[0]`` as A[bucket] - (D[bucket] * low bits) >> (23 -
  CHORD_BITS);
* ``sum_max``: the same for the per-token Šidák maximum -ln(1 - max(u_A, u_B)^2)
  (``chord[1]``) at the stream whose bound is larger (dual keys; 0 otherwise);
* ``gof``: an upper bound on the Tr-GoF statistic: each token gets a level, the number
  of the descending thresholds tau_1 > tau_2 > ... its per-token p-value may lie at or
  below (``levels[x][bucket]``, the larger of the two streams'), and from the counts per
  level, with c_j the tokens at level >= j and I = ceil(n / 2), the maximum over j of
  n K(min(c_{j-1}, I) / n, tau_j) (see ``detector.screen``), from the tables ``xlnx``
  (k ln k) and ``gof`` (tau, -ln tau, -ln(1 - tau)), plus a margin for their rounding.

The tables are built by :mod:`detector.screen`, which also turns the statistics into
bounds on p-values; here they are inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from watermark.prf import philox

FRACTION_BITS = 32
"""Fixed-point fraction of the statistics: a score s is stored as about s * 2^32."""
MANTISSA_BITS = 23
CHORD_BITS = 6
"""Mantissa bits of r that pick a score bound's bucket (a chord over 1/64 of an octave)."""
LEVEL_BITS = 8
"""Mantissa bits of r that pick a level's bucket."""
EXPONENTS = 25
"""float32 exponents of r in [1, 2^24]: 0 .. 24."""
CHORD_BUCKETS = EXPONENTS << CHORD_BITS
LEVEL_BUCKETS = EXPONENTS << LEVEL_BITS
LEVELS = 256
"""Histogram bins: levels 0 .. J with J <= LEVELS - 2 (the kernel pads into bin LEVELS - 1)."""
MAX_POSITIONS = 1 << 20
"""Most scored positions per text (keeps every fixed-point product inside int64)."""
STATS = ("sum_a", "sum_b", "sum_max", "gof")
SUM_A, SUM_B, SUM_MAX, GOF = range(4)
FLOAT_ONE_BITS = 127
FRAC_MASK = (1 << (MANTISSA_BITS - CHORD_BITS)) - 1
CHORD_SHIFT = MANTISSA_BITS - CHORD_BITS
LEVEL_SHIFT = MANTISSA_BITS - LEVEL_BITS
MANTISSA_ONE = 1 << 24


def gof_margin(n: int) -> int:
    """Fixed-point units added to a positive ``gof``: the rounding of the tables (half a
    unit per entry, n + 3 entries per value) and of their float64 values (tens of units at
    n = 2^20), with room to spare."""
    return 128 + 2 * n


@dataclass(frozen=True)
class ScanTables:
    """What the statistics read (built by ``detector.screen.scan_tables``)."""

    chord: np.ndarray
    """int64 [2, 2, CHORD_BUCKETS]: for the single score (0) and the Šidák maximum (1),
    the chord's value A at the bucket's start and its fall D over the bucket."""
    levels: np.ndarray
    """uint8 [2, LEVEL_BUCKETS]: stream A's and stream B's level per bucket."""
    gof: np.ndarray
    """int64 [3, LEVELS]: row k (k = 0 .. J) for threshold tau_{k+1} (tau_{J+1} is the
    p-value floor 2^-23): ceil(tau 2^32), -ln(tau) and -ln(1 - tau) in fixed point."""
    level_count: int
    """J, the number of thresholds (levels 0 .. J)."""
    xlnx: np.ndarray
    """int64 [n_max + 1]: k ln k in fixed point, k = 0 .. n_max."""


def buckets(r: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The bucket of each r (int64 in [1, 2^24]) at ``bits`` mantissa bits, and the
    remaining low mantissa bits: from r's float32 representation (exact: r < 2^25)."""
    f = r.astype(np.float32).view(np.int32).astype(np.int64)
    shift = MANTISSA_BITS - bits
    return (f >> shift) - (FLOAT_ONE_BITS << bits), f & ((1 << shift) - 1)


def chord_bound(table: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Fixed-point upper bounds [N] from a chord table [2, CHORD_BUCKETS] at r [N]."""
    index, low = buckets(r, CHORD_BITS)
    return table[0][index] - ((table[1][index] * low) >> CHORD_SHIFT)


def gof_statistic(hist: np.ndarray, n: int, tables: ScanTables) -> int:
    """``gof`` from the level counts hist [LEVELS] of a text of n scored tokens."""
    if n == 0:
        return 0
    half = (n + 1) // 2
    incl = np.cumsum(hist.astype(np.int64))
    at_or_above = n - incl + hist  # c_k: tokens at level >= k
    above = n - incl  # c_{k+1}
    k = np.arange(LEVELS)
    i = np.minimum(at_or_above, half)
    tn, lnt, ln1t = tables.gof
    valid = (k <= tables.level_count) & (i > above) & (tn * n < (i << FRACTION_BITS))
    value = tables.xlnx[i] + tables.xlnx[n - i] - tables.xlnx[n] + i * lnt + (n - i) * ln1t
    best = int(np.max(np.where(valid, value, 0)))
    return best + gof_margin(n) if best > 0 else 0


def pack_positions(texts, width: int, skip_padded: bool,
                   mask=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The scored positions of many texts (token-id sequences) as one batch: contexts [P, w]
    (int64, -1 padded), tokens [P] and offsets [T + 1], text t's at offsets[t] ..
    offsets[t + 1]. A position is scored iff its context is the first occurrence in its
    text (and holds no padding, with ``skip_padded``): the detector's rule
    (``detector.scoring.scored_positions``). ``mask``: the first-occurrence function
    (:func:`watermark.dedup.first_occurrence_mask` or its compiled twin)."""
    from watermark.dedup import context_matrix, first_occurrence_mask

    mask = mask or first_occurrence_mask
    contexts, tokens, counts = [], [], [0]
    for text in texts:
        ids = np.asarray(text, dtype=np.int64).reshape(-1)
        keep = np.flatnonzero(mask(ids, width, skip_padded=skip_padded))
        contexts.append(context_matrix(ids, width)[keep])
        tokens.append(ids[keep])
        counts.append(len(keep))
    if not tokens:
        return np.zeros((0, width), dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
    return np.concatenate(contexts), np.concatenate(tokens), np.cumsum(counts).astype(np.int64)


def scan_stats_reference(keys_a: np.ndarray, keys_b: np.ndarray | None, contexts: np.ndarray,
                         tokens: np.ndarray, offsets: np.ndarray, tables: ScanTables) -> np.ndarray:
    """Statistics [T, K, 4] (int64, ``STATS``) of K keys over T texts.

    keys_a [K] (uint64: the PRF keys of stream A), keys_b [K] or None (single keys);
    contexts [P, w] (int64, -1 padded) and tokens [P] of every text's scored positions,
    text t's at offsets[t] .. offsets[t + 1] (offsets [T + 1])."""
    keys_a = np.asarray(keys_a, dtype=np.uint64)
    streams = [keys_a] if keys_b is None else [keys_a, np.asarray(keys_b, dtype=np.uint64)]
    words = [np.stack([philox.words_numpy(int(k), contexts, tokens) for k in keys])
             if len(keys) else np.zeros((0, len(tokens)), np.uint64) for keys in streams]
    return scan_stats_from_words(words[0], None if keys_b is None else words[1], offsets, tables)


def scan_stats_hmac_reference(keys_a, keys_b, contexts: np.ndarray, tokens: np.ndarray, offsets: np.ndarray,
                              tables: ScanTables) -> np.ndarray:
    """:func:`scan_stats_reference` for 256-bit ``hmac-sha256-philox-v1`` keys (Python ints,
    keys_b None for single keys): hashlib's HMAC per position and key
    (:func:`watermark.prf.hmac_philox.words_reference`), then the same statistics. The reference
    of :mod:`watermark.kernels.keyscan_hmac`."""
    from watermark.prf import hmac_philox

    streams = [list(keys_a)] if keys_b is None else [list(keys_a), list(keys_b)]
    words = [np.stack([hmac_philox.words_reference(int(k), contexts, tokens) for k in keys])
             if len(keys) else np.zeros((0, len(tokens)), np.uint64) for keys in streams]
    return scan_stats_from_words(words[0], None if keys_b is None else words[1], offsets, tables)


def scan_stats_from_words(words_a: np.ndarray, words_b: np.ndarray | None, offsets: np.ndarray,
                          tables: ScanTables) -> np.ndarray:
    """:func:`scan_stats_reference` from the PRF words themselves (words_a, words_b [K, P],
    any unsigned dtype): for a PRF the compiled scan does not run (256-bit keys). Every key
    in one pass of array operations (a short text's per-key overhead would dominate)."""
    texts, count = len(offsets) - 1, len(words_a)
    out = np.zeros((texts, count, len(STATS)), dtype=np.int64)
    if count == 0:
        return out
    streams = [words_a] if words_b is None else [words_a, words_b]
    r = [MANTISSA_ONE - (np.asarray(words, dtype=np.uint64) >> np.uint64(8)).astype(np.int64) for words in streams]
    single = [chord_bound(tables.chord[0], x) for x in r]
    level = tables.levels[0][buckets(r[0], LEVEL_BITS)[0]].astype(np.int64)
    if words_b is not None:
        level = np.maximum(level, tables.levels[1][buckets(r[1], LEVEL_BITS)[0]])
        maxima = np.maximum(chord_bound(tables.chord[1], r[0]), chord_bound(tables.chord[1], r[1]))
    rows = np.arange(count)[:, None] * LEVELS
    for t in range(texts):
        part = slice(int(offsets[t]), int(offsets[t + 1]))
        out[t, :, SUM_A] = single[0][:, part].sum(axis=1)
        if words_b is not None:
            out[t, :, SUM_B] = single[1][:, part].sum(axis=1)
            out[t, :, SUM_MAX] = maxima[:, part].sum(axis=1)
        hist = np.bincount((level[:, part] + rows).ravel(), minlength=count * LEVELS).reshape(count, LEVELS)
        for k in range(count):
            out[t, k, GOF] = gof_statistic(hist[k], part.stop - part.start, tables)
    return out
