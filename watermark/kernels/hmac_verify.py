"""Fused speculative verification with 256-bit keys (``hmac-sha256-philox-v1``; torch reference:
:func:`watermark.speculative.verify_reference` with ``VerifyRows.wide``).

Two launches per verification step, as the 256-bit sampler (:mod:`watermark.kernels.hmac`):

1. :func:`watermark.kernels.hmac.hmac_rows` over the block's B x (k + 1) position contexts,
   key B's midstates in its first slot and the coin key's in its second: per position the
   HMAC-derived Philox key and state of both keys (2 x 2 SHA-256 compressions per position
   for a context of width <= 6).
2. :func:`_verify_hmac_kernel` -- :mod:`watermark.kernels.speculative`'s verification with
   two changes for 256-bit rows: a keyed coin is Philox's token-0 word under the coin key's
   (key, state) at position j from step 1, and the correction draw races under key B's
   (key, state) at the correction position. 64-bit rows of the same batch run exactly as in
   ``_verify_kernel`` (same helpers, same order of operations).

The kernel body repeats ``_verify_kernel``'s (the chain, the partials, the merge) rather
than adding a mode flag to it, so the Philox kernel and its warmed variants stay as they are.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from watermark.kernels import geometry, launch, philox, race, reduction, tiles
from watermark.kernels.gumbel import LaunchConfig, aligned_rows, flags_int8
from watermark.kernels.hmac import hmac_rows
from watermark.kernels.speculative import (LANE_SAMPLE, R_GREEDY, R_KEY_A, R_KEY_B, R_PLAIN, VERIFY_CONFIG,
                                           _coin, _merge, _probability_rows, _residual_chunk, compile_time_args)
from watermark.results import VerifyResult

_ARGS = ["p_ptr", "p_sb", "p_sj", "q_ptr", "q_sb", "q_sj", "vocab", "k", "x_ptr", "key_b_ptr", "key_coin_ptr",
         "keyed_ptr", "ctx_ptr", "ctx_sb", "ctx_sj", "width_ptr", "wm_ptr", "greedy_ptr", "skey_ptr", "pos_ptr",
         "wide_ptr", "hkeys_ptr", "hstates_ptr", "tokens_ptr", "nacc_ptr", "routes_ptr", "part_s_ptr", "part_i_ptr",
         "count_ptr", "tiles_per_block", "nblk"]
_NO_SPEC = [a for a in _ARGS if a not in ("p_ptr", "q_ptr")]


@triton.jit
def _hmac_key_state(hkeys_ptr, hstates_ptr, index, slot: tl.constexpr):
    """(k0, k1, s0, s1, s2, s3) of position ``index`` (row * (k + 1) + j) from step 1; slot 0:
    key B, slot 1: the coin key."""
    k0, k1 = philox.split_key(tl.load(hkeys_ptr + index * 2 + slot))
    base = hstates_ptr + index * 8 + slot * 4
    return (k0, k1, tl.load(base).to(tl.uint32), tl.load(base + 1).to(tl.uint32), tl.load(base + 2).to(tl.uint32),
            tl.load(base + 3).to(tl.uint32))


@triton.jit(do_not_specialize=_NO_SPEC)
def _verify_hmac_kernel(p_ptr, p_sb, p_sj, q_ptr, q_sb, q_sj, vocab, k, x_ptr, key_b_ptr, key_coin_ptr, keyed_ptr,
                        ctx_ptr, ctx_sb, ctx_sj, width_ptr, wm_ptr, greedy_ptr, skey_ptr, pos_ptr,
                        wide_ptr, hkeys_ptr, hstates_ptr,
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
    wide = tl.load(wide_ptr + row) != 0
    sk0, sk1 = philox.split_key(tl.load(skey_ptr + row))
    position = tl.load(pos_ptr + row)
    fields = tl.maximum(k + 1, 3)
    mine = (row64 * nblk + blk) * fields
    first_position = row64 * (k + 1)

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
                if wide & keyed & marked_j:
                    c0, c1, c_s0, c_s1, c_s2, c_s3 = _hmac_key_state(hkeys_ptr, hstates_ptr, first_position + j, 1)
                    coin = philox.uniform(philox.token_word(tl.full([], 0, tl.int32), c_s0, c_s1, c_s2, c_s3,
                                                            c0, c1))
                else:
                    coin = _coin(row, j, keyed, marked_j, key_coin_ptr, ctx_row + j * ctx_sj, width, sk0, sk1,
                                 position)
                px = tl.load(p_row + j * p_step + x).to(tl.float32)
                qx = tl.load(q_row + j * q_step + x).to(tl.float32)
                ratio = tl.where(qx > 0.0, (px.to(tl.float64) / qx.to(tl.float64)).to(tl.float32), tiles.POS_INF)
                going = coin < ratio
                at = tl.where(going, at + 1, at)
        marked = tl.load(wm_ptr + row64 * (k + 1) + at) != 0
        if marked:
            if wide:
                k0, k1, s0, s1, s2, s3 = _hmac_key_state(hkeys_ptr, hstates_ptr, first_position + at, 0)
            else:
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
                    i = tl.where(v == tiles.NEG_INF, 0, i)
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


def position_keys(mids_b: torch.Tensor, mids_coin: torch.Tensor, contexts: torch.Tensor,
                  widths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1: per block position (B x (k + 1), row-major) and key (B, coin) the HMAC-derived
    Philox key [B * (k + 1), 2] and state [B * (k + 1), 2, 4] (int64), from midstates [B, 16]
    and contexts [B, k + 1, C] with widths [B]."""
    batch, positions = contexts.shape[0], contexts.shape[1]
    flat = contexts.reshape(batch * positions, contexts.shape[2])
    return hmac_rows(mids_b.repeat_interleave(positions, 0), mids_coin.repeat_interleave(positions, 0), flat,
                     widths.to(torch.int32).repeat_interleave(positions))


