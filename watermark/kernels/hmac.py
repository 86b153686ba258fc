"""``hmac-sha256-philox-v1`` in Triton: SHA-256 building blocks, the rows' HMAC setup, and the
fused sampler with 256-bit keys (references: :mod:`watermark.prf.hmac_philox`,
:func:`watermark.sampler.sample_reference`).

A step is two launches:

1. :func:`_hmac_routed_kernel` -- for a block of rows at once (rows are the lanes), HMAC-SHA-256
   of each row's context under the midstates of the key the row routes to (the sampler's own
   coin, drawn again here): two SHA-256 compressions for a context of width <= 6, three for
   7..16. Out: per row the routed key's context Philox key and state. (:func:`hmac_rows`, which
   derives both keys' of every row, is what verification needs; the sampler needs one: at
   B = 256 the second key's chain was most of the step's cost over Philox's.)
2. :func:`_gumbel_sample_hmac_kernel` -- :mod:`watermark.kernels.gumbel`'s fused sampler
   step with one change: a watermarked 256-bit row takes its routed key's (key, state) from
   step 1 instead of computing Philox's context state. 64-bit rows of the same batch run
   exactly as there. The vocabulary pass (the race) is Philox's, so its cost is unchanged.

Words are ``tl.uint32``; Triton wraps uint32 arithmetic mod 2^32, as SHA-256 needs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from watermark import stream
from watermark.prf import hmac_compiled, sha256
from watermark.kernels import geometry, launch, philox, race, reduction, tiles
from watermark.kernels.gumbel import (DEFAULT_CONFIG, LaunchConfig, _no_spec, _row_tensor, _vocab_rows,
                                      compile_time_args, flags_int8, stride_mult)
from watermark.processing import MIN_TEMPERATURE
from watermark.results import ROUTE_GREEDY, ROUTE_KEY_A, ROUTE_KEY_B, ROUTE_PLAIN, SampleResult

_D = [int(w) for w in hmac_compiled._HP_DOMAIN]
D0, D1, D2, D3, D4, D5 = (tl.constexpr(w) for w in _D)
PAD = tl.constexpr(0x80000000)
OUTER_BITS = tl.constexpr((64 + 32) * 8)
LANE_ROUTE = tl.constexpr(stream.LANE_ROUTE)
R_GREEDY = tl.constexpr(ROUTE_GREEDY)
R_PLAIN = tl.constexpr(ROUTE_PLAIN)
R_KEY_A = tl.constexpr(ROUTE_KEY_A)
R_KEY_B = tl.constexpr(ROUTE_KEY_B)
MIN_T = tl.constexpr(MIN_TEMPERATURE)
ROWS = 32
"""Rows per program of the HMAC setup (its lanes)."""


@triton.jit
def _rotr(x, n: tl.constexpr):
    return (x >> n) | (x << (32 - n))


@triton.jit
def compress(k_ptr, h0, h1, h2, h3, h4, h5, h6, h7,
             w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15):
    """One SHA-256 compression (FIPS 180-4) of the block w0..w15 into state h0..h7 (uint32
    blocks of one shape: the rounds are a run-time loop whose 24 carried values keep their
    type); ``k_ptr``: the 64 round constants (uint32). The message schedule rolls through the
    16 words (w0 is the round's word).

    A run-time loop, not ``tl.static_range``: unrolled, every compression was 64 copies of
    the round and a kernel with four to six of them took minutes to compile on the device
    (the first H100 run's 256-bit stages timed out in their compiles, main 9d1098a)."""
    a, b, c, d, e, f, g, h = h0, h1, h2, h3, h4, h5, h6, h7
    for i in range(64):
        t1 = h + (_rotr(e, 6) ^ _rotr(e, 11) ^ _rotr(e, 25)) + ((e & f) ^ (~e & g)) + tl.load(k_ptr + i) + w0
        t2 = (_rotr(a, 2) ^ _rotr(a, 13) ^ _rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))
        h, g, f, e, d, c, b, a = g, f, e, d + t1, c, b, a, t1 + t2
        nxt = (w0 + (_rotr(w1, 7) ^ _rotr(w1, 18) ^ (w1 >> 3)) + w9
               + (_rotr(w14, 17) ^ _rotr(w14, 19) ^ (w14 >> 10)))
        w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15 = (
            w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, nxt)
    return h0 + a, h1 + b, h2 + c, h3 + d, h4 + e, h5 + f, h6 + g, h7 + h


@triton.jit
def _mid(mids_ptr, rows, mask, i: tl.constexpr):
    return tl.load(mids_ptr + rows * 16 + i, mask=mask, other=0).to(tl.uint32)


@triton.jit
def _word(ctx_ptr, ctx_stride, rows, mask, width, g: tl.constexpr, nwords):
    """Word g of the padded inner message of each row (rows' lanes): domain, width, context
    entries mod 2^32, the 0x80 pad word, zeros, and the bit length in the last word of its block."""
    if g < 6:
        v = tl.full(rows.shape, 0, tl.uint32) + (D0 if g == 0 else D1 if g == 1 else D2 if g == 2 else
                                                  D3 if g == 3 else D4 if g == 4 else D5)
    elif g == 6:
        v = width.to(tl.uint32)
    else:
        e = g - 7
        entry = tl.load(ctx_ptr + rows.to(tl.int64) * ctx_stride + e, mask=mask & (e < width), other=0)
        v = tl.where(e < width, entry.to(tl.uint32), tl.where(e == width, PAD, 0).to(tl.uint32))
    if g % 16 == 15:
        last = (nwords + 2) // 16 * 16 + 15  # the padded message's last word
        v = tl.where(g == last, ((64 + 4 * nwords) * 8).to(tl.uint32), v)
    return v


@triton.jit
def _block(k_ptr, ctx_ptr, ctx_stride, rows, mask, width, nwords, st0, st1, st2, st3, st4, st5, st6, st7,
           B: tl.constexpr):
    return compress(k_ptr, st0, st1, st2, st3, st4, st5, st6, st7,
                    _word(ctx_ptr, ctx_stride, rows, mask, width, 16 * B + 0, nwords),
                    _word(ctx_ptr, ctx_stride, rows, mask, width, 16 * B + 1, nwords),
                    _word(ctx_ptr, ctx_stride, rows, mask, width, 16 * B + 2, nwords),
                    _word(ctx_ptr, ctx_stride, rows, mask, width, 16 * B + 3, nwords),
                    _word(ctx_ptr, ctx_stride, rows, mask, width, 16 * B + 4, nwords),
                    _word(ctx_ptr, ctx_stride, rows, mask, width, 16 * B + 5, nwords),
                    _word(ctx_ptr, ctx_stride, rows, mask, width, 16 * B + 6, nwords),
                    _word(ctx_ptr, ctx_stride, rows, mask, width, 16 * B + 7, nwords),
                    _word(ctx_ptr, ctx_stride, rows, mask, width, 16 * B + 8, nwords),
                    _word(ctx_ptr, ctx_stride, rows, mask, width, 16 * B + 9, nwords),
                    _word(ctx_ptr, ctx_stride, rows, mask, width, 16 * B + 10, nwords),
                    _word(ctx_ptr, ctx_stride, rows, mask, width, 16 * B + 11, nwords),
                    _word(ctx_ptr, ctx_stride, rows, mask, width, 16 * B + 12, nwords),
                    _word(ctx_ptr, ctx_stride, rows, mask, width, 16 * B + 13, nwords),
                    _word(ctx_ptr, ctx_stride, rows, mask, width, 16 * B + 14, nwords),
                    _word(ctx_ptr, ctx_stride, rows, mask, width, 16 * B + 15, nwords))


@triton.jit
def context_hmac(k_ptr, mids_ptr, ctx_ptr, ctx_stride, rows, mask, width):
    """Digest words d0..d5 of each row's context HMAC (rows' lanes; widths 1..16)."""
    return _context_hmac_of(k_ptr, ctx_ptr, ctx_stride, rows, mask, width,
                            _mid(mids_ptr, rows, mask, 0), _mid(mids_ptr, rows, mask, 1),
                            _mid(mids_ptr, rows, mask, 2), _mid(mids_ptr, rows, mask, 3),
                            _mid(mids_ptr, rows, mask, 4), _mid(mids_ptr, rows, mask, 5),
                            _mid(mids_ptr, rows, mask, 6), _mid(mids_ptr, rows, mask, 7),
                            _mid(mids_ptr, rows, mask, 8), _mid(mids_ptr, rows, mask, 9),
                            _mid(mids_ptr, rows, mask, 10), _mid(mids_ptr, rows, mask, 11),
                            _mid(mids_ptr, rows, mask, 12), _mid(mids_ptr, rows, mask, 13),
                            _mid(mids_ptr, rows, mask, 14), _mid(mids_ptr, rows, mask, 15))


@triton.jit
def _routed_mid(mids_a_ptr, mids_b_ptr, use_b, rows, mask, i: tl.constexpr):
    # Each row's routed key's word: two masked loads, one of which reads nothing.
    a = tl.load(mids_a_ptr + rows * 16 + i, mask=mask & ~use_b, other=0)
    b = tl.load(mids_b_ptr + rows * 16 + i, mask=mask & use_b, other=0)
    return (a + b).to(tl.uint32)


@triton.jit
def _context_hmac_of(k_ptr, ctx_ptr, ctx_stride, rows, mask, width, m0, m1, m2, m3, m4, m5, m6, m7,
                     m8, m9, m10, m11, m12, m13, m14, m15):
    # m0..m7: the inner padded key block's midstate, m8..m15: the outer's.
    nwords = 7 + width
    s0, s1, s2, s3, s4, s5, s6, s7 = _block(k_ptr, ctx_ptr, ctx_stride, rows, mask, width, nwords,
                                            m0, m1, m2, m3, m4, m5, m6, m7, 0)
    if tl.max(tl.where(mask, width, 0), 0) > 6:  # a second inner block for the rows that need one
        t0, t1, t2, t3, t4, t5, t6, t7 = _block(k_ptr, ctx_ptr, ctx_stride, rows, mask, width, nwords,
                                                s0, s1, s2, s3, s4, s5, s6, s7, 1)
        two = width > 6
        s0, s1, s2, s3 = tl.where(two, t0, s0), tl.where(two, t1, s1), tl.where(two, t2, s2), tl.where(two, t3, s3)
        s4, s5, s6, s7 = tl.where(two, t4, s4), tl.where(two, t5, s5), tl.where(two, t6, s6), tl.where(two, t7, s7)
    zero = tl.full(rows.shape, 0, tl.uint32)
    o0, o1, o2, o3, o4, o5, o6, o7 = compress(
        k_ptr, m8, m9, m10, m11, m12, m13, m14, m15,
        s0, s1, s2, s3, s4, s5, s6, s7, zero + PAD, zero, zero, zero, zero, zero, zero, zero + OUTER_BITS)
    return o0, o1, o2, o3, o4, o5


@triton.jit
def _store_key_state(keys_ptr, states_ptr, rows, mask, slot: tl.constexpr, d0, d1, d2, d3, d4, d5):
    key = d4.to(tl.int64) | (d5.to(tl.int64) << 32)
    tl.store(keys_ptr + rows * 2 + slot, key, mask=mask)
    base = states_ptr + rows * 8 + slot * 4
    tl.store(base, d0.to(tl.int64), mask=mask)
    tl.store(base + 1, d1.to(tl.int64), mask=mask)
    tl.store(base + 2, d2.to(tl.int64), mask=mask)
    tl.store(base + 3, d3.to(tl.int64), mask=mask)


@triton.jit
def _hmac_rows_kernel(k_ptr, mids_a_ptr, mids_b_ptr, ctx_ptr, ctx_stride, width_ptr, batch, keys_ptr, states_ptr,
                      ROWS_PER: tl.constexpr):
    rows = tl.program_id(0) * ROWS_PER + tl.arange(0, ROWS_PER)
    mask = rows < batch
    width = tl.load(width_ptr + rows, mask=mask, other=1)
    d0, d1, d2, d3, d4, d5 = context_hmac(k_ptr, mids_a_ptr, ctx_ptr, ctx_stride, rows, mask, width)
    _store_key_state(keys_ptr, states_ptr, rows, mask, 0, d0, d1, d2, d3, d4, d5)
    d0, d1, d2, d3, d4, d5 = context_hmac(k_ptr, mids_b_ptr, ctx_ptr, ctx_stride, rows, mask, width)
    _store_key_state(keys_ptr, states_ptr, rows, mask, 1, d0, d1, d2, d3, d4, d5)


@triton.jit
def _hmac_routed_kernel(k_ptr, mids_a_ptr, mids_b_ptr, ctx_ptr, ctx_stride, width_ptr, alpha_ptr, wm_ptr, skey_ptr,
                        pos_ptr, batch, keys_ptr, states_ptr, ROWS_PER: tl.constexpr):
    # The sampler's step 1 for the key each row routes to (the same coin as the sampler draws,
    # _gumbel_sample_hmac_kernel), stored in that key's slot: one HMAC a row where
    # _hmac_rows_kernel makes two. The other slot is left unwritten; the sampler never reads it.
    rows = tl.program_id(0) * ROWS_PER + tl.arange(0, ROWS_PER)
    mask = rows < batch
    width = tl.load(width_ptr + rows, mask=mask, other=1)
    alpha = tl.load(alpha_ptr + rows, mask=mask, other=0.0)
    marked = tl.load(wm_ptr + rows, mask=mask, other=0) != 0
    sk0, sk1 = philox.split_key(tl.load(skey_ptr + rows, mask=mask, other=0))
    r0, r1, r2, r3 = philox.stream_state(sk0, sk1, tl.load(pos_ptr + rows, mask=mask, other=0), LANE_ROUTE)
    coin = philox.uniform(philox.token_word(tl.zeros(rows.shape, tl.int32), r0, r1, r2, r3, sk0, sk1))
    use_b = marked & (alpha > 0.0) & (coin < alpha)
    d0, d1, d2, d3, d4, d5 = _context_hmac_of(
        k_ptr, ctx_ptr, ctx_stride, rows, mask, width,
        _routed_mid(mids_a_ptr, mids_b_ptr, use_b, rows, mask, 0),
        _routed_mid(mids_a_ptr, mids_b_ptr, use_b, rows, mask, 1),
        _routed_mid(mids_a_ptr, mids_b_ptr, use_b, rows, mask, 2),
        _routed_mid(mids_a_ptr, mids_b_ptr, use_b, rows, mask, 3),
        _routed_mid(mids_a_ptr, mids_b_ptr, use_b, rows, mask, 4),
        _routed_mid(mids_a_ptr, mids_b_ptr, use_b, rows, mask, 5),
        _routed_mid(mids_a_ptr, mids_b_ptr, use_b, rows, mask, 6),
        _routed_mid(mids_a_ptr, mids_b_ptr, use_b, rows, mask, 7),
        _routed_mid(mids_a_ptr, mids_b_ptr, use_b, rows, mask, 8),
        _routed_mid(mids_a_ptr, mids_b_ptr, use_b, rows, mask, 9),
        _routed_mid(mids_a_ptr, mids_b_ptr, use_b, rows, mask, 10),
        _routed_mid(mids_a_ptr, mids_b_ptr, use_b, rows, mask, 11),
        _routed_mid(mids_a_ptr, mids_b_ptr, use_b, rows, mask, 12),
        _routed_mid(mids_a_ptr, mids_b_ptr, use_b, rows, mask, 13),
        _routed_mid(mids_a_ptr, mids_b_ptr, use_b, rows, mask, 14),
        _routed_mid(mids_a_ptr, mids_b_ptr, use_b, rows, mask, 15))
    slot = use_b.to(tl.int64)
    tl.store(keys_ptr + rows * 2 + slot, d4.to(tl.int64) | (d5.to(tl.int64) << 32), mask=mask)
    base = states_ptr + rows * 8 + slot * 4
    tl.store(base, d0.to(tl.int64), mask=mask)
    tl.store(base + 1, d1.to(tl.int64), mask=mask)
    tl.store(base + 2, d2.to(tl.int64), mask=mask)
    tl.store(base + 3, d3.to(tl.int64), mask=mask)


_K_CACHE: dict = {}


def round_constants(device: torch.device) -> torch.Tensor:
    """SHA-256's 64 round constants on ``device`` (uint32 held in int64 is not needed: int32 bits)."""
    key = str(device)
    if key not in _K_CACHE:
        _K_CACHE[key] = torch.tensor([k - 2**32 if k >= 2**31 else k for k in sha256.K], dtype=torch.int32,
                                     device=device)
    return _K_CACHE[key]


def hmac_rows(mids_a: torch.Tensor, mids_b: torch.Tensor, contexts: torch.Tensor,
              widths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row and key (A, B): the context's Philox key [B, 2] int64 and state [B, 2, 4] int64,
    from midstates [B, 16] (int64 holding uint32 words) and contexts [B, C] with widths [B]."""
    batch = contexts.shape[0]
    device = contexts.device
    keys = torch.empty((batch, 2), dtype=torch.int64, device=device)
    states = torch.empty((batch, 2, 4), dtype=torch.int64, device=device)
    if batch:
        contexts = contexts.to(torch.int64)
        if contexts.stride(1) != 1:
            contexts = contexts.contiguous()
        launch.launch(_hmac_rows_kernel, "hmac_rows", (triton.cdiv(batch, ROWS),), (
            round_constants(device), mids_a.to(torch.int64).contiguous(), mids_b.to(torch.int64).contiguous(),
            contexts, contexts.stride(0), _row_tensor(widths, batch, torch.int32, device, "widths"), batch,
            keys, states), constexprs=dict(ROWS_PER=ROWS))
    return keys, states


_SAMPLE_ARGS = ["logits_ptr", "stride_row", "vocab", "temp_ptr", "key_a_ptr", "key_b_ptr", "alpha_ptr", "ctx_ptr",
                "ctx_stride", "width_ptr", "wm_ptr", "skey_ptr", "pos_ptr", "lane", "wide_ptr", "hkeys_ptr",
                "hstates_ptr", "tokens_ptr", "routes_ptr", "part_s_ptr", "part_i_ptr", "count_ptr", "scratch_ptr",
                "tiles_per_block", "nblk"]


@triton.jit(do_not_specialize=_no_spec(_SAMPLE_ARGS) + ["wide_ptr", "hkeys_ptr", "hstates_ptr"])
def _gumbel_sample_hmac_kernel(logits_ptr, stride_row, vocab, temp_ptr, key_a_ptr, key_b_ptr, alpha_ptr, ctx_ptr,
                               ctx_stride, width_ptr, wm_ptr, skey_ptr, pos_ptr, lane, wide_ptr, hkeys_ptr,
                               hstates_ptr, tokens_ptr, routes_ptr, part_s_ptr, part_i_ptr, count_ptr, scratch_ptr,
                               tiles_per_block, nblk, BLOCK: tl.constexpr, STRIDE_MULT: tl.constexpr,
                               NB: tl.constexpr, COMPACT: tl.constexpr):
    row, blk, row_ptr, tile_begin, tile_end, x0, x1, x2, x3, scratch = tiles.chunk_start(
        logits_ptr, stride_row, vocab, scratch_ptr, tiles_per_block, nblk, BLOCK, STRIDE_MULT)

    temperature = tl.load(temp_ptr + row)
    greedy = temperature == 0.0
    temperature = tl.where(greedy, temperature, tl.maximum(temperature, MIN_T))
    marked = tl.load(wm_ptr + row) != 0
    alpha = tl.load(alpha_ptr + row)
    sk0, sk1 = philox.split_key(tl.load(skey_ptr + row))
    position = tl.load(pos_ptr + row)

    use_b = tl.full([], 0, tl.int1)
    if marked & (alpha > 0.0):
        r0, r1, r2, r3 = philox.stream_state(sk0, sk1, position, LANE_ROUTE)
        coin = philox.uniform(philox.token_word(tl.full([], 0, tl.int32), r0, r1, r2, r3, sk0, sk1))
        use_b = coin < alpha
    route = tl.where(use_b, R_KEY_B, R_KEY_A)
    route = tl.where(marked, route, R_PLAIN)
    route = tl.where(greedy, R_GREEDY, route)

    if greedy:
        best_s, best_i = race.argmax_chunk_from(row_ptr, x0, x1, x2, x3, tile_begin, tile_end, vocab, BLOCK)
    else:
        if marked:
            if tl.load(wide_ptr + row) != 0:
                # The routed key's HMAC-derived Philox key and state (step 1, _hmac_rows_kernel).
                slot = use_b.to(tl.int64)
                k0, k1 = philox.split_key(tl.load(hkeys_ptr + row.to(tl.int64) * 2 + slot))
                base = hstates_ptr + row.to(tl.int64) * 8 + slot * 4
                s0 = tl.load(base).to(tl.uint32)
                s1 = tl.load(base + 1).to(tl.uint32)
                s2 = tl.load(base + 2).to(tl.uint32)
                s3 = tl.load(base + 3).to(tl.uint32)
            else:
                key = tl.where(use_b, tl.load(key_b_ptr + row), tl.load(key_a_ptr + row))
                k0, k1 = philox.split_key(key)
                s0, s1, s2, s3 = philox.context_state(ctx_ptr + row.to(tl.int64) * ctx_stride,
                                                      tl.load(width_ptr + row), k0, k1)
        else:
            k0 = sk0
            k1 = sk1
            s0, s1, s2, s3 = philox.stream_state(sk0, sk1, position, lane)
        best_s, best_i = race.log_race_chunk(row_ptr, x0, x1, x2, x3, tile_begin, tile_end, vocab, temperature,
                                             temperature != 1.0, s0, s1, s2, s3, k0, k1, scratch, BLOCK, COMPACT)

    last, score, token = reduction.combine_blocks(part_s_ptr, part_i_ptr, count_ptr, row, blk, nblk, best_s, best_i, NB)
    if last:
        token = tl.where(score == tiles.NEG_INF, 0, token)
        tl.store(tokens_ptr + row, token.to(tl.int64))
        tl.store(routes_ptr + row, route.to(tl.int8))


def gumbel_sample_hmac(logits: torch.Tensor, *, temperature: torch.Tensor, key_a: torch.Tensor, key_b: torch.Tensor,
                       mids_a: torch.Tensor, mids_b: torch.Tensor, wide: torch.Tensor, alpha: torch.Tensor,
                       contexts: torch.Tensor, widths: torch.Tensor, watermark: torch.Tensor,
                       stream_keys: torch.Tensor, positions: torch.Tensor, lane: int = stream.LANE_SAMPLE,
                       config: LaunchConfig = DEFAULT_CONFIG, blocks_per_row: int | None = None) -> SampleResult:
    """:func:`watermark.kernels.gumbel.gumbel_sample` for a batch that may hold 256-bit rows:
    ``wide`` [B] bool marks them, ``mids_a`` / ``mids_b`` [B, 16] hold their keys' HMAC
    midstates (their key_a / key_b are not read). Same tokens and routes as
    ``watermark.sampler.sample_reference`` on the same rows. Two launches (module docstring)."""
    values = _vocab_rows(logits, "logits")
    batch, vocab = values.shape
    device = values.device
    tokens = torch.empty(batch, dtype=torch.int64, device=device)
    routes = torch.empty(batch, dtype=torch.int8, device=device)
    if batch == 0:
        return SampleResult(tokens=tokens, routes=routes)
    if vocab == 0:
        raise ValueError("the vocabulary must hold at least one token")
    contexts = torch.as_tensor(contexts, device=device).to(torch.int64)
    if contexts.dim() != 2 or contexts.shape[0] != batch or contexts.shape[1] < 1:
        raise ValueError(f"contexts must be [{batch}, C] (padded to the widest context)")
    if contexts.stride(1) != 1:
        contexts = contexts.contiguous()
    widths = _row_tensor(widths, batch, torch.int32, device, "widths")
    alpha = _row_tensor(alpha, batch, torch.float32, device, "alpha")
    marks = flags_int8(watermark, (batch,), device, "watermark")
    stream_keys = _row_tensor(stream_keys, batch, torch.int64, device, "stream_keys")
    positions = _row_tensor(positions, batch, torch.int64, device, "positions")
    hkeys = torch.empty((batch, 2), dtype=torch.int64, device=device)
    hstates = torch.empty((batch, 2, 4), dtype=torch.int64, device=device)
    launch.launch(_hmac_routed_kernel, "hmac_routed", (triton.cdiv(batch, ROWS),), (
        round_constants(device), mids_a.to(torch.int64).contiguous(), mids_b.to(torch.int64).contiguous(),
        contexts, contexts.stride(0), widths, alpha, marks, stream_keys, positions, batch, hkeys, hstates),
        constexprs=dict(ROWS_PER=ROWS))
    per_block, nblk = geometry.split_rows(batch, vocab, config.block, device, config.programs_per_sm, blocks_per_row)
    ws = reduction.workspace(device, batch, batch * nblk, batch * nblk * 2 * config.block)
    mult = stride_mult(values)
    constexprs, options = compile_time_args(config, mult)
    launch.launch(_gumbel_sample_hmac_kernel, "gumbel_sample_hmac", (batch, nblk), (
        values, values.stride(0) // mult, vocab,
        _row_tensor(temperature, batch, torch.float32, device, "temperature"),
        _row_tensor(key_a, batch, torch.int64, device, "key_a"),
        _row_tensor(key_b, batch, torch.int64, device, "key_b"),
        alpha, contexts, contexts.stride(0), widths, marks, stream_keys, positions, lane,
        flags_int8(wide, (batch,), device, "wide"), hkeys, hstates,
        tokens, routes, ws.scores, ws.tokens, ws.counters, ws.scratch, per_block, nblk),
        dtype=values.dtype, constexprs=constexprs, options=options, aligned=(values,))
    return SampleResult(tokens=tokens, routes=routes)
