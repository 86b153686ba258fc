"""Per-token evidence: which positions are scored, and each scored token's PRF uniforms.

A position is scored iff generation could have watermarked it and its context has not
occurred earlier in the text (the detector's deduplication: repeated contexts reuse one
random vector, so their scores are not independent evidence). Scope ``all`` also skips
contexts that still hold padding, which generation under ``all`` never watermarks.
Deduplication applies in every scope, ``none`` included: it is what keeps the null
distribution exact on repetitive human text.

Statistics (each per-token score is Exp(1) under the null, so sums are Gamma(n, 1)
except the weighted one; see :mod:`detector.stats`):

* ``single``: s = -ln(1 - u) under the one key;
* ``max``: m = max(u_A, u_B) has P(m <= v) = v^2 under the null (Šidák per token), so
  s = -ln(1 - m^2): needs no knowledge of how tokens were split between the keys;
* ``weighted``: (1 - alpha) s_A + alpha s_B, vLLM's statistic, with its exact null;
* ``routed`` (keyed acceptance coin): the coin c of each position is recomputed; where
  c < tau the draft was accepted with high probability and s = s_A, elsewhere the ``max``
  score. The split depends on c only, which is independent of u_A, u_B under the null,
  so every score stays Exp(1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from watermark import prf
from watermark.dedup import context_matrix, first_occurrence_mask
from watermark.key import WatermarkKey

Statistic = Literal["single", "max", "weighted", "routed"]
STATISTICS: tuple[str, ...] = ("single", "max", "weighted", "routed")


@dataclass(frozen=True)
class ScoredPositions:
    """The positions of a text that a spec scores, with their contexts and tokens."""

    positions: np.ndarray  # [n] int64 indices into the text
    contexts: np.ndarray  # [n, w] int64
    tokens: np.ndarray  # [n] int64


def scored_positions(token_ids: np.ndarray, width: int, scope: str) -> ScoredPositions:
    tokens = np.asarray(token_ids, dtype=np.int64)
    keep = first_occurrence_mask(tokens, width, skip_padded=(scope == "all"))
    positions = np.flatnonzero(keep)
    contexts = context_matrix(tokens, width)[positions]
    return ScoredPositions(positions=positions, contexts=np.ascontiguousarray(contexts), tokens=tokens[positions])


# Past this many tokens per key, per-key passes with scalar keys are faster than one batched
# pass with per-element keys (measured by bench.detect_throughput).
_BATCH_BELOW = 2048


def uniforms(key: int, scored: ScoredPositions, token_override: np.ndarray | None = None,
             prf_name: str = prf.DEFAULT) -> np.ndarray:
    """float32 uniforms [n] of the scored tokens (or of ``token_override``) under ``key``."""
    return uniforms_many([(key, token_override)], scored, prf_name)[0]


def uniforms_many(requests: list[tuple[int, np.ndarray | None]], scored: ScoredPositions,
                  prf_name: str = prf.DEFAULT) -> np.ndarray:
    """Uniforms [len(requests), n] for several keys in one vectorised pass (numpy's per-call
    overhead dominates short texts, so one pass over m*n values beats m passes over n).
    ``prf_name``: the spec's ``prf`` (see :func:`watermark.prf.lookup`)."""
    impl = prf.lookup(prf_name)
    n = len(scored.tokens)
    m = len(requests)
    if m > 1 and n > _BATCH_BELOW:
        return np.stack([uniforms_many([r], scored, prf_name)[0] for r in requests])
    if m == 1:
        key, override = requests[0]
        keys = np.uint64(prf.check_key(key))
        contexts, tokens = scored.contexts, scored.tokens if override is None else override
    else:
        keys = np.repeat(np.array([prf.check_key(key) for key, _ in requests], dtype=np.uint64), n)
        contexts = np.tile(scored.contexts, (m, 1))
        tokens = np.concatenate([scored.tokens if o is None else o for _, o in requests])
    return impl.uniforms(keys, contexts, tokens).reshape(m, n)


def exp_scores(u: np.ndarray) -> np.ndarray:
    """-ln(1 - u) in float64 (u is never 1 on the PRF's 24-bit grid)."""
    return -np.log1p(-u.astype(np.float64))


def max_scores(u_a: np.ndarray, u_b: np.ndarray) -> np.ndarray:
    m = np.maximum(u_a, u_b).astype(np.float64)
    return -np.log1p(-m) - np.log1p(m)  # -ln(1 - m^2), accurate for m near 1


ROUTED_TAU = 0.5


def token_scores(key: WatermarkKey, scored: ScoredPositions, statistic: Statistic,
                 tau: float = ROUTED_TAU) -> np.ndarray:
    """Per-token scores [n] (float64) of ``statistic`` under ``key``."""
    if statistic == "single":
        if key.spec.algorithm != "gumbel":
            raise ValueError("statistic 'single' is for gumbel keys; use max, weighted or routed")
        return exp_scores(uniforms(key.secret, scored, prf_name=key.spec.prf))
    if key.spec.algorithm != "dual_key_gumbel":
        raise ValueError(f"statistic {statistic!r} is for dual_key_gumbel keys; use single")
    if statistic == "routed":
        u_a, u_b, coin = uniforms_many([(key.key_a, None), (key.key_b, None),
                                        (key.key_coin, np.zeros_like(scored.tokens))], scored, key.spec.prf)
        return np.where(coin < tau, exp_scores(u_a), max_scores(u_a, u_b))
    u_a, u_b = uniforms_many([(key.key_a, None), (key.key_b, None)], scored, key.spec.prf)
    if statistic == "max":
        return max_scores(u_a, u_b)
    if statistic == "weighted":
        alpha = key.spec.alpha
        return (1.0 - alpha) * exp_scores(u_a) + alpha * exp_scores(u_b)
    raise ValueError(f"unknown statistic: {statistic!r}; expected one of {list(STATISTICS)}")
