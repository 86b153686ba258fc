"""The ordinary (unkeyed) random stream of a request.

Rows that must not carry the watermark (a repeated context, an opt-out) and the
dual-key routing coin draw from this stream. It is the same Philox PRF keyed by a
per-request stream key derived from the request's seed, with context
(position low word, position high word, lane), so draws are reproducible for a given
seed, independent across positions and lanes, and unrelated to any watermark key.
"""

from __future__ import annotations

import secrets

import torch

from watermark import prf
from watermark.prf import philox, philox_torch

STREAM_DOMAIN = "hallmark/ordinary-stream/v1"
LANE_SAMPLE = 0  # Gumbel noise for an unwatermarked draw
LANE_ROUTE = 1  # dual-key routing coin
LANE_ACCEPT = 2  # ordinary speculative acceptance coin
LANE_DRAFT = 3  # Gumbel noise for an unwatermarked speculative draft
STREAM_CONTEXT_WIDTH = 3


def stream_key(seed: int | None) -> int:
    """The stream key for a request seed (None: a fresh random seed)."""
    if seed is None:
        seed = secrets.randbits(64)
    if not 0 <= seed <= prf.MAX_KEY:
        raise ValueError("seed must be an integer in [0, 2**64 - 1]")
    return prf.derive_key(seed, STREAM_DOMAIN)


def stream_contexts(positions: torch.Tensor, lane: int) -> torch.Tensor:
    """Positions [B] (int64) and a lane give the PRF contexts [B, 3]."""
    positions = positions.to(torch.int64)
    lane_col = torch.full_like(positions, lane)
    return torch.stack((positions & philox.MASK32, (positions >> 32) & philox.MASK32, lane_col), dim=-1)


def stream_uniforms(stream_keys: torch.Tensor, positions: torch.Tensor, lane: int,
                    token_ids: torch.Tensor) -> torch.Tensor:
    """Stream keys [B] and positions [B] give float32 uniforms [B, T] for token_ids [T]."""
    return philox_torch.uniforms_torch(stream_keys, stream_contexts(positions, lane), token_ids)


def stream_coin(stream_keys: torch.Tensor, positions: torch.Tensor, lane: int) -> torch.Tensor:
    """One uniform per row [B] (token index 0 of the lane)."""
    zero = torch.zeros(1, dtype=torch.int64, device=stream_keys.device)
    return stream_uniforms(stream_keys, positions, lane, zero)[:, 0]
