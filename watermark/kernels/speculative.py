"""Fused speculative verification (torch reference: :func:`watermark.speculative.verify_reference`).

One launch per verification step, grid (rows, programs per row). Every program of a row
first replays the row's acceptance chain, which is cheap scalar work: per draft position
j the coin (the request's stream, lane LANE_ACCEPT, or the keyed coin PRF(key_coin,
context_j, token 0)), the float32 ratio p_j(x_j) / q_j(x_j) and the comparison, stopping at
the first rejection. That fixes the correction position ``at`` and its key (key B at the
position's context, or the ordinary stream). The program then races its chunk of the
residual max(p_at - q_at, 0) (the bonus p_k when every draft was accepted) in ratio form,
exactly as :mod:`watermark.kernels.race` does; a chunk whose residual is all zero also
races p_at, needed only when the whole row's residual is empty (p_at == q_at). The last
program of the row to finish merges the chunks and writes tokens, routes and counts.

Greedy rows need the argmax of every p_j first: each program folds its chunk of all
k + 1 rows of p, and the last program runs the greedy chain on the merged argmaxes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from watermark import stream
from watermark.kernels import geometry, launch, philox, race, reduction, tiles
from watermark.kernels.gumbel import LaunchConfig, aligned_rows, flags_int8
from watermark.results import ROUTE_GREEDY, ROUTE_KEY_A, ROUTE_KEY_B, ROUTE_PLAIN, VerifyResult

LANE_SAMPLE = tl.constexpr(stream.LANE_SAMPLE)
LANE_ACCEPT = tl.constexpr(stream.LANE_ACCEPT)
R_GREEDY = tl.constexpr(ROUTE_GREEDY)
R_PLAIN = tl.constexpr(ROUTE_PLAIN)
R_KEY_A = tl.constexpr(ROUTE_KEY_A)
R_KEY_B = tl.constexpr(ROUTE_KEY_B)
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# No register cap: the verification kernel needs ~168 registers and spills under 128.
VERIFY_CONFIG = LaunchConfig()
# The configurations the dispatcher (watermark.speculative.verify) can select.
DISPATCH_CONFIGS = (VERIFY_CONFIG,)


def compile_time_args(config: LaunchConfig, mult: int) -> tuple[dict, dict]:
    """(compile-time constants, launch options) of a verification launch."""
    return dict(BLOCK=config.block, STRIDE_MULT=mult, NB=config.reduce_block), config.launch_options()

_ARGS = ["p_ptr", "p_sb", "p_sj", "q_ptr", "q_sb", "q_sj", "vocab", "k", "x_ptr", "key_b_ptr", "key_coin_ptr",
         "keyed_ptr", "ctx_ptr", "ctx_sb", "ctx_sj", "width_ptr", "wm_ptr", "greedy_ptr", "skey_ptr", "pos_ptr",
         "tokens_ptr", "nacc_ptr", "routes_ptr", "part_s_ptr", "part_i_ptr", "count_ptr", "tiles_per_block",
         "nblk"]
# Everything but the probability rows (whose alignment selects vector loads) and the tile
# shape: sizes, strides, counts and per-row tensors never trigger a compile.
_NO_SPEC = [a for a in _ARGS if a not in ("p_ptr", "q_ptr")]


@triton.jit
def _coin(row, j, keyed, marked_j, key_coin_ptr, ctx_row, width, sk0, sk1, position):
    """Acceptance coin of draft position j: keyed (PRF(key_coin, context_j, 0)) where the
    row asks for it and the position is watermarked, else the stream's (LANE_ACCEPT)."""
    zero = tl.full([], 0, tl.int32)
    if keyed & marked_j:
        c0, c1 = philox.split_key(tl.load(key_coin_ptr + row))
        s0, s1, s2, s3 = philox.context_state(ctx_row, width, c0, c1)
        word = philox.token_word(zero, s0, s1, s2, s3, c0, c1)
    else:
        s0, s1, s2, s3 = philox.stream_state(sk0, sk1, position + j, LANE_ACCEPT)
        word = philox.token_word(zero, s0, s1, s2, s3, sk0, sk1)
    return philox.uniform(word)


