"""The fused sampler with a row bound, for large batches (reference: :mod:`watermark.pruning`).

Not dispatched: on the H200 it measured slower than :func:`watermark.kernels.gumbel.gumbel_sample`
in every configuration (NOTES.md, iteration 4); kept, with its parity tests and benchmark
section, as the starting point of the next attempt.

Same inputs and tokens as :func:`watermark.kernels.gumbel.gumbel_sample`; the work differs.
On peaked rows (Zipf-like: a few per cent of the vocabulary can win) most of the dense
kernel's time goes to PRF words and noise of tokens that cannot win, and the running best
of a chunk only becomes a good pruning floor late in the chunk. Here every chunk is read
twice: pass A takes the chunk's first argmax (no PRF), computes that token's exact score
and publishes it as the row's bound (an atomic maximum); pass B races only the tokens
above the floor of the best bound published so far (:func:`watermark.pruning.prune_floor`),
queued and raced BLOCK / 4 at a time (:func:`watermark.kernels.race.queue_append`), or
densely where a tile is mostly live (N(0, 1) rows).

To read the logits from device memory only once, a persistent grid keeps ``groups`` rows
in flight, ``nblk`` programs (one chunk of tiles each) per row: program p handles rows
g, g + groups, ... (g = p // nblk), and iteration k runs pass A of its k-th row
interleaved, tile by tile, with pass B of its (k-1)-th row, whose tiles were read one
iteration earlier and are still in L2 (groups x 2 rows of logits, a few tens of MB). By the
time pass B starts, the other programs of the row have usually published their bounds
too; whatever is published when a tile is raced is used (no waiting), and any published
value is an exact score of a token of the row, so the tokens are the same whatever the
timing. The last program to merge a row (:func:`watermark.kernels.reduction.combine_blocks`)
resets its bound to -inf for the next launch. A program whose last pass B was mostly dense
skips the next pass A (N(0, 1) rows gain nothing from a bound).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from watermark import pruning, stream
from watermark.processing import MIN_TEMPERATURE
from watermark.kernels import geometry, launch, philox, race, reduction, tiles
from watermark.kernels.approximation import exact_noise
from watermark.results import ROUTE_GREEDY, ROUTE_KEY_A, ROUTE_KEY_B, ROUTE_PLAIN, SampleResult

LANE_ROUTE = tl.constexpr(stream.LANE_ROUTE)
R_GREEDY = tl.constexpr(ROUTE_GREEDY)
R_PLAIN = tl.constexpr(ROUTE_PLAIN)
R_KEY_A = tl.constexpr(ROUTE_KEY_A)
R_KEY_B = tl.constexpr(ROUTE_KEY_B)
MIN_T = tl.constexpr(MIN_TEMPERATURE)
NOISE_BOUND = tl.constexpr(pruning.NOISE_BOUND)
FLOOR_ROUNDING = tl.constexpr(pruning.FLOOR_ROUNDING)
NEG_INF = tiles.NEG_INF
BIG_INDEX = tiles.BIG_INDEX


@triton.jit
def row_prologue(row, temp_ptr, key_a_ptr, key_b_ptr, alpha_ptr, ctx_ptr, ctx_stride, width_ptr, wm_ptr, skey_ptr,
                 pos_ptr, lane):
    """A row's temperature, greedy flag, route and race state (s0..s3, k0 ^ s3, k1 ^
    TOKEN_DOMAIN), exactly as gumbel_sample's prologue: the routing coin from the request's
    stream, then the routed key's context state or the stream state of unwatermarked rows."""
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
    route = tl.where(greedy, R_GREEDY, route).to(tl.int32)
    if marked:
        key = tl.where(use_b, tl.load(key_b_ptr + row), tl.load(key_a_ptr + row))
        k0, k1 = philox.split_key(key)
        s0, s1, s2, s3 = philox.context_state(ctx_ptr + row.to(tl.int64) * ctx_stride, tl.load(width_ptr + row),
                                              k0, k1)
    else:
        k0 = sk0
        k1 = sk1
        s0, s1, s2, s3 = philox.stream_state(sk0, sk1, position, lane)
    return temperature, greedy, route, s0, s1, s2, k0 ^ s3, k1 ^ philox.TOKEN_DOMAIN


