"""The batched watermark sampler: one call per decode step, one row per request.

Rows may belong to different tenants (per-row keys and specs). Per row, in order:

1. greedy rows (temperature 0) take the argmax and carry no watermark;
2. rows that must not be watermarked (a repeated context, an opt-out) take an ordinary
   Gumbel-max draw from the request's seeded stream;
3. dual-key rows pick key B with probability alpha from the request's stream (vLLM's
   routing), else key A; single-key rows use their key;
4. watermarked rows take the Gumbel-max draw under that key and their context.

Steps 2-4 share one Gumbel-max pass: a stream row is a row whose "key" is its stream key
and whose context is its (position, lane) stream context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from watermark import prf, stream
from watermark.gumbel import gumbel_argmax

ROUTE_GREEDY = 0
ROUTE_PLAIN = 1
ROUTE_KEY_A = 2  # the single key of `gumbel`, key A of `dual_key_gumbel`
ROUTE_KEY_B = 3
ROUTE_NAMES = {ROUTE_GREEDY: "greedy", ROUTE_PLAIN: "plain", ROUTE_KEY_A: "key_a", ROUTE_KEY_B: "key_b"}


@dataclass(frozen=True)
class SamplerRows:
    """Per-row inputs of one decode step (tensors [B] on the logits' device)."""

    key_a: torch.Tensor
    """int64 bit patterns: the key of a `gumbel` row, key A of a dual-key row."""
    key_b: torch.Tensor
    """int64 bit patterns: key B of a dual-key row (any value for `gumbel` rows)."""
    alpha: torch.Tensor
    """float32: probability of key B (0 for `gumbel` rows)."""
    contexts: Sequence[Sequence[int]]
    """Each row's watermark context (its last w generated tokens, -1 padded)."""
    watermark: torch.Tensor
    """bool: False draws from the ordinary stream (repeated context or opt-out)."""
    greedy: torch.Tensor
    """bool: temperature 0."""
    stream_keys: torch.Tensor
    """int64 bit patterns of each request's stream key."""
    positions: torch.Tensor
    """int64: each row's position in its request's output (stream counter)."""


@dataclass(frozen=True)
class SampleResult:
    tokens: torch.Tensor
    """int64 [B]"""
    routes: torch.Tensor
    """int8 [B]: ROUTE_* per row."""


def route_keys(rows: SamplerRows) -> tuple[torch.Tensor, torch.Tensor]:
    """(effective key [B], uses key B [B]) after the dual-key routing coin."""
    coin = stream.stream_coin(rows.stream_keys, rows.positions, stream.LANE_ROUTE)
    use_b = coin < rows.alpha.to(coin.dtype)
    return torch.where(use_b, rows.key_b, rows.key_a), use_b


def row_states(rows: SamplerRows, keys: torch.Tensor, lane: int = stream.LANE_SAMPLE) -> torch.Tensor:
    """States [B, 4]: keyed context states for watermarked rows, stream states for the rest."""
    keyed = prf.context_states_torch(keys, list(rows.contexts))
    stream_ctx = stream.stream_contexts(rows.positions, lane)
    plain = torch.stack(prf.context_state_torch(rows.stream_keys, stream_ctx), dim=-1)
    return torch.where(rows.watermark.unsqueeze(-1), keyed, plain)


def sample(logits: torch.Tensor, rows: SamplerRows, argmax=gumbel_argmax,
           lane: int = stream.LANE_SAMPLE) -> SampleResult:
    """Processed logits [B, V] give one token per row (see the module docstring).

    ``lane`` is the stream lane of unwatermarked rows: speculative drafts use their own
    (LANE_DRAFT) so that a draft and its position's correction never share uniforms.
    """
    keys, use_b = route_keys(rows)
    keys = torch.where(rows.watermark, keys, rows.stream_keys)
    states = row_states(rows, keys, lane)
    tokens = argmax(logits, keys, states)
    clean = logits.to(torch.float32)
    clean = torch.where(torch.isnan(clean), torch.full_like(clean, float("-inf")), clean)
    greedy_tokens = torch.argmax(clean, dim=-1)
    tokens = torch.where(rows.greedy, greedy_tokens, tokens)
    routes = torch.where(use_b, ROUTE_KEY_B, ROUTE_KEY_A)
    routes = torch.where(rows.watermark, routes, ROUTE_PLAIN)
    routes = torch.where(rows.greedy, ROUTE_GREEDY, routes).to(torch.int8)
    return SampleResult(tokens=tokens, routes=routes)
