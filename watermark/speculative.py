"""Watermarked speculative sampling (dual-key Gumbel; SynthID-Text supplementary Alg. 6).

A block of k draft tokens x_0..x_{k-1} was drawn by the caller from the draft
distributions q_j with Gumbel-max under key A. Verification, per row:

* x_j is accepted with probability min(1, p_j(x_j) / q_j(x_j)) by a coin independent of
  the draft's randomness: the request's ordinary stream (vLLM's protocol), or a keyed coin
  under a third derived key (Hallmark's option) so that the detector can recompute it;
* at the first rejection j, the token is drawn from the residual max(0, p_j - q_j)
  (normalised) by Gumbel-max under key B, and the block ends;
* if all k are accepted, a bonus token is drawn from p_k under key B.

For a random key the output is exactly p (standard rejection sampling with independent
uniforms), so the acceptance rate equals that of unwatermarked speculative sampling.
Positions whose context is repeated (deduplication) or rows that opted out use the
ordinary stream for both the coin and the draw. Greedy rows accept a draft iff it is the
target's argmax and otherwise emit that argmax.

Distributions come in as probabilities (float32), so the verification needs no
transcendental function of them: the coin compares with p/q and the key-B draw is the
ratio form of Gumbel-max, argmax_v r_v / E_v (see :mod:`watermark.gumbel`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from watermark import hmac_rows, stream
from watermark.prf import philox, philox_torch
from watermark.gumbel import exponential_race_cpu
from watermark.results import ROUTE_GREEDY, ROUTE_KEY_A, ROUTE_KEY_B, ROUTE_PLAIN, VerifyResult
from watermark.sampler import stream_coin_py, stream_state_py, unsigned_keys


@dataclass(frozen=True)
class VerifyRows:
    """Per-row inputs of one verification step (tensors on the probabilities' device)."""

    key_b: torch.Tensor
    """[B] int64 bit patterns of key B."""
    key_coin: torch.Tensor
    """[B] int64 bit patterns of the coin key (used where ``keyed_coin``)."""
    keyed_coin: torch.Tensor
    """[B] bool: keyed acceptance coin instead of the ordinary stream's."""
    contexts: Sequence[Sequence[Sequence[int]]]
    """[B][k + 1] watermark contexts of the block's positions."""
    watermark: torch.Tensor
    """[B, k + 1] bool: False where a position is sampled without the watermark."""
    greedy: torch.Tensor
    """[B] bool"""
    stream_keys: torch.Tensor
    """[B] int64"""
    positions: torch.Tensor
    """[B] int64: output position of the block's first token."""
    wide: hmac_rows.WideRows | None = None
    """Rows with 256-bit keys (``hmac-sha256-philox-v1``): their key B and coin key as HMAC
    midstates (their ``key_b`` / ``key_coin`` hold 0), or None when every key is 64-bit. Such
    a row's keyed coin and correction draw use the per-context Philox key and state of the
    HMAC of the position's context, exactly as its sampler rows do (:mod:`watermark.hmac_rows`)."""


def coin_values(rows: VerifyRows, k: int) -> torch.Tensor:
    """Acceptance coins [B, k]: keyed where asked and watermarked, else the stream's.
    Plain-int Philox on the CPU (a few values per step), tensors elsewhere."""
    if rows.stream_keys.device.type != "cpu":
        return _wide_coins(rows, k, coin_values_torch(rows, k))
    batch = rows.stream_keys.shape[0]
    skeys, ckeys = unsigned_keys(rows.stream_keys), unsigned_keys(rows.key_coin)
    keyed, watermark, positions = rows.keyed_coin.tolist(), rows.watermark.tolist(), rows.positions.tolist()
    coins = [[philox.uniform_py(philox.word_py(ckeys[b], philox.context_state_py(ckeys[b], rows.contexts[b][j]), 0))
              if keyed[b] and watermark[b][j] else stream_coin_py(skeys[b], positions[b] + j, stream.LANE_ACCEPT)
              for j in range(k)] for b in range(batch)]
    return _wide_coins(rows, k, torch.tensor(coins, dtype=torch.float32).reshape(batch, k))


def _wide_coins(rows: VerifyRows, k: int, coins: torch.Tensor) -> torch.Tensor:
    """``coins`` with the keyed coins of 256-bit rows replaced: PRF(key_coin, context_j, 0)
    under ``hmac-sha256-philox-v1`` (the HMAC-derived Philox key and state, token 0)."""
    if rows.wide is None or k == 0:
        return coins
    keyed = (rows.wide.wide & rows.keyed_coin).tolist()
    if not any(keyed):
        return coins
    watermark = rows.watermark.tolist()
    at = [(b, j) for b, flag in enumerate(keyed) if flag for j in range(k) if watermark[b][j]]
    derived = hmac_rows.context_key_states(hmac_rows.coin_mids(rows.wide), [b for b, _ in at],
                                           [rows.contexts[b][j] for b, j in at])
    coins = coins.clone()
    for (b, j), (key, state) in zip(at, derived):
        coins[b, j] = philox.uniform_py(philox.word_py(key, state, 0))
    return coins


def coin_values_torch(rows: VerifyRows, k: int) -> torch.Tensor:
    """The tensor version of :func:`coin_values` (any device)."""
    batch = rows.stream_keys.shape[0]
    device = rows.stream_keys.device
    offsets = torch.arange(k, device=device)
    positions = (rows.positions.unsqueeze(-1) + offsets).reshape(-1)
    ordinary = stream.stream_coin(rows.stream_keys.repeat_interleave(k), positions, stream.LANE_ACCEPT)
    flat_contexts = [rows.contexts[b][j] for b in range(batch) for j in range(k)]
    coin_keys = rows.key_coin.repeat_interleave(k)
    zero = torch.zeros(1, dtype=torch.int64, device=device)
    keyed = philox_torch.uniforms_from_words_torch(
        philox_torch.words_from_state_torch(coin_keys, philox_torch.context_states_torch(coin_keys, flat_contexts), zero)
    )[:, 0]
    use_keyed = (rows.keyed_coin.unsqueeze(-1) & rows.watermark[:, :k]).reshape(-1)
    return torch.where(use_keyed, keyed, ordinary).reshape(batch, k)


def verify_reference(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                     rows: VerifyRows, race=exponential_race_cpu) -> VerifyResult:
    """The torch reference (the CPU path: plain-int coins and states, pruned numpy race;
    ``race`` picks the keyed draw, by default the pruned numpy one)."""
    batch, k = draft_tokens.shape
    device = target_probs.device
    p = target_probs.to(torch.float32)
    q = draft_probs.to(torch.float32)
    x = draft_tokens.to(torch.int64)
    p_x = p[:, :k].gather(-1, x.unsqueeze(-1)).squeeze(-1)
    q_x = q.gather(-1, x.unsqueeze(-1)).squeeze(-1)
    ratio = torch.where(q_x > 0, p_x / q_x, torch.full_like(p_x, float("inf")))
    accept = coin_values(rows, k) < ratio
    greedy_target = torch.argmax(p, dim=-1)  # [B, k + 1]
    accept = torch.where(rows.greedy.unsqueeze(-1), x == greedy_target[:, :k], accept)
    num_accepted = torch.cumprod(accept.to(torch.int64), dim=-1).sum(-1)

    # The correction position: residual at the first rejection, else the bonus on p_k.
    at = num_accepted
    p_at = p.gather(1, at.view(batch, 1, 1).expand(batch, 1, p.shape[-1])).squeeze(1)
    q_pad = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)
    q_at = q_pad.gather(1, at.view(batch, 1, 1).expand(batch, 1, q.shape[-1])).squeeze(1)
    residual = torch.clamp(p_at - q_at, min=0.0)
    # p == q up to rounding leaves no residual mass; p itself is then the right law.
    empty = residual.sum(-1) <= 0
    weights = torch.where(empty.unsqueeze(-1), p_at, residual)

    watermark_at = rows.watermark.gather(1, at.unsqueeze(-1)).squeeze(-1)
    keys = torch.where(watermark_at, rows.key_b, rows.stream_keys)
    states = correction_states(rows, at, keys, watermark_at)
    keys, states = _wide_corrections(rows, at, watermark_at, keys, states)
    correction = race(weights, keys, states)
    correction = torch.where(rows.greedy, greedy_target.gather(1, at.unsqueeze(-1)).squeeze(-1), correction)

    cols = torch.arange(k + 1, device=device).unsqueeze(0)
    x_pad = torch.cat([x, torch.full_like(x[:, :1], -1)], dim=1)
    tokens = torch.where(cols < at.unsqueeze(-1), x_pad, torch.full_like(x_pad, -1))
    tokens = torch.where(cols == at.unsqueeze(-1), correction.unsqueeze(-1), tokens)

    wm = rows.watermark
    draft_route = torch.where(wm, ROUTE_KEY_A, ROUTE_PLAIN)
    final_route = torch.where(wm, ROUTE_KEY_B, ROUTE_PLAIN)
    routes = torch.where(cols < at.unsqueeze(-1), draft_route, torch.full_like(draft_route, -1))
    routes = torch.where(cols == at.unsqueeze(-1), final_route, routes)
    routes = torch.where(rows.greedy.unsqueeze(-1) & (cols <= at.unsqueeze(-1)), ROUTE_GREEDY, routes)
    return VerifyResult(tokens=tokens, num_accepted=num_accepted, routes=routes.to(torch.int8))