@triton.jit
def _residual_loaded(c, p0, p1, p2, p3, q0, q1, q2, q3, s0, s1, s2, k0, k1, run_max, best_s, best_i, nonzero):
    w0 = tl.maximum(p0.to(tl.float32) - q0.to(tl.float32), 0.0)
    w1 = tl.maximum(p1.to(tl.float32) - q1.to(tl.float32), 0.0)
    w2 = tl.maximum(p2.to(tl.float32) - q2.to(tl.float32), 0.0)
    w3 = tl.maximum(p3.to(tl.float32) - q3.to(tl.float32), 0.0)
    nonzero = nonzero | (tl.max(tiles.max4(w0, w1, w2, w3), 0) > 0.0)
    run_max, best_s, best_i = race.ratio_race_weights(c, w0, w1, w2, w3, s0, s1, s2, k0, k1, run_max, best_s,
                                                      best_i)
    return run_max, best_s, best_i, nonzero


@triton.jit
def _residual_chunk(p_row, q_row, has_q, tile_begin, tile_end, vocab, s0, s1, s2, s3, k0, k1,
                    BLOCK: tl.constexpr):
    """Race max(p - q, 0) over the chunk (q = 0 unless ``has_q``: the bonus position has no
    draft distribution). Returns (score, token, whether any residual entry is positive)."""
    kk0 = k0 ^ s3
    kk1 = k1 ^ philox.TOKEN_DOMAIN
    run_max = tl.full([], 0.0, tl.float32)
    best_s = tl.full([], 0.0, tl.float32)
    best_i = tile_begin * BLOCK
    nonzero = tl.full([], 0, tl.int1)
    full_end = tl.minimum(tile_end, vocab // BLOCK)
    q_end = tl.where(has_q, full_end, 0)
    np0, np1, np2, np3 = tiles.load_next(p_row, tile_begin, full_end, 0.0, BLOCK)
    nq0, nq1, nq2, nq3 = tiles.load_next(q_row, tile_begin, q_end, 0.0, BLOCK)
    for tile in range(tile_begin, full_end):
        p0, p1, p2, p3 = np0, np1, np2, np3
        q0, q1, q2, q3 = nq0, nq1, nq2, nq3
        np0, np1, np2, np3 = tiles.load_next(p_row, tile + 1, full_end, 0.0, BLOCK)
        nq0, nq1, nq2, nq3 = tiles.load_next(q_row, tile + 1, q_end, 0.0, BLOCK)
        run_max, best_s, best_i, nonzero = _residual_loaded(tiles.tile_counters(tile, BLOCK), p0, p1, p2, p3, q0,
                                                            q1, q2, q3, s0, s1, s2, kk0, kk1, run_max, best_s,
                                                            best_i, nonzero)
    if full_end < tile_end:
        c = tiles.tile_counters(full_end, BLOCK)
        p0, p1, p2, p3 = tiles.load_tile(p_row, c, vocab, 0.0, BLOCK)
        q0, q1, q2, q3 = tiles.load_tile(q_row, c, tl.where(has_q, vocab, 0), 0.0, BLOCK)
        run_max, best_s, best_i, nonzero = _residual_loaded(c, p0, p1, p2, p3, q0, q1, q2, q3, s0, s1, s2, kk0,
                                                            kk1, run_max, best_s, best_i, nonzero)
    return best_s, best_i, nonzero


@triton.jit
def _merge(part_s_ptr, part_i_ptr, base, stride, field, nblk, NB: tl.constexpr):
    """Lexicographic best (score, token) of partial ``field`` over the row's programs."""
    s_out = tl.full([], tiles.NEG_INF, tl.float32)
    i_out = tl.full([], tiles.BIG_INDEX, tl.int32)
    for b0 in range(0, nblk, NB):
        idx = b0 + tl.arange(0, NB)
        at = base + idx.to(tl.int64) * stride + field
        ps = tl.load(part_s_ptr + at, mask=idx < nblk, other=float("-inf"), volatile=True)
        pi = tl.load(part_i_ptr + at, mask=idx < nblk, other=2**31 - 1, volatile=True)
        cs = tl.max(ps, 0)
        ci = tl.min(tl.where(ps == cs, pi, tiles.BIG_INDEX), 0)
        better = (cs > s_out) | ((cs == s_out) & (ci < i_out))
        s_out = tl.where(better, cs, s_out)
        i_out = tl.where(better, ci, i_out)
    return s_out, i_out


@triton.jit(do_not_specialize=_NO_SPEC)
def _verify_kernel(p_ptr, p_sb, p_sj, q_ptr, q_sb, q_sj, vocab, k, x_ptr, key_b_ptr, key_coin_ptr, keyed_ptr,
                   ctx_ptr, ctx_sb, ctx_sj, width_ptr, wm_ptr, greedy_ptr, skey_ptr, pos_ptr,
                   tokens_ptr, nacc_ptr, routes_ptr, part_s_ptr, part_i_ptr, count_ptr, tiles_per_block, nblk,
                   BLOCK: tl.constexpr, STRIDE_MULT: tl.constexpr, NB: tl.constexpr):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    tile_begin = blk * tiles_per_block
    tile_end = tl.minimum(tile_begin + tiles_per_block, tl.cdiv(vocab, BLOCK))
    row64 = row.to(tl.int64)
    p_row = p_ptr + row64 * (p_sb * STRIDE_MULT)
    q_row = q_ptr + row64 * (q_sb * STRIDE_MULT)
    p_step = p_sj.to(tl.int64) * STRIDE_MULT
    q_step = q_sj.to(tl.int64) * STRIDE_MULT
    ctx_row = ctx_ptr + row64 * ctx_sb
    greedy = tl.load(greedy_ptr + row) != 0
    width = tl.load(width_ptr + row)
    sk0, sk1 = philox.split_key(tl.load(skey_ptr + row))
    position = tl.load(pos_ptr + row)
    fields = tl.maximum(k + 1, 3)
    # This program's partials: fields x (score, token), at (row * nblk + blk) * fields.
    mine = (row64 * nblk + blk) * fields

    at = tl.full([], 0, tl.int32)
    if greedy:
        for j in range(0, k + 1):
            v, i = race.argmax_chunk(p_row + j * p_step, tile_begin, tile_end, vocab, BLOCK)
            tl.store(part_s_ptr + mine + j, v)
            tl.store(part_i_ptr + mine + j, i)
    else:
        keyed = tl.load(keyed_ptr + row) != 0
        going = tl.full([], 1, tl.int1)
        for j in range(0, k):
            if going:
                x = tl.load(x_ptr + row64 * k + j).to(tl.int32)
                marked_j = tl.load(wm_ptr + row64 * (k + 1) + j) != 0
                coin = _coin(row, j, keyed, marked_j, key_coin_ptr, ctx_row + j * ctx_sj, width, sk0, sk1, position)
                px = tl.load(p_row + j * p_step + x).to(tl.float32)
                qx = tl.load(q_row + j * q_step + x).to(tl.float32)
                ratio = tl.where(qx > 0.0, (px.to(tl.float64) / qx.to(tl.float64)).to(tl.float32), tiles.POS_INF)
                going = coin < ratio
                at = tl.where(going, at + 1, at)
        marked = tl.load(wm_ptr + row64 * (k + 1) + at) != 0
        if marked:
            k0, k1 = philox.split_key(tl.load(key_b_ptr + row))
            s0, s1, s2, s3 = philox.context_state(ctx_row + at * ctx_sj, width, k0, k1)
        else:
            k0 = sk0
            k1 = sk1
            s0, s1, s2, s3 = philox.stream_state(sk0, sk1, position + at, LANE_SAMPLE)
        p_at = p_row + at * p_step
        q_at = q_row + tl.where(at < k, at, 0) * q_step
        rs, ri, nonzero = _residual_chunk(p_at, q_at, at < k, tile_begin, tile_end, vocab, s0, s1, s2, s3, k0,
                                          k1, BLOCK)
        ps = tl.full([], 0.0, tl.float32)
        pi = tl.full([], tiles.BIG_INDEX, tl.int32)
        if nonzero == 0:
            # Wanted only if the whole row's residual is empty; this chunk cannot tell.
            ps, pi = race.ratio_race_chunk(p_at, tile_begin, tile_end, vocab, s0, s1, s2, s3, k0, k1, BLOCK)
        tl.store(part_s_ptr + mine, rs)
        tl.store(part_i_ptr + mine, ri)
        tl.store(part_s_ptr + mine + 1, ps)
        tl.store(part_i_ptr + mine + 1, pi)
        tl.store(part_s_ptr + mine + 2, nonzero.to(tl.float32))
        tl.store(part_i_ptr + mine + 2, 0)

    last = nblk == 1
    if nblk > 1:
        tl.debug_barrier()
        ticket = tl.atomic_add(count_ptr + row, 1, sem="acq_rel", scope="gpu")
        last = ticket == nblk - 1
    if last:
        tl.debug_barrier()
        first = row64 * nblk * fields
        correction = tl.full([], 0, tl.int32)
        if greedy:
            going = tl.full([], 1, tl.int1)
            for j in range(0, k + 1):
                if going:
                    v, i = _merge(part_s_ptr, part_i_ptr, first, fields, j, nblk, NB)
                    i = tl.where(v == tiles.NEG_INF, 0, i)  # argmax of an all -inf row is 0
                    correction = i
                    if j < k:
                        going = tl.load(x_ptr + row64 * k + j).to(tl.int32) == i
                        at = tl.where(going, at + 1, at)
        else:
            nonzero_any, _unused = _merge(part_s_ptr, part_i_ptr, first, fields, 2, nblk, NB)
            rs, ri = _merge(part_s_ptr, part_i_ptr, first, fields, 0, nblk, NB)
            ps, pi = _merge(part_s_ptr, part_i_ptr, first, fields, 1, nblk, NB)
            correction = tl.where(nonzero_any > 0.0, ri, pi)
        if nblk > 1:
            tl.store(count_ptr + row, 0)
        for j in range(0, k + 1):
            marked_j = tl.load(wm_ptr + row64 * (k + 1) + j) != 0
            draft = tl.where(j < k, tl.load(x_ptr + row64 * k + j, mask=j < k, other=-1), -1)
            token = tl.where(j < at, draft, tl.where(j == at, correction.to(tl.int64), -1))
            route = tl.where(j < at, tl.where(marked_j, R_KEY_A, R_PLAIN),
                             tl.where(j == at, tl.where(marked_j, R_KEY_B, R_PLAIN), -1))
            route = tl.where(greedy & (j <= at), R_GREEDY, route)
            tl.store(tokens_ptr + row64 * (k + 1) + j, token)
            tl.store(routes_ptr + row64 * (k + 1) + j, route.to(tl.int8))
        tl.store(nacc_ptr + row, at.to(tl.int64))


def _probability_rows(x: torch.Tensor, name: str, rows: int) -> torch.Tensor:
    if x.dim() != 3 or x.shape[1] != rows:
        raise ValueError(f"{name} must be [B, {rows}, V]; got shape {tuple(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        x = x.to(torch.float32)
    if x.shape[2] > 1 and x.stride(2) != 1:
        x = x.contiguous()
    return aligned_rows(x)


def verify(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor, *,
           key_b: torch.Tensor, key_coin: torch.Tensor, keyed_coin: torch.Tensor, contexts: torch.Tensor,
           widths: torch.Tensor, watermark: torch.Tensor, greedy: torch.Tensor, stream_keys: torch.Tensor,
           positions: torch.Tensor, config: LaunchConfig = VERIFY_CONFIG,
           blocks_per_row: int | None = None) -> VerifyResult:
    """Same result as :func:`watermark.speculative.verify_reference` in one launch.

    target_probs [B, k+1, V] and draft_probs [B, k, V] (float32/bfloat16/float16, finite,
    >= 0; unit stride over V), draft_tokens [B, k]; key_b, key_coin, stream_keys [B] int64
    bit patterns; keyed_coin, greedy [B] bool; contexts [B, k+1, C] int64 (position j's
    watermark context in its first widths[b] entries); watermark [B, k+1] bool;
    positions [B] int64 (output position of the block's first token).
    """
    batch, k = draft_tokens.shape
    device = target_probs.device
    p = _probability_rows(target_probs, "target_probs", k + 1)
    q = _probability_rows(draft_probs, "draft_probs", k)
    if p.shape[0] != batch or q.shape[0] != batch or p.shape[2] != q.shape[2]:
        raise ValueError("target_probs, draft_probs and draft_tokens disagree on B or V")
    if q.dtype != p.dtype:  # one dtype per variant: widen both (exact) rather than compile a mixed one
        p, q = aligned_rows(p.to(torch.float32)), aligned_rows(q.to(torch.float32))
    vocab = p.shape[2]
    tokens = torch.empty((batch, k + 1), dtype=torch.int64, device=device)
    routes = torch.empty((batch, k + 1), dtype=torch.int8, device=device)
    accepted = torch.empty(batch, dtype=torch.int64, device=device)
    if batch == 0:
        return VerifyResult(tokens=tokens, num_accepted=accepted, routes=routes)
    if vocab == 0:
        raise ValueError("the vocabulary must hold at least one token")
    contexts = torch.as_tensor(contexts, device=device).to(torch.int64)
    if contexts.dim() != 3 or contexts.shape[:2] != (batch, k + 1):
        raise ValueError(f"contexts must be [{batch}, {k + 1}, C]")
    if contexts.stride(2) != 1:
        contexts = contexts.contiguous()
    marks = flags_int8(watermark, (batch, k + 1), device, "watermark")

    def rows(x, dtype, name):
        x = torch.as_tensor(x, device=device)
        if x.shape != (batch,):
            raise ValueError(f"{name} must have shape [{batch}]")
        return x.to(dtype).contiguous()

    per_block, nblk = geometry.split_rows(batch, vocab, config.block, device, config.programs_per_sm, blocks_per_row)
    ws = reduction.workspace(device, batch, batch * nblk * max(k + 1, 3))
    mult = 16 if all(s % 16 == 0 for s in (p.stride(0), p.stride(1), q.stride(0), q.stride(1) if k else 0)) else 1
    constexprs, options = compile_time_args(config, mult)
    launch.launch(_verify_kernel, "verify", (batch, nblk), (
        p, p.stride(0) // mult, p.stride(1) // mult, q, q.stride(0) // mult, (q.stride(1) if k else 0) // mult,
        vocab, k, draft_tokens.to(device=device, dtype=torch.int64).contiguous(),
        rows(key_b, torch.int64, "key_b"), rows(key_coin, torch.int64, "key_coin"),
        flags_int8(keyed_coin, (batch,), device, "keyed_coin"),
        contexts, contexts.stride(0), contexts.stride(1), rows(widths, torch.int32, "widths"), marks,
        flags_int8(greedy, (batch,), device, "greedy"), rows(stream_keys, torch.int64, "stream_keys"),
        rows(positions, torch.int64, "positions"), tokens, accepted, routes, ws.scores, ws.tokens, ws.counters,
        per_block, nblk), dtype=p.dtype, constexprs=constexprs, options=options, aligned=(p, q))
    return VerifyResult(tokens=tokens, num_accepted=accepted, routes=routes)
