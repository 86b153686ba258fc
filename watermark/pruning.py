"""Exact candidate pruning of a Gumbel-max race from a row bound (reference of
:mod:`watermark.kernels.bounded`).

The race picks the first index of the largest float32 score s_v = fl32(l_v + g_v)
(:mod:`watermark.gumbel`), and every noise value is at most NOISE_MAX (:mod:`watermark.noise`:
the PRF uniform lies on a 24-bit grid, so g has a known maximum). Hence, for any token b
whose exact score s_b is known (a *bound*), a token v with fl32(l_v + NOISE_MAX) < s_b
cannot win: its score is at most fl32(l_v + NOISE_MAX) (rounding is monotone), which is
strictly below s_b <= the winner's score, so it neither wins nor ties the winner.

The bound used here is cheap and usually tight: split the row into ``chunks`` and take,
in each chunk, the first argmax of the logits (one pass, no PRF), and its exact score.
The row bound is the largest of these; the winner's score is at least that. On Zipf(2)
rows (vocabulary 129,280) only ~3 % of the tokens then stay candidates, on N(0, 1) rows
all of them (the bound only pays on peaked rows).

:func:`prune_floor` turns the bound into a float32 floor with margins: l <= floor implies
fl32(l + NOISE_MAX) < bound, with room for float32 rounding of the bound's own sum and a
last-ulp difference between float64 ``log`` implementations (NOISE_BOUND). Rows whose
bound is +inf (a +inf logit) prune everything (the floor is NaN) and are decided by the
bound tokens themselves, which always take part: the first +inf logit of a row is the
first argmax of its chunk. Rows of only -inf / NaN have no candidate and give token 0,
as torch.argmax of an all -inf row.
"""

from __future__ import annotations

import torch

from watermark.noise import NOISE_MAX, noise_from_uniforms
from watermark.prf import philox_torch

# The largest noise plus a margin for a last-ulp difference between float64 logarithms.
NOISE_BOUND = float(NOISE_MAX) + 2.0**-16
# Relative (and absolute) margin of the floor: covers the float32 rounding of the sums.
FLOOR_ROUNDING = 2.0**-20


def prune_floor(bound: torch.Tensor) -> torch.Tensor:
    """float32 floors [B] from exact bounds [B]: a processed logit l <= floor cannot win.
    -inf bounds give -inf (no pruning), +inf bounds NaN (every comparison false)."""
    bound = bound.to(torch.float32)
    return bound - NOISE_BOUND - (bound.abs() * FLOOR_ROUNDING + FLOOR_ROUNDING)


def _clean(logits: torch.Tensor) -> torch.Tensor:
    logits = logits.to(torch.float32)
    return torch.where(torch.isnan(logits), torch.full_like(logits, float("-inf")), logits)


def _scores(logits: torch.Tensor, keys: torch.Tensor, states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Exact float32 scores l + g of tokens [B, T] (cleaned logits [B, V])."""
    words = philox_torch.words_from_state_torch(keys, states, tokens)
    noise = noise_from_uniforms(philox_torch.uniforms_from_words_torch(words))
    return logits.gather(1, tokens) + noise


def chunk_bounds(logits: torch.Tensor, keys: torch.Tensor, states: torch.Tensor,
                 chunks: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Each chunk's bound token and its exact score: logits [B, V] (processed), keys [B],
    states [B, 4] -> (scores [B, C], tokens [B, C]) for C = ``chunks`` contiguous chunks of
    ceil(V / C) tokens (the last may be shorter or empty: score -inf). The token is the
    chunk's first argmax of the cleaned logits."""
    values = _clean(logits)
    batch, vocab = values.shape
    size = -(-vocab // chunks)
    pad = size * chunks - vocab
    padded = torch.nn.functional.pad(values, (0, pad), value=float("-inf"))
    local = torch.argmax(padded.reshape(batch, chunks, size), dim=-1)
    tokens = (local + torch.arange(chunks, device=values.device) * size).clamp(max=vocab - 1)
    scores = _scores(values, keys, states, tokens)
    empty = torch.arange(chunks, device=values.device) * size >= vocab
    scores = torch.where(empty.unsqueeze(0) | (values.gather(1, tokens) == float("-inf")),
                         torch.full_like(scores, float("-inf")), scores)
    return scores, tokens


def candidates(logits: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """Tokens that may still win [B, V] (bool): cleaned logits above the bound's floor."""
    return _clean(logits) > prune_floor(bound).unsqueeze(-1)


def bounded_gumbel_argmax(logits: torch.Tensor, keys: torch.Tensor, states: torch.Tensor,
                          chunks: int = 1) -> torch.Tensor:
    """Same tokens as :func:`watermark.gumbel.gumbel_argmax_reference`, with the PRF
    evaluated only for the candidates and the chunks' bound tokens: logits [B, V],
    keys [B], states [B, 4] -> tokens [B]."""
    values = _clean(logits)
    bound_scores, bound_tokens = chunk_bounds(values, keys, states, chunks)
    live = candidates(values, bound_scores.max(dim=-1).values)
    scores = torch.full_like(values, float("-inf"))
    rows, cols = live.nonzero(as_tuple=True)
    if len(rows):
        words = philox_torch.words_from_state_torch(keys[rows], states[rows], cols.unsqueeze(-1))
        noise = noise_from_uniforms(philox_torch.uniforms_from_words_torch(words))[:, 0]
        scores[rows, cols] = values[rows, cols] + noise
    # The bound tokens' exact scores (amax: a token raced twice keeps its one exact score,
    # and an empty chunk's -inf lowers nothing).
    scores.scatter_reduce_(1, bound_tokens, bound_scores, reduce="amax")
    return torch.argmax(scores, dim=-1)


def candidate_fraction(logits: torch.Tensor, keys: torch.Tensor, states: torch.Tensor, chunks: int = 1) -> float:
    """Share of tokens that stay candidates under the row bound (what the kernel races)."""
    bound, _ = chunk_bounds(logits, keys, states, chunks)
    return float(candidates(logits, bound.max(dim=-1).values).float().mean())