def verify_hmac(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor, *,
                key_b: torch.Tensor, key_coin: torch.Tensor, keyed_coin: torch.Tensor, contexts: torch.Tensor,
                widths: torch.Tensor, watermark: torch.Tensor, greedy: torch.Tensor, stream_keys: torch.Tensor,
                positions: torch.Tensor, wide: torch.Tensor, mids_b: torch.Tensor, mids_coin: torch.Tensor,
                config: LaunchConfig = VERIFY_CONFIG, blocks_per_row: int | None = None) -> VerifyResult:
    """:func:`watermark.kernels.speculative.verify` for a batch that may hold 256-bit rows:
    ``wide`` [B] bool marks them, ``mids_b`` / ``mids_coin`` [B, 16] hold their key B's and coin
    key's HMAC midstates (their key_b / key_coin are not read). Same tokens, counts and routes
    as :func:`watermark.speculative.verify_reference` with ``VerifyRows.wide`` set."""
    batch, k = draft_tokens.shape
    device = target_probs.device
    p = _probability_rows(target_probs, "target_probs", k + 1)
    q = _probability_rows(draft_probs, "draft_probs", k)
    if p.shape[0] != batch or q.shape[0] != batch or p.shape[2] != q.shape[2]:
        raise ValueError("target_probs, draft_probs and draft_tokens disagree on B or V")
    if q.dtype != p.dtype:
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
    contexts = contexts.contiguous()
    marks = flags_int8(watermark, (batch, k + 1), device, "watermark")

    def rows(x, dtype, name):
        x = torch.as_tensor(x, device=device)
        if x.shape != (batch,):
            raise ValueError(f"{name} must have shape [{batch}]")
        return x.to(dtype).contiguous()

    for name, mids in (("mids_b", mids_b), ("mids_coin", mids_coin)):
        if tuple(mids.shape) != (batch, 16):
            raise ValueError(f"{name} must be [{batch}, 16] (HMAC midstates)")
    width_rows = rows(widths, torch.int32, "widths")
    hkeys, hstates = position_keys(mids_b.to(device), mids_coin.to(device), contexts, width_rows)
    per_block, nblk = geometry.split_rows(batch, vocab, config.block, device, config.programs_per_sm, blocks_per_row)
    ws = reduction.workspace(device, batch, batch * nblk * max(k + 1, 3))
    mult = 16 if all(s % 16 == 0 for s in (p.stride(0), p.stride(1), q.stride(0), q.stride(1) if k else 0)) else 1
    constexprs, options = compile_time_args(config, mult)
    launch.launch(_verify_hmac_kernel, "verify_hmac", (batch, nblk), (
        p, p.stride(0) // mult, p.stride(1) // mult, q, q.stride(0) // mult, (q.stride(1) if k else 0) // mult,
        vocab, k, draft_tokens.to(device=device, dtype=torch.int64).contiguous(),
        rows(key_b, torch.int64, "key_b"), rows(key_coin, torch.int64, "key_coin"),
        flags_int8(keyed_coin, (batch,), device, "keyed_coin"),
        contexts, contexts.stride(0), contexts.stride(1), width_rows, marks,
        flags_int8(greedy, (batch,), device, "greedy"), rows(stream_keys, torch.int64, "stream_keys"),
        rows(positions, torch.int64, "positions"), flags_int8(wide, (batch,), device, "wide"), hkeys, hstates,
        tokens, accepted, routes, ws.scores, ws.tokens, ws.counters, per_block, nblk),
        dtype=p.dtype, constexprs=constexprs, options=options, aligned=(p, q))
    return VerifyResult(tokens=tokens, num_accepted=accepted, routes=routes)
