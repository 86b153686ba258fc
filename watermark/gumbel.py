"""Gumbel-max sampling under a PRF key (Aaronson; Kuditipudi et al. 2023; SynthID-Text).

token = argmax_v (l_v + g_v) with g_v = -log(-log u_v) and u_v the PRF uniform of
(key, context, v): an exact sample of softmax(l) for a random key, and a deterministic
function of (key, context, logits) that the detector can test.

Reference arithmetic, shared by every implementation (torch, the CPU fast path and the
Triton kernels), so that they pick bit-identical tokens:

* the uniform is the PRF's float32 value u (24-bit grid, never 0 or 1);
* g = float32(-log(-log(float64(u)))): computed in float64 and rounded once, so one-ulp
  differences between math libraries almost never survive the rounding;
* the score is the float32 sum l + g; the argmax takes the first index among equal
  scores; NaN logits count as -inf and a row of only -inf yields token 0.

Because u lies on a 24-bit grid, g is bounded by NOISE_MIN <= g <= NOISE_MAX. A token
whose float32 l + NOISE_MAX is below a score already reached cannot win, so the CPU path
computes the PRF only for the tokens that can (exact candidate pruning).
"""

from __future__ import annotations

import numpy as np
import torch

from watermark.noise import (EXPONENTIAL_MIN, NOISE_MAX, exponentials_from_uniforms, exponentials_from_uniforms_numpy,
                             noise_from_uniforms, noise_from_uniforms_numpy)
from watermark.prf import philox, philox_torch


def _clean(logits: torch.Tensor) -> torch.Tensor:
    logits = logits.to(torch.float32)
    return torch.where(torch.isnan(logits), torch.full_like(logits, float("-inf")), logits)