def correction_states(rows: VerifyRows, at: torch.Tensor, keys: torch.Tensor,
                      watermark_at: torch.Tensor) -> torch.Tensor:
    """States [B, 4] of the correction draws: key B at the position's context, or the stream."""
    batch = at.shape[0]
    contexts_at = [rows.contexts[b][int(at[b])] for b in range(batch)]
    if keys.device.type == "cpu":
        return torch.tensor([
            philox.context_state_py(k, ctx) if wm else stream_state_py(k, pos, stream.LANE_SAMPLE)
            for k, ctx, wm, pos in zip(unsigned_keys(keys), contexts_at, watermark_at.tolist(),
                                       (rows.positions + at).tolist())], dtype=torch.int64).reshape(batch, 4)
    return correction_states_torch(rows, at, watermark_at)


def _wide_corrections(rows: VerifyRows, at: torch.Tensor, watermark_at: torch.Tensor, keys: torch.Tensor,
                      states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys [B], states [B, 4]) of the correction draws with 256-bit rows' replaced: key B's
    HMAC-derived Philox key and state at the correction position's context."""
    if rows.wide is None:
        return keys, states
    flags = (rows.wide.wide & watermark_at).tolist()
    if not any(flags):
        return keys, states
    keys, states = keys.clone(), states.clone()
    marked = [b for b, flag in enumerate(flags) if flag]
    derived = hmac_rows.context_key_states(rows.wide.mids_b, marked,
                                           [rows.contexts[b][int(at[b])] for b in marked])
    for b, (key, state) in zip(marked, derived):
        keys[b] = key - 2**64 if key >= 2**63 else key
        states[b] = torch.tensor(state, dtype=states.dtype)
    return keys, states


def correction_states_torch(rows: VerifyRows, at: torch.Tensor, watermark_at: torch.Tensor) -> torch.Tensor:
    contexts_at = [rows.contexts[b][int(at[b])] for b in range(at.shape[0])]
    keyed_states = philox_torch.context_states_torch(rows.key_b, contexts_at)
    stream_ctx = stream.stream_contexts(rows.positions + at, stream.LANE_SAMPLE)
    plain_states = torch.stack(philox_torch.context_state_torch(rows.stream_keys, stream_ctx), dim=-1)
    return torch.where(watermark_at.unsqueeze(-1), keyed_states, plain_states)


def block_contexts(context: Sequence[int], drafts: Sequence[int]) -> list[tuple[int, ...]]:
    """Watermark contexts of positions L .. L + len(drafts): position j follows drafts[:j]."""
    width = len(context)
    seq = list(context) + [int(t) for t in drafts]
    return [tuple(seq[j:j + width]) for j in range(len(drafts) + 1)]