@triton.jit
def bound_score(best_v, best_i, temperature, s0, s1, s2, kk0, kk1):
    """Exact score of token ``best_i`` (its cleaned raw logit ``best_v``): fl32(l + g) with
    l processed as the race processes it and g the reference noise; -inf if best_i is
    BIG_INDEX (a chunk of only -inf / NaN)."""
    l = tiles.process(best_v, temperature, temperature != 1.0)
    t = tl.where(best_i == BIG_INDEX, 0, best_i).to(tl.uint32)
    w0, w1, w2, w3 = philox.philox(t >> 2, s0, s1, s2, kk0, kk1)
    j = t & 3
    w = tl.where(j == 0, w0, tl.where(j == 1, w1, tl.where(j == 2, w2, w3)))
    s = l + exact_noise((w >> 8).to(tl.int32))
    return tl.where(best_i == BIG_INDEX, NEG_INF, s)


@triton.jit
def _race_tile(c, x0, x1, x2, x3, bound, temperature, s0, s1, s2, kk0, kk1, run_max, best_s, best_i, fill,
               queue_ptr, n_dense, BLOCK: tl.constexpr):
    """Pass B on one tile: live tokens are those above the floor of max(best exact score,
    published row bound); dense race if more than BLOCK / DENSE_SHARE are live, else queued."""
    l0 = tiles.process(x0, temperature, temperature != 1.0)
    l1 = tiles.process(x1, temperature, temperature != 1.0)
    l2 = tiles.process(x2, temperature, temperature != 1.0)
    l3 = tiles.process(x3, temperature, temperature != 1.0)
    m = tl.maximum(best_s, bound)
    floor = m - NOISE_BOUND - (tl.abs(m) * FLOOR_ROUNDING + FLOOR_ROUNDING)
    live0 = l0 > floor
    live1 = l1 > floor
    live2 = l2 > floor
    live3 = l3 > floor
    n_live = tiles.count4(live0, live1, live2, live3)
    if n_live > BLOCK // race.DENSE_SHARE:
        u0, u1, u2, u3 = tiles.tile_words(c, s0, s1, s2, kk0, kk1)
        run_max, best_s, best_i = race.log_race_tile(c, l0, l1, l2, l3, u0, u1, u2, u3, run_max, best_s, best_i)
        n_dense += 1
    elif n_live > 0:
        fill = race.queue_append(c, l0, l1, l2, l3, live0, live1, live2, live3, fill, queue_ptr, BLOCK)
        if fill >= BLOCK // race.QUEUE_DRAIN:
            run_max, best_s, best_i = race.queue_drain(queue_ptr, fill, s0, s1, s2, kk0, kk1, run_max, best_s,
                                                       best_i, BLOCK, BLOCK // 4)
            fill = 0
    return run_max, best_s, best_i, fill, n_dense


@triton.jit
def _argmax_tile(c, x0, x1, x2, x3, best_v, best_i):
    return race.argmax_tile(c, tiles.process(x0, 1.0, False), tiles.process(x1, 1.0, False),
                            tiles.process(x2, 1.0, False), tiles.process(x3, 1.0, False), best_v, best_i)


_ARGS = ["logits_ptr", "stride_row", "vocab", "batch", "temp_ptr", "key_a_ptr", "key_b_ptr", "alpha_ptr", "ctx_ptr",
         "ctx_stride", "width_ptr", "wm_ptr", "skey_ptr", "pos_ptr", "lane", "tokens_ptr", "routes_ptr",
         "part_s_ptr", "part_i_ptr", "count_ptr", "scratch_ptr", "bound_ptr", "tiles_per_block", "nblk", "groups"]


@triton.jit(do_not_specialize=_ARGS)
def _bounded_sample_kernel(logits_ptr, stride_row, vocab, batch, temp_ptr, key_a_ptr, key_b_ptr, alpha_ptr, ctx_ptr,
                           ctx_stride, width_ptr, wm_ptr, skey_ptr, pos_ptr, lane, tokens_ptr, routes_ptr,
                           part_s_ptr, part_i_ptr, count_ptr, scratch_ptr, bound_ptr, tiles_per_block, nblk, groups,
                           BLOCK: tl.constexpr, STRIDE_MULT: tl.constexpr, NB: tl.constexpr):
    pid = tl.program_id(0)
    blk = pid % nblk
    group = pid // nblk
    tile_begin = blk * tiles_per_block
    tile_end = tl.minimum(tile_begin + tiles_per_block, tl.cdiv(vocab, BLOCK))
    full_end = tl.minimum(tile_end, vocab // BLOCK)
    queue = scratch_ptr + pid.to(tl.int64) * (2 * BLOCK)
    items = tl.cdiv(batch - group, groups)
    stride = stride_row * STRIDE_MULT

    # The row waiting for pass B (iteration k: the row of iteration k - 1).
    p_row = tl.full([], -1, tl.int32)
    p_t = tl.full([], 1.0, tl.float32)
    p_greedy = tl.full([], 0, tl.int1)
    p_route = tl.full([], 0, tl.int32)
    p_s0 = tl.full([], 0, tl.uint32)
    p_s1 = tl.full([], 0, tl.uint32)
    p_s2 = tl.full([], 0, tl.uint32)
    p_k0 = tl.full([], 0, tl.uint32)
    p_k1 = tl.full([], 0, tl.uint32)
    p_bs = tl.full([], NEG_INF, tl.float32)  # own bound: exact score and token (or the greedy argmax)
    p_bi = tl.full([], BIG_INDEX, tl.int32)
    want_bound = tl.full([], 1, tl.int1)

    for k in range(0, items + 1):
        a_row = group + k * groups
        a_ok = k < items
        b_row = p_row
        b_ok = k > 0
        b_race = b_ok & (p_greedy == 0)
        do_a = a_ok & want_bound
        a_ptr = logits_ptr + a_row.to(tl.int64) * stride
        b_ptr = logits_ptr + b_row.to(tl.int64) * stride
        if a_ok:
            temperature, greedy, route, s0, s1, s2, kk0, kk1 = row_prologue(
                a_row, temp_ptr, key_a_ptr, key_b_ptr, alpha_ptr, ctx_ptr, ctx_stride, width_ptr, wm_ptr, skey_ptr,
                pos_ptr, lane)
        else:
            temperature = p_t
            greedy = p_greedy
            route = p_route
            s0 = p_s0
            s1 = p_s1
            s2 = p_s2
            kk0 = p_k0
            kk1 = p_k1
        do_a = do_a | (a_ok & greedy)  # a greedy row's answer is its argmax: always pass A
        best_v = tl.full([], NEG_INF, tl.float32)
        best_a = tl.full([], BIG_INDEX, tl.int32)
        run_max = tl.full([], NEG_INF, tl.float32)
        best_s = p_bs
        best_i = p_bi
        fill = tl.full([], 0, tl.int32)
        n_dense = tl.full([], 0, tl.int32)
        for tile in range(tile_begin, full_end):
            c = tiles.tile_counters(tile, BLOCK)
            xa0, xa1, xa2, xa3 = tiles.load_tile(a_ptr, c, tl.where(do_a, (tile + 1) * BLOCK, 0), NEG_INF, BLOCK)
            xb0, xb1, xb2, xb3 = tiles.load_tile(b_ptr, c, tl.where(b_race, (tile + 1) * BLOCK, 0), NEG_INF, BLOCK)
            if do_a:
                best_v, best_a = _argmax_tile(c, xa0, xa1, xa2, xa3, best_v, best_a)
            if b_race:
                bound = tl.load(bound_ptr + b_row, volatile=True)
                run_max, best_s, best_i, fill, n_dense = _race_tile(c, xb0, xb1, xb2, xb3, bound, p_t, p_s0, p_s1,
                                                                    p_s2, p_k0, p_k1, run_max, best_s, best_i, fill,
                                                                    queue, n_dense, BLOCK)
        if full_end < tile_end:  # the row's last, partial tile
            c = tiles.tile_counters(full_end, BLOCK)
            xa0, xa1, xa2, xa3 = tiles.load_tile(a_ptr, c, tl.where(do_a, vocab, 0), NEG_INF, BLOCK)
            xb0, xb1, xb2, xb3 = tiles.load_tile(b_ptr, c, tl.where(b_race, vocab, 0), NEG_INF, BLOCK)
            if do_a:
                best_v, best_a = _argmax_tile(c, xa0, xa1, xa2, xa3, best_v, best_a)
            if b_race:
                bound = tl.load(bound_ptr + b_row, volatile=True)
                run_max, best_s, best_i, fill, n_dense = _race_tile(c, xb0, xb1, xb2, xb3, bound, p_t, p_s0, p_s1,
                                                                    p_s2, p_k0, p_k1, run_max, best_s, best_i, fill,
                                                                    queue, n_dense, BLOCK)
        if b_race:
            if fill > 0:
                run_max, best_s, best_i = race.queue_drain(queue, fill, p_s0, p_s1, p_s2, p_k0, p_k1, run_max, best_s,
                                                           best_i, BLOCK, BLOCK // 4)
            # A mostly dense pass: this program's rows gain nothing from a bound (N(0, 1)).
            want_bound = n_dense * 2 <= tile_end - tile_begin
        if b_ok:
            last, score, token = reduction.combine_blocks(part_s_ptr, part_i_ptr, count_ptr, b_row, blk, nblk, best_s,
                                                          best_i, NB)
            if last:
                token = tl.where(score == NEG_INF, 0, token)
                tl.store(tokens_ptr + b_row, token.to(tl.int64))
                tl.store(routes_ptr + b_row, p_route.to(tl.int8))
                tl.store(bound_ptr + b_row, NEG_INF)  # every program of the row is past its pass B
        # Pass A's result: greedy rows keep the argmax itself, others its exact score as the
        # bound, published for the row's other programs.
        a_bound = bound_score(best_v, best_a, temperature, s0, s1, s2, kk0, kk1)
        if a_ok & (greedy == 0) & (a_bound > NEG_INF):
            tl.atomic_max(bound_ptr + a_row, a_bound, sem="relaxed")
        p_row = a_row
        p_t = temperature
        p_greedy = greedy
        p_route = route
        p_s0 = s0
        p_s1 = s1
        p_s2 = s2
        p_k0 = kk0
        p_k1 = kk1
        p_bs = tl.where(greedy, best_v, a_bound)
        p_bi = best_a


# --------------------------------------------------------------------------- launcher


@dataclass(frozen=True)
class BoundedConfig:
    """Tile shape and the persistent grid of the bounded sampler."""

    block: int = 2048
    """Tokens per tile (a multiple of 4)."""
    num_warps: int = 4
    rows_in_flight: int = 32
    """Rows whose chunks are raced at once (their logits stay in L2 between the passes:
    2 x rows x V x 4 bytes, 33 MB at 32 rows of 129,280 fp32 logits)."""
    programs_per_sm: int = 4
    reduce_block: int = 64
    maxnreg: int | None = 128

    def launch_options(self) -> dict:
        options = {"num_warps": self.num_warps}
        if self.maxnreg is not None:
            options["maxnreg"] = self.maxnreg
        return options


DEFAULT_BOUNDED = BoundedConfig()


class _Bounds:
    """Per-(device, stream) row bounds, kept at -inf between launches (the kernel resets
    each row's after merging it)."""

    def __init__(self) -> None:
        self.values: dict[tuple, torch.Tensor] = {}

    def get(self, device: torch.device, rows: int) -> torch.Tensor:
        stream_id = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        key = (device.type, device.index, stream_id)
        have = self.values.get(key)
        if have is None or have.numel() < rows:
            size = max(rows, 2 * (0 if have is None else have.numel()))
            self.values[key] = have = torch.full((size,), float("-inf"), dtype=torch.float32, device=device)
        return have


_BOUNDS = _Bounds()


def grid_shape(batch: int, vocab: int, device: torch.device, config: BoundedConfig) -> tuple[int, int, int]:
    """(tiles per program, programs per row, rows in flight) of a launch."""
    tiles_total = max(1, triton.cdiv(vocab, config.block))
    rows = max(1, min(batch, config.rows_in_flight))
    slots = config.programs_per_sm * geometry.multiprocessors(device)
    want = max(1, min(slots // rows, tiles_total))
    per_block = triton.cdiv(tiles_total, want)
    return per_block, triton.cdiv(tiles_total, per_block), rows


def bounded_sample(logits: torch.Tensor, *, temperature: torch.Tensor, key_a: torch.Tensor, key_b: torch.Tensor,
                   alpha: torch.Tensor, contexts: torch.Tensor, widths: torch.Tensor, watermark: torch.Tensor,
                   stream_keys: torch.Tensor, positions: torch.Tensor, lane: int = stream.LANE_SAMPLE,
                   config: BoundedConfig = DEFAULT_BOUNDED) -> SampleResult:
    """:func:`watermark.kernels.gumbel.gumbel_sample` (same arguments, same tokens and
    routes) through the bounded kernel."""
    from watermark.kernels import gumbel as dense

    values = dense._vocab_rows(logits, "logits")
    batch, vocab = values.shape
    device = values.device
    tokens = torch.empty(batch, dtype=torch.int64, device=device)
    routes = torch.empty(batch, dtype=torch.int8, device=device)
    if batch == 0:
        return SampleResult(tokens=tokens, routes=routes)
    if vocab == 0:
        raise ValueError("the vocabulary must hold at least one token")
    if config.block % 4:
        raise ValueError(f"block must be a multiple of 4; got {config.block}")
    contexts = torch.as_tensor(contexts, device=device).to(torch.int64)
    if contexts.dim() != 2 or contexts.shape[0] != batch or contexts.shape[1] < 1:
        raise ValueError(f"contexts must be [{batch}, C] (padded to the widest context)")
    if contexts.stride(1) != 1:
        contexts = contexts.contiguous()
    per_block, nblk, groups = grid_shape(batch, vocab, device, config)
    programs = groups * nblk
    ws = reduction.workspace(device, batch, batch * nblk, programs * 2 * config.block)
    bounds = _BOUNDS.get(device, batch)
    mult = dense.stride_mult(values)
    row = dense._row_tensor
    launch.launch(_bounded_sample_kernel, "bounded_sample", (programs,), (
        values, values.stride(0) // mult, vocab, batch,
        row(temperature, batch, torch.float32, device, "temperature"),
        row(key_a, batch, torch.int64, device, "key_a"),
        row(key_b, batch, torch.int64, device, "key_b"),
        row(alpha, batch, torch.float32, device, "alpha"),
        contexts, contexts.stride(0), row(widths, batch, torch.int32, device, "widths"),
        dense.flags_int8(watermark, (batch,), device, "watermark"),
        row(stream_keys, batch, torch.int64, device, "stream_keys"),
        row(positions, batch, torch.int64, device, "positions"), lane,
        tokens, routes, ws.scores, ws.tokens, ws.counters, ws.scratch, bounds, per_block, nblk, groups),
        dtype=values.dtype, constexprs=dict(BLOCK=config.block, STRIDE_MULT=mult, NB=config.reduce_block),
        options=config.launch_options(), aligned=(values,))
    return SampleResult(tokens=tokens, routes=routes)


# --------------------------------------------------------------------------- seeded: two launches

_SEEDED_ARGS = ["logits_ptr", "stride_row", "vocab", "temp_ptr", "key_a_ptr", "key_b_ptr", "alpha_ptr", "ctx_ptr",
                "ctx_stride", "width_ptr", "wm_ptr", "skey_ptr", "pos_ptr", "lane", "bound_ptr", "tokens_ptr",
                "routes_ptr", "part_s_ptr", "part_i_ptr", "count_ptr", "scratch_ptr", "tiles_per_block", "nblk"]


@triton.jit(do_not_specialize=[a for a in _SEEDED_ARGS if a not in ("logits_ptr",)])
def _seeded_sample_kernel(logits_ptr, stride_row, vocab, temp_ptr, key_a_ptr, key_b_ptr, alpha_ptr, ctx_ptr,
                          ctx_stride, width_ptr, wm_ptr, skey_ptr, pos_ptr, lane, bound_ptr, tokens_ptr, routes_ptr,
                          part_s_ptr, part_i_ptr, count_ptr, scratch_ptr, tiles_per_block, nblk,
                          BLOCK: tl.constexpr, STRIDE_MULT: tl.constexpr, NB: tl.constexpr, COMPACT: tl.constexpr):
    """gumbel_sample's kernel with the row bound known before the race: ``bound_ptr[row]``
    is a token of the row (its first argmax, from a first launch); its exact score seeds
    every program's best, so the exact pruning floor is tight from the first tile."""
    row, blk, row_ptr, tile_begin, tile_end, x0, x1, x2, x3, scratch = tiles.chunk_start(
        logits_ptr, stride_row, vocab, scratch_ptr, tiles_per_block, nblk, BLOCK, STRIDE_MULT)
    temperature, greedy, route, s0, s1, s2, kk0, kk1 = row_prologue(
        row, temp_ptr, key_a_ptr, key_b_ptr, alpha_ptr, ctx_ptr, ctx_stride, width_ptr, wm_ptr, skey_ptr, pos_ptr,
        lane)
    if greedy:
        best_s, best_i = race.argmax_chunk_from(row_ptr, x0, x1, x2, x3, tile_begin, tile_end, vocab, BLOCK)
    else:
        b = tl.load(bound_ptr + row).to(tl.int32)
        bv = tl.load(row_ptr + b).to(tl.float32)
        bv = tl.where(bv == bv, bv, NEG_INF)
        seed_s = bound_score(bv, b, temperature, s0, s1, s2, kk0, kk1)
        best_s, best_i = race.log_race_chunk_seeded(row_ptr, x0, x1, x2, x3, tile_begin, tile_end, vocab,
                                                    temperature, temperature != 1.0, s0, s1, s2, kk0, kk1, scratch,
                                                    seed_s, b, BLOCK, COMPACT)
    last, score, token = reduction.combine_blocks(part_s_ptr, part_i_ptr, count_ptr, row, blk, nblk, best_s, best_i, NB)
    if last:
        token = tl.where(score == NEG_INF, 0, token)
        tl.store(tokens_ptr + row, token.to(tl.int64))
        tl.store(routes_ptr + row, route.to(tl.int8))


def seeded_sample(logits: torch.Tensor, *, temperature: torch.Tensor, key_a: torch.Tensor, key_b: torch.Tensor,
                  alpha: torch.Tensor, contexts: torch.Tensor, widths: torch.Tensor, watermark: torch.Tensor,
                  stream_keys: torch.Tensor, positions: torch.Tensor, lane: int = stream.LANE_SAMPLE,
                  compact: bool = True, blocks_per_row: int | None = None, block: int = 2048) -> SampleResult:
    """:func:`watermark.kernels.gumbel.gumbel_sample` (same arguments, tokens and routes) in
    two launches: the dense kernel with every row greedy gives each row's first argmax
    (the bound token), then the seeded race with the exact floor from the first tile and
    the compaction queue (``compact``). Not dispatched (NOTES.md, iteration 5)."""
    from watermark.kernels import gumbel as dense

    values = dense._vocab_rows(logits, "logits")
    batch, vocab = values.shape
    device = values.device
    rows = dict(key_a=key_a, key_b=key_b, alpha=alpha, contexts=contexts, widths=widths, watermark=watermark,
                stream_keys=stream_keys, positions=positions)
    tokens = torch.empty(batch, dtype=torch.int64, device=device)
    routes = torch.empty(batch, dtype=torch.int8, device=device)
    if batch == 0:
        return SampleResult(tokens=tokens, routes=routes)
    bound = dense.gumbel_sample(values, temperature=torch.zeros(batch, dtype=torch.float32, device=device),
                                **rows, lane=lane).tokens
    config = dense.LaunchConfig(block=block, maxnreg=128, compact=compact)
    contexts = torch.as_tensor(contexts, device=device).to(torch.int64)
    if contexts.stride(1) != 1:
        contexts = contexts.contiguous()
    per_block, nblk = geometry.split_rows(batch, vocab, config.block, device, config.programs_per_sm, blocks_per_row)
    ws = reduction.workspace(device, batch, batch * nblk, batch * nblk * 2 * config.block)
    mult = dense.stride_mult(values)
    constexprs, options = dense.compile_time_args(config, mult)
    row = dense._row_tensor
    launch.launch(_seeded_sample_kernel, "seeded_sample", (batch, nblk), (
        values, values.stride(0) // mult, vocab,
        row(temperature, batch, torch.float32, device, "temperature"),
        row(key_a, batch, torch.int64, device, "key_a"), row(key_b, batch, torch.int64, device, "key_b"),
        row(alpha, batch, torch.float32, device, "alpha"), contexts, contexts.stride(0),
        row(widths, batch, torch.int32, device, "widths"), dense.flags_int8(watermark, (batch,), device, "watermark"),
        row(stream_keys, batch, torch.int64, device, "stream_keys"),
        row(positions, batch, torch.int64, device, "positions"), lane, bound,
        tokens, routes, ws.scores, ws.tokens, ws.counters, ws.scratch, per_block, nblk),
        dtype=values.dtype, constexprs=constexprs, options=options, aligned=(values,))
    return SampleResult(tokens=tokens, routes=routes)
