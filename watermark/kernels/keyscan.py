"""Scan statistics of many keys over many texts on the GPU (reference:
:func:`watermark.keyscan.scan_stats_reference`; CPU: :mod:`watermark.keyscan_cpu`).

Every output is an integer (table look-ups, int64 sums, level counts), so the kernel
returns the reference's values bit for bit whatever order its programs add them in.

One program per (text, block of ``KEYS`` keys); per key it walks the text's scored
positions in tiles of ``BLOCK`` tokens: the PRF of stream A (and B) with the key's words as
scalars (the Philox key schedule stays in uniform registers), r = 2^24 - (word >> 8) as a
float32 whose bits pick the buckets, the chord bounds summed in int64, each token's level
(the larger of its streams') into a histogram, and at the end ``gof`` from the cumulative
counts over all levels at once. Contexts arrive as padded columns (int32 [4 * blocks, P],
:func:`watermark.keyscan_cpu.context_columns`'s words), so every load is coalesced.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from watermark import keyscan
from watermark.kernels.philox import CONTEXT_DOMAIN, TOKEN_DOMAIN, philox

CHORD_SHIFT = tl.constexpr(keyscan.CHORD_SHIFT)
CHORD_BASE = tl.constexpr(keyscan.FLOAT_ONE_BITS << keyscan.CHORD_BITS)
LEVEL_SHIFT = tl.constexpr(keyscan.LEVEL_SHIFT)
LEVEL_BASE = tl.constexpr(keyscan.FLOAT_ONE_BITS << keyscan.LEVEL_BITS)
FRAC_MASK = tl.constexpr(keyscan.FRAC_MASK)
MANTISSA_ONE = tl.constexpr(keyscan.MANTISSA_ONE)
LEVELS = tl.constexpr(keyscan.LEVELS)
PADDING_LEVEL = tl.constexpr(keyscan.LEVELS - 1)
FRACTION_BITS = tl.constexpr(keyscan.FRACTION_BITS)
STATS = tl.constexpr(len(keyscan.STATS))


@triton.jit
def _r_bits(cols, toks, offs, mask, count, width, k0, k1, BLOCKS: tl.constexpr):
    """float32 bits of r = 2^24 - (word >> 8) for positions ``offs`` [BLOCK] under the key
    (k0, k1) (uint32 scalars)."""
    e0 = tl.load(cols + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
    e1 = tl.load(cols + count + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
    e2 = tl.load(cols + 2 * count + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
    e3 = tl.load(cols + 3 * count + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
    s0, s1, s2, s3 = philox(e0 ^ CONTEXT_DOMAIN, e1 ^ tl.full([], width, tl.int32).to(tl.uint32), e2, e3, k0, k1)
    for b in tl.static_range(1, BLOCKS):
        base = cols + 4 * b * count
        e0 = tl.load(base + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
        e1 = tl.load(base + count + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
        e2 = tl.load(base + 2 * count + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
        e3 = tl.load(base + 3 * count + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
        s0, s1, s2, s3 = philox(s0 ^ e0, s1 ^ e1, s2 ^ e2, s3 ^ e3, k0 ^ (4 * b), k1)
    t = tl.load(toks + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
    w0, w1, w2, w3 = philox(t >> 2, s0, s1, s2, k0 ^ s3, k1 ^ TOKEN_DOMAIN)
    lane = t & 3
    w = tl.where(lane == 0, w0, w1)
    w = tl.where(lane == 2, w2, w)
    w = tl.where(lane == 3, w3, w)
    r = MANTISSA_ONE - (w >> 8).to(tl.int32)
    return r.to(tl.float32).to(tl.int32, bitcast=True)


@triton.jit
def _chord(a_ptr, d_ptr, bits):
    """The chord bound (int64 fixed point) of float32 bits of r."""
    index = (bits >> CHORD_SHIFT) - CHORD_BASE
    low = (bits & FRAC_MASK).to(tl.int64)
    return tl.load(a_ptr + index) - ((tl.load(d_ptr + index) * low) >> CHORD_SHIFT)


# Integer arguments are not specialised: Triton would make a value of 1 (a context width of
# one, one key) a constant, a different kernel for no gain.
@triton.jit(do_not_specialize=["count", "key_count", "width", "level_count"])
def _keyscan_kernel(keys_ptr, cols, toks, offsets_ptr, out_ptr, chord_ptr, levels_ptr, gof_ptr, xlnx_ptr,
                    count, key_count, width, level_count,
                    DUAL: tl.constexpr, BLOCKS: tl.constexpr, KEYS: tl.constexpr, BLOCK: tl.constexpr,
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
            key_a = tl.load(keys_ptr + 2 * key)
            a0 = key_a.to(tl.uint32)
            a1 = (key_a >> 32).to(tl.uint32)
            key_b = tl.load(keys_ptr + 2 * key + 1)
            b0 = key_b.to(tl.uint32)
            b1 = (key_b >> 32).to(tl.uint32)
            sum_a = tl.zeros([BLOCK], dtype=tl.int64)
            sum_b = tl.zeros([BLOCK], dtype=tl.int64)
            sum_max = tl.zeros([BLOCK], dtype=tl.int64)
            hist = tl.zeros([LEVELS], dtype=tl.int32)
            for tile in range(start, stop, BLOCK):
                offs = tile + lane
                mask = offs < stop
                bits_a = _r_bits(cols, toks, offs, mask, count, width, a0, a1, BLOCKS)
                sum_a += tl.where(mask, _chord(chord_ptr, chord_ptr + CHORD_BUCKETS, bits_a), 0)
                levels = tl.load(levels_ptr + (bits_a >> LEVEL_SHIFT) - LEVEL_BASE).to(tl.int32)
                if DUAL:
                    bits_b = _r_bits(cols, toks, offs, mask, count, width, b0, b1, BLOCKS)
                    sum_b += tl.where(mask, _chord(chord_ptr, chord_ptr + CHORD_BUCKETS, bits_b), 0)
                    max_a = _chord(chord_ptr + 2 * CHORD_BUCKETS, chord_ptr + 3 * CHORD_BUCKETS, bits_a)
                    max_b = _chord(chord_ptr + 2 * CHORD_BUCKETS, chord_ptr + 3 * CHORD_BUCKETS, bits_b)
                    sum_max += tl.where(mask, tl.maximum(max_a, max_b), 0)
                    levels_b = tl.load(levels_ptr + LEVEL_BUCKETS + (bits_b >> LEVEL_SHIFT) - LEVEL_BASE).to(tl.int32)
                    levels = tl.maximum(levels, levels_b)
                hist += tl.histogram(tl.where(mask, levels, PADDING_LEVEL), LEVELS)
            # gof: over every level k at once, the group of threshold k + 1 (see keyscan).
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


class DeviceTables:
    """:class:`watermark.keyscan.ScanTables` on a device, made once per table set."""

    def __init__(self, tables: keyscan.ScanTables, device: torch.device) -> None:
        self.chord = torch.as_tensor(tables.chord.reshape(-1), device=device)
        self.levels = torch.as_tensor(tables.levels.reshape(-1), device=device)
        self.gof = torch.as_tensor(tables.gof.reshape(-1), device=device)
        self.xlnx = torch.as_tensor(tables.xlnx, device=device)
        self.level_count = int(tables.level_count)


def scan_stats(keys_a: torch.Tensor, keys_b: torch.Tensor | None, columns: torch.Tensor, tokens: torch.Tensor,
               offsets: torch.Tensor, width: int, tables: DeviceTables, *, keys_per_program: int = 4,
               block: int = 256, num_warps: int = 4) -> torch.Tensor:
    """int64 statistics [T, K, 4] (``keyscan.STATS``) of keys [K] (int64 bit patterns of the
    uint64 PRF keys of stream A; ``keys_b`` stream B or None) over the texts' scored
    positions: ``columns`` int32 [4 * blocks, P] (the PRF words of the padded contexts,
    :func:`watermark.keyscan_cpu.context_columns` as int32), ``tokens`` int32 [P] (token
    ids mod 2^32), ``offsets`` int64 [T + 1]; ``width`` the context width."""
    device = columns.device
    key_count = int(keys_a.shape[0])
    texts = int(offsets.shape[0]) - 1
    out = torch.empty((max(texts, 0), key_count, len(keyscan.STATS)), dtype=torch.int64, device=device)
    if texts <= 0 or key_count == 0:
        return out
    if int(columns.shape[0]) % 4:
        raise ValueError("columns must hold whole blocks of four context words")
    keys = torch.stack([keys_a, keys_b if keys_b is not None else keys_a], dim=1).to(torch.int64).contiguous()
    grid = (texts, triton.cdiv(key_count, keys_per_program))
    _keyscan_kernel[grid](keys, columns.contiguous(), tokens.contiguous(), offsets.contiguous(), out, tables.chord,
                          tables.levels, tables.gof, tables.xlnx, int(tokens.shape[0]), key_count, width,
                          tables.level_count, DUAL=keys_b is not None, BLOCKS=int(columns.shape[0]) // 4,
                          KEYS=keys_per_program, BLOCK=block, CHORD_BUCKETS=keyscan.CHORD_BUCKETS,
                          LEVEL_BUCKETS=keyscan.LEVEL_BUCKETS, num_warps=num_warps)
    return out
