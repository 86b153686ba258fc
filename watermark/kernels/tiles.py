"""Tile layout, loads and small lane helpers shared by the race, argmax and verification kernels.

A tile is LANES Philox counters c (BLOCK = 4 LANES tokens); token 4c + j takes output word j
of counter c. Every per-token quantity is kept as four vectors over c (x0..x3), all in
the counters' layout, so the words never move between threads (a join/reshape into a
flat [BLOCK] tile made the compiler shuffle them through shared memory three times per
tile). Loads are [BLOCK / 4, 4] tiles split in registers into the four lanes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from watermark.kernels import philox

NEG_INF = tl.constexpr(float("-inf"))
POS_INF = tl.constexpr(float("inf"))
BIG_INDEX = tl.constexpr(2**31 - 1)


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
def tile_counters(tile, BLOCK: tl.constexpr):
    """The tile's Philox counters c (int32 [BLOCK / 4]); its tokens are 4c + 0..3."""
    return tile * (BLOCK // 4) + tl.arange(0, BLOCK // 4)


@triton.jit
def tile_words(c, s0, s1, s2, k0, k1):
    """Words of tokens 4c + 0..3; k0/k1 already mixed with the state (k0 ^ s3, k1 ^ TOKEN_DOMAIN)."""
    return philox.philox(c.to(tl.uint32), s0, s1, s2, k0, k1)


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
def first_tile(row_ptr, tile_begin, tile_end, vocab, fill, BLOCK: tl.constexpr):
    """Prefetch of a chunk's first whole tile; kernels issue it before their scalar
    prologue (keys, routing coin, context state) so that memory latency overlaps it."""
    return load_next(row_ptr, tile_begin, tl.minimum(tile_end, vocab // BLOCK), fill, BLOCK)


@triton.jit
def chunk_start(logits_ptr, stride_row, vocab, scratch_ptr, tiles_per_block, nblk, BLOCK: tl.constexpr,
                STRIDE_MULT: tl.constexpr):
    """The common start of the vocabulary kernels (grid: rows x programs per row): the
    program's row and chunk, the row's pointer, its tiles [tile_begin, tile_end), the
    chunk's first tile prefetched (x0..x3, :func:`first_tile`: issued before the caller's
    scalar prologue) and its compaction scratch (2 * BLOCK words)."""
    row = tl.program_id(0)
    blk = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * (stride_row * STRIDE_MULT)
    tile_begin = blk * tiles_per_block
    tile_end = tl.minimum(tile_begin + tiles_per_block, tl.cdiv(vocab, BLOCK))
    x0, x1, x2, x3 = first_tile(row_ptr, tile_begin, tile_end, vocab, float("-inf"), BLOCK)
    scratch = scratch_ptr + (row.to(tl.int64) * nblk + blk) * (2 * BLOCK)
    return row, blk, row_ptr, tile_begin, tile_end, x0, x1, x2, x3, scratch
