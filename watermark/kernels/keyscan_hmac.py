"""Scan statistics of many 256-bit keys (``hmac-sha256-philox-v1``) over many texts on the GPU
(reference: :func:`watermark.keyscan.scan_stats_hmac_reference`; CPU: the compiled HMAC pass's
words into :func:`watermark.keyscan.scan_stats_from_words`, as :mod:`detector.multikey` does).

:mod:`watermark.kernels.keyscan`'s kernel with one change: a position's word is the
``hmac-sha256-philox-v1`` word, so per key and tile the lanes (positions) first run
HMAC-SHA-256 of their context under the key's midstates (two SHA-256 compressions for a
context of width <= 6, three above), then Philox's token stage under the digest's key and
state. The statistics are the same integers from the same words, so the result is bit for
bit the reference's whatever the order of the programs' sums.

Cost: about 2 x 64 SHA-256 rounds per position and stream against Philox's 10-20 rounds, so a
scan of 256-bit keys runs at a fraction of the Philox scan's rate (``bench/keyscan_gpu.py
--prf hmac-sha256-philox-v1`` measures both in one run).

The per-key statistics (chords, levels, ``gof``) repeat ``_keyscan_kernel``'s code rather
than adding a PRF flag to it, so the Philox kernel stays as it is.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from watermark import keyscan
from watermark.kernels.hmac import D0, D1, D2, D3, D4, D5, OUTER_BITS, PAD, compress, round_constants
from watermark.kernels.keyscan import (FRACTION_BITS, LEVEL_BASE, LEVEL_SHIFT, LEVELS,
                                       MANTISSA_ONE, PADDING_LEVEL, STATS, DeviceTables, _chord)
from watermark.kernels.philox import TOKEN_DOMAIN, philox

MID_WORDS = 16


@triton.jit
def _col_word(cols, count, offs, mask, width, nwords, g: tl.constexpr):
    """Word g of each position's padded inner HMAC message (lanes: positions ``offs``): the
    domain, the width, the context entries from the columns (entry e at cols[e * count + p]),
    the pad word, zeros, and the bit length in the last word of the last block."""
    zero = tl.zeros(offs.shape, tl.uint32)
    if g < 6:
        v = zero + (D0 if g == 0 else D1 if g == 1 else D2 if g == 2 else D3 if g == 3 else D4 if g == 4 else D5)
    elif g == 6:
        v = zero + width.to(tl.uint32)
    else:
        e = g - 7
        lanes_e = tl.zeros(offs.shape, tl.int32) + e  # a block: a scalar mask is not a load mask everywhere
        entry = tl.load(cols + e * count + offs, mask=mask & (lanes_e < width), other=0).to(tl.uint32, bitcast=True)
        v = tl.where(lanes_e < width, entry, tl.where(lanes_e == width, PAD, 0).to(tl.uint32))
    if g % 16 == 15:
        last = (nwords + 2) // 16 * 16 + 15
        v = tl.where(g == last, ((64 + 4 * nwords) * 8).to(tl.uint32), v)
    return v


@triton.jit
def _inner_block(k_ptr, cols, count, offs, mask, width, nwords, s0, s1, s2, s3, s4, s5, s6, s7, B: tl.constexpr):
    return compress(k_ptr, s0, s1, s2, s3, s4, s5, s6, s7,
                    _col_word(cols, count, offs, mask, width, nwords, 16 * B + 0),
                    _col_word(cols, count, offs, mask, width, nwords, 16 * B + 1),
                    _col_word(cols, count, offs, mask, width, nwords, 16 * B + 2),
                    _col_word(cols, count, offs, mask, width, nwords, 16 * B + 3),
                    _col_word(cols, count, offs, mask, width, nwords, 16 * B + 4),
                    _col_word(cols, count, offs, mask, width, nwords, 16 * B + 5),
                    _col_word(cols, count, offs, mask, width, nwords, 16 * B + 6),
                    _col_word(cols, count, offs, mask, width, nwords, 16 * B + 7),
                    _col_word(cols, count, offs, mask, width, nwords, 16 * B + 8),
                    _col_word(cols, count, offs, mask, width, nwords, 16 * B + 9),
                    _col_word(cols, count, offs, mask, width, nwords, 16 * B + 10),
                    _col_word(cols, count, offs, mask, width, nwords, 16 * B + 11),
                    _col_word(cols, count, offs, mask, width, nwords, 16 * B + 12),
                    _col_word(cols, count, offs, mask, width, nwords, 16 * B + 13),
                    _col_word(cols, count, offs, mask, width, nwords, 16 * B + 14),
                    _col_word(cols, count, offs, mask, width, nwords, 16 * B + 15))


@triton.jit
def _r_bits_hmac(k_ptr, mids, cols, toks, offs, mask, count, width):
    """float32 bits of r = 2^24 - (word >> 8) for positions ``offs`` [BLOCK] under the key whose
    16 HMAC midstate words (int64 holding uint32) start at ``mids``."""
    nwords = 7 + width
    zero = tl.zeros(offs.shape, tl.uint32)  # the key's midstates as blocks: compress's loop keeps types
    s0, s1, s2, s3, s4, s5, s6, s7 = _inner_block(
        k_ptr, cols, count, offs, mask, width, nwords,
        zero + tl.load(mids).to(tl.uint32), zero + tl.load(mids + 1).to(tl.uint32),
        zero + tl.load(mids + 2).to(tl.uint32), zero + tl.load(mids + 3).to(tl.uint32),
        zero + tl.load(mids + 4).to(tl.uint32), zero + tl.load(mids + 5).to(tl.uint32),
        zero + tl.load(mids + 6).to(tl.uint32), zero + tl.load(mids + 7).to(tl.uint32), 0)
    if width > 6:  # one width per launch: every lane takes the second inner block or none does
        s0, s1, s2, s3, s4, s5, s6, s7 = _inner_block(k_ptr, cols, count, offs, mask, width, nwords,
                                                      s0, s1, s2, s3, s4, s5, s6, s7, 1)
    d0, d1, d2, d3, d4, d5, _d6, _d7 = compress(
        k_ptr, zero + tl.load(mids + 8).to(tl.uint32), zero + tl.load(mids + 9).to(tl.uint32),
        zero + tl.load(mids + 10).to(tl.uint32), zero + tl.load(mids + 11).to(tl.uint32),
        zero + tl.load(mids + 12).to(tl.uint32), zero + tl.load(mids + 13).to(tl.uint32),
        zero + tl.load(mids + 14).to(tl.uint32), zero + tl.load(mids + 15).to(tl.uint32),
        s0, s1, s2, s3, s4, s5, s6, s7, zero + PAD, zero, zero, zero, zero, zero, zero, zero + OUTER_BITS)
    t = tl.load(toks + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
    w0, w1, w2, w3 = philox(t >> 2, d0, d1, d2, d4 ^ d3, d5 ^ TOKEN_DOMAIN)
    lane = t & 3
    w = tl.where(lane == 0, w0, w1)
    w = tl.where(lane == 2, w2, w)
    w = tl.where(lane == 3, w3, w)
    r = MANTISSA_ONE - (w >> 8).to(tl.int32)
    return r.to(tl.float32).to(tl.int32, bitcast=True)


@triton.jit(do_not_specialize=["count", "key_count", "width", "level_count"])
def _keyscan_hmac_kernel(k_ptr, mids_ptr, cols, toks, offsets_ptr, out_ptr, chord_ptr, levels_ptr, gof_ptr, xlnx_ptr,
                         count, key_count, width, level_count,
                         DUAL: tl.constexpr, KEYS: tl.constexpr, BLOCK: tl.constexpr,
                         CHORD_BUCKETS: tl.constexpr, LEVEL_BUCKETS: tl.constexpr):
    text = tl.program_id(0)
    first_key = tl.program_id(1) * KEYS
    start = tl.load(offsets_ptr + text)
    stop = tl.load(offsets_ptr + text + 1)
    n = stop - start
    half = (n + 1) // 2
    lane = tl.arange(0, BLOCK)
    level = tl.arange(0, LEVELS)
    tn = tl.load(gof_ptr + level)
    lnt = tl.load(gof_ptr + LEVELS + level)
    ln1t = tl.load(gof_ptr + 2 * LEVELS + level)
    xlnx_n = tl.load(xlnx_ptr + n)
    for kk in range(KEYS):
        key = first_key + kk
        if key < key_count:
            mids_a = mids_ptr + key.to(tl.int64) * (2 * 16)
            mids_b = mids_a + 16
            sum_a = tl.zeros([BLOCK], dtype=tl.int64)
            sum_b = tl.zeros([BLOCK], dtype=tl.int64)
            sum_max = tl.zeros([BLOCK], dtype=tl.int64)
            hist = tl.zeros([LEVELS], dtype=tl.int32)
            for tile in range(start, stop, BLOCK):
                offs = tile + lane
                mask = offs < stop
                bits_a = _r_bits_hmac(k_ptr, mids_a, cols, toks, offs, mask, count, width)
                sum_a += tl.where(mask, _chord(chord_ptr, chord_ptr + CHORD_BUCKETS, bits_a), 0)
                levels = tl.load(levels_ptr + (bits_a >> LEVEL_SHIFT) - LEVEL_BASE).to(tl.int32)
                if DUAL:
                    bits_b = _r_bits_hmac(k_ptr, mids_b, cols, toks, offs, mask, count, width)
                    sum_b += tl.where(mask, _chord(chord_ptr, chord_ptr + CHORD_BUCKETS, bits_b), 0)
                    max_a = _chord(chord_ptr + 2 * CHORD_BUCKETS, chord_ptr + 3 * CHORD_BUCKETS, bits_a)
                    max_b = _chord(chord_ptr + 2 * CHORD_BUCKETS, chord_ptr + 3 * CHORD_BUCKETS, bits_b)
                    sum_max += tl.where(mask, tl.maximum(max_a, max_b), 0)
                    levels_b = tl.load(levels_ptr + LEVEL_BUCKETS + (bits_b >> LEVEL_SHIFT) - LEVEL_BASE).to(tl.int32)
                    levels = tl.maximum(levels, levels_b)
                hist += tl.histogram(tl.where(mask, levels, PADDING_LEVEL), LEVELS)
            counts = hist.to(tl.int64)
            incl = tl.cumsum(counts, 0)
            above = n - incl
            i = tl.minimum(above + counts, half)
            valid = (level <= level_count) & (i > above) & (tn * n < (i << FRACTION_BITS))
            safe_i = tl.where(valid, i, 0)
            value = (tl.load(xlnx_ptr + safe_i) + tl.load(xlnx_ptr + n - safe_i) - xlnx_n
                     + safe_i * lnt + (n - safe_i) * ln1t)
            best = tl.max(tl.where(valid, value, 0), 0)
            gof = tl.where(best > 0, best + 128 + 2 * n, 0)  # + watermark.keyscan.gof_margin(n)
            row = out_ptr + (text.to(tl.int64) * key_count + key) * STATS
            tl.store(row, tl.sum(sum_a, 0))
            tl.store(row + 1, tl.sum(sum_b, 0))
            tl.store(row + 2, tl.sum(sum_max, 0))
            tl.store(row + 3, gof)


def midstates_tensor(keys_a, keys_b, device) -> torch.Tensor:
    """int64 [K, 2, 16]: each key's stream A and stream B HMAC midstates (B = A for single keys)
    from 256-bit ints (``hmac_philox.midstates``, cached per key)."""
    from watermark.prf import hmac_philox

    keys_b = keys_a if keys_b is None else keys_b
    table = [[hmac_philox.midstates(int(a)), hmac_philox.midstates(int(b))] for a, b in zip(keys_a, keys_b)]
    return torch.tensor(table, dtype=torch.int64, device=device).reshape(len(table), 2, MID_WORDS)


def scan_stats_hmac(mids: torch.Tensor, dual: bool, columns: torch.Tensor, tokens: torch.Tensor,
                    offsets: torch.Tensor, width: int, tables: DeviceTables, *, keys_per_program: int = 4,
                    block: int = 128, num_warps: int = 4) -> torch.Tensor:
    """int64 statistics [T, K, 4] (``keyscan.STATS``) of K 256-bit keys given by their midstates
    ``mids`` [K, 2, 16] (:func:`midstates_tensor`; ``dual``: stream B too) over the texts'
    scored positions: ``columns``, ``tokens``, ``offsets`` and ``width`` as
    :func:`watermark.kernels.keyscan.scan_stats` takes them (only the first ``width`` columns,
    the context entries mod 2^32, are read)."""
    device = columns.device
    key_count = int(mids.shape[0])
    texts = int(offsets.shape[0]) - 1
    out = torch.empty((max(texts, 0), key_count, len(keyscan.STATS)), dtype=torch.int64, device=device)
    if texts <= 0 or key_count == 0:
        return out
    if not 1 <= width <= 16 or int(columns.shape[0]) < width:
        raise ValueError("contexts of width 1..16 in at least `width` columns")
    if tuple(mids.shape[1:]) != (2, MID_WORDS):
        raise ValueError(f"mids must be [K, 2, {MID_WORDS}] (midstates_tensor)")
    grid = (texts, triton.cdiv(key_count, keys_per_program))
    _keyscan_hmac_kernel[grid](round_constants(device), mids.to(torch.int64).contiguous(), columns.contiguous(),
                               tokens.contiguous(), offsets.contiguous(), out, tables.chord, tables.levels,
                               tables.gof, tables.xlnx, int(tokens.shape[0]), key_count, width, tables.level_count,
                               DUAL=dual, KEYS=keys_per_program, BLOCK=block, CHORD_BUCKETS=keyscan.CHORD_BUCKETS,
                               LEVEL_BUCKETS=keyscan.LEVEL_BUCKETS, num_warps=num_warps)
    return out
