"""``philox4x32-10-v1`` on torch tensors (any device, per-row keys), for the samplers.

The PRF itself, its constants and the numpy reference are :mod:`watermark.prf.philox`;
this module is imported only where tensors are, so that detection never loads torch.
"""

from __future__ import annotations

import torch

from watermark.prf.base import to_signed64
from watermark.prf.philox import (
    CONTEXT_DOMAIN,
    MASK32,
    PHILOX_M0,
    PHILOX_M1,
    PHILOX_ROUNDS,
    PHILOX_W0,
    PHILOX_W1,
    TOKEN_DOMAIN,
    UNIFORM_DENOMINATOR,
    block_padding,
)


def keys_tensor(keys: list[int] | tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
    """Per-row keys [B] as int64 bit patterns, the form every torch entry point takes."""
    from watermark.transfer import host_tensor

    return host_tensor([to_signed64(k) for k in keys], torch.int64, device)


def _mulhilo_torch(values: torch.Tensor, multiplier: int) -> tuple[torch.Tensor, torch.Tensor]:
    # values < 2^32 in int64. Split the constant so every partial product stays < 2^49.
    high_part = values * (multiplier >> 16)
    low_part = values * (multiplier & 0xFFFF)
    lower = ((high_part & 0xFFFF) << 16) + low_part
    return (high_part >> 16) + (lower >> 32), lower & MASK32


def philox_torch(
    counter: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    key: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox-4x32-10 on int64 tensors holding 32-bit words (broadcastable shapes)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_index in range(PHILOX_ROUNDS):
        hi0, lo0 = _mulhilo_torch(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo_torch(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        if round_index != PHILOX_ROUNDS - 1:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
    return c0, c1, c2, c3


def split_keys_torch(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 key bit patterns [B] -> (k0, k1) as int64 tensors of 32-bit words."""
    return keys & MASK32, (keys >> 32) & MASK32


def context_state_torch(
    keys: torch.Tensor, contexts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys [B] (int64 bit patterns) and contexts [B, w] give the four state words [B]."""
    if contexts.dim() != 2 or keys.shape != contexts.shape[:1]:
        raise ValueError("contexts must be [B, w] and keys [B]")
    width = contexts.shape[1]
    contexts = contexts.to(torch.int64) & MASK32
    k0, k1 = split_keys_torch(keys.to(contexts.device))
    zeros = torch.zeros_like(k0)
    state = (zeros + CONTEXT_DOMAIN, zeros + width, zeros, zeros)
    for offset in range(0, width, 4):
        block = [
            contexts[:, offset + i] if offset + i < width else zeros + block_padding(i)
            for i in range(4)
        ]
        counter = tuple(s ^ b for s, b in zip(state, block))
        state = philox_torch(counter, (k0 ^ offset, k1))
    return state


def context_states_torch(keys: torch.Tensor, contexts: list) -> torch.Tensor:
    """Per-row contexts of possibly different widths give states [B, 4] (int64 words).

    Rows of one width are computed together; a batch may mix tenants and specs.
    """
    batch = len(contexts)
    states = torch.zeros((batch, 4), dtype=torch.int64, device=keys.device)
    by_width: dict[int, list[int]] = {}
    for row, ctx in enumerate(contexts):
        by_width.setdefault(len(ctx), []).append(row)
    for width, rows in by_width.items():
        idx = torch.tensor(rows, dtype=torch.int64, device=keys.device)
        ctx = torch.tensor([list(contexts[r]) for r in rows], dtype=torch.int64, device=keys.device)
        states[idx] = torch.stack(context_state_torch(keys[idx], ctx.reshape(len(rows), width)), dim=-1)
    return states


def words_from_state_torch(keys: torch.Tensor, state: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Keys [B], states [B, 4] and token_ids [V] (or [B, T]) give words [B, V] (or [B, T])."""
    k0, k1 = split_keys_torch(keys.to(state.device))
    tokens = token_ids.to(device=state.device, dtype=torch.int64) & MASK32
    if tokens.dim() == 1:
        tokens = tokens.unsqueeze(0)
    col = lambda t: t.unsqueeze(-1)  # noqa: E731 - broadcast row words over tokens
    s0, s1, s2, s3 = state.unbind(-1)
    out = philox_torch(
        (tokens >> 2, col(s0), col(s1), col(s2)),
        (col(k0 ^ s3), col(k1 ^ TOKEN_DOMAIN)),
    )
    lane = tokens & 3
    word = torch.where(lane == 0, out[0], out[1])
    word = torch.where(lane == 2, out[2], word)
    word = torch.where(lane == 3, out[3], word)
    return word.expand(keys.shape[0], -1) if word.shape[0] != keys.shape[0] else word


def words_torch(keys: torch.Tensor, contexts: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Raw PRF words as int64 in [0, 2^32).

    keys [B] and contexts [B, w] with token_ids [V] give [B, V]; token_ids [B, T] give [B, T].
    """
    state = torch.stack(context_state_torch(keys, contexts), dim=-1)
    return words_from_state_torch(keys, state, token_ids)


def uniforms_from_words_torch(words: torch.Tensor) -> torch.Tensor:
    """Words -> float32 uniforms in (0, 1) on the 24-bit grid."""
    mantissa = (words & MASK32) >> 8
    return ((mantissa.to(torch.float64) + 1.0) / UNIFORM_DENOMINATOR).to(torch.float32)


def uniforms_torch(keys: torch.Tensor, contexts: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    return uniforms_from_words_torch(words_torch(keys, contexts, token_ids))