def gumbel_argmax_reference(logits: torch.Tensor, keys: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """Torch reference over the full vocabulary.

    logits [B, V] (processed), keys [B] (int64 bit patterns), states [B, 4] (the rows'
    context states, :func:`watermark.prf.philox_torch.context_states_torch`) give token ids [B].
    """
    logits = _clean(logits)
    vocab = torch.arange(logits.shape[-1], device=logits.device)
    uniforms = philox_torch.uniforms_from_words_torch(philox_torch.words_from_state_torch(keys, states, vocab))
    scores = logits + noise_from_uniforms(uniforms)
    return torch.argmax(scores, dim=-1)


def _first_argmax_per_segment(values: np.ndarray, rows: np.ndarray, batch: int) -> np.ndarray:
    """values/rows sorted by (row, token): index (into values) of each row's first maximum."""
    starts = np.searchsorted(rows, np.arange(batch))
    row_max = np.maximum.reduceat(values, starts)
    is_max = values == row_max[rows]
    # First True per row: searchsorted over the cumulative count of maxima.
    positions = np.flatnonzero(is_max)
    first = positions[np.searchsorted(rows[positions], np.arange(batch))]
    return first


def race_numpy(values_in: np.ndarray, keys_u: np.ndarray, st: np.ndarray, ratio: bool) -> np.ndarray:
    """The pruned CPU race. values [B, V] float32 (logits, or weights for the ratio form),
    keys [B] uint64, states [B, 4] uint64 -> token ids [B] (int64).
    log form: argmax l + g; ratio form: argmax w / E."""
    batch, vocab = values_in.shape
    u64 = np.uint64
    k0 = keys_u & u64(philox.MASK32)
    k1 = keys_u >> u64(32)
    rows_all = np.arange(batch)

    def scores_for(rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        tok = tokens.astype(np.uint64)
        out = philox.philox_numpy(
            tok >> u64(2), st[rows, 0], st[rows, 1], st[rows, 2],
            k0[rows] ^ st[rows, 3], k1[rows] ^ u64(philox.TOKEN_DOMAIN),
        )
        words = np.choose((tok & u64(3)).astype(np.intp), out)
        uniforms = philox.uniforms_from_words_numpy(words)
        if ratio:
            return values_in[rows, tokens] / exponentials_from_uniforms_numpy(uniforms)
        return values_in[rows, tokens] + noise_from_uniforms_numpy(uniforms)

    # A first score per row (at its largest input) bounds what any winner must reach.
    top = np.argmax(values_in, axis=1)
    floor = scores_for(rows_all, top)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if ratio:
            bound = values_in / np.float32(EXPONENTIAL_MIN)
        else:
            bound = values_in + np.float32(NOISE_MAX)
        candidate = bound >= floor[:, None]
    candidate[rows_all, top] = True
    if candidate.sum() > _DENSE_SHARE * candidate.size:
        result = _dense_race(values_in, k0, k1, st, ratio)
    else:
        rows, tokens = np.nonzero(candidate)
        with np.errstate(invalid="ignore", over="ignore"):
            values = scores_for(rows, tokens)
        values = np.where(np.isnan(values), np.float32(-np.inf), values)
        first = _first_argmax_per_segment(values, rows, batch)
        result = tokens[first]
    degenerate = (values_in <= 0).all(axis=1) if ratio else np.isneginf(values_in).all(axis=1)
    result[degenerate] = 0
    return result.astype(np.int64)


# Above this share of candidates, every token is scored: one Philox call per four tokens
# (the PRF's counter is token >> 2) with per-row keys broadcast, instead of one per token.
_DENSE_SHARE = 0.25


def _dense_race(values_in: np.ndarray, k0: np.ndarray, k1: np.ndarray, st: np.ndarray, ratio: bool) -> np.ndarray:
    batch, vocab = values_in.shape
    u64 = np.uint64
    counters = np.arange((vocab + 3) // 4, dtype=np.uint64)[None, :]
    col = lambda a: a[:, None]  # noqa: E731 - per-row words broadcast over counters
    out = philox.philox_numpy(counters, col(st[:, 0]), col(st[:, 1]), col(st[:, 2]),
                           col(k0 ^ st[:, 3]), col(k1 ^ u64(philox.TOKEN_DOMAIN)))
    words = np.stack(np.broadcast_arrays(*out), axis=-1).reshape(batch, -1)[:, :vocab]
    uniforms = philox.uniforms_from_words_numpy(words)
    with np.errstate(invalid="ignore", over="ignore"):
        if ratio:
            scores = values_in / exponentials_from_uniforms_numpy(uniforms)
        else:
            scores = values_in + noise_from_uniforms_numpy(uniforms)
    scores = np.where(np.isnan(scores), np.float32(-np.inf), scores)
    return np.argmax(scores, axis=1)


def _numpy_keys_states(keys: torch.Tensor, states: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    return (np.ascontiguousarray(keys.cpu().numpy()).view(np.uint64),
            states.cpu().numpy().astype(np.uint64))


def gumbel_argmax_cpu(logits: torch.Tensor, keys: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """Same result as :func:`gumbel_argmax_reference`, with exact candidate pruning (CPU)."""
    result = race_numpy(_clean(logits).cpu().numpy(), *_numpy_keys_states(keys, states), ratio=False)
    return torch.from_numpy(result).to(logits.device)


def exponential_race_reference(weights: torch.Tensor, keys: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """argmax_v w_v / E_v with E_v = -log u_v: a keyed draw from weights [B, V] (>= 0,
    unnormalised). The ratio form of Gumbel-max, used where the distribution is given as
    probabilities (speculative residuals). A row of zeros yields token 0."""
    w = weights.to(torch.float32)
    vocab = torch.arange(w.shape[-1], device=w.device)
    uniforms = philox_torch.uniforms_from_words_torch(philox_torch.words_from_state_torch(keys, states, vocab))
    return torch.argmax(w / exponentials_from_uniforms(uniforms), dim=-1)


def exponential_race_cpu(weights: torch.Tensor, keys: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    result = race_numpy(weights.to(torch.float32).cpu().numpy(), *_numpy_keys_states(keys, states), ratio=True)
    return torch.from_numpy(result).to(weights.device)
