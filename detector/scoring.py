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
* ``routed`` (keyed acceptance coin): per token the weighted Šidák minimum
  T = min(p_A / w, p_B / (1 - w)) of the two keys' per-token p-values (p = 1 - u), whose
  null law is exact: P(T <= t) = a + b - ab with a = min(1, w t), b = min(1, (1 - w) t)
  (p_A, p_B independent uniforms); s = -ln P(T <= T_obs). At w = 1/2 this is ``max``.
  The weight w_i of key A at position i is estimated from the text *before* i only: a
  ridge regression, on the recomputed coin c, of which key explains the earlier strong
  tokens (max(u_A, u_B) >= 0.9) better. Under speculation the chance that a token came
  from the accepted draft (key A) falls with c, but by how much depends on the model
  pair; the regression learns it, and without signal it stays at w = 1/2 (``max``).
  Validity: under the null, (u_A, u_B) at position i are independent of c_i and of every
  earlier position, so given w_i the score is Exp(1); hence the scores are i.i.d. Exp(1)
  (a predictable plug-in, as in sequential testing) and the sum is exactly Gamma(n, 1).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import numpy as np

from watermark import dedup_compiled, jit, prf
from watermark.dedup import context_matrix, first_occurrence_mask
from watermark.prf import philox_compiled
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
    if jit.loaded():  # compiled where this process has loaded numba (same positions; watermark.jit)
        positions, contexts, kept = dedup_compiled.scored(tokens, width, skip_padded=(scope == "all"))
        return ScoredPositions(positions=positions, contexts=contexts, tokens=kept)
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
    if impl.key_bits != 64:  # 256-bit keys: one HMAC per position and key (compiled, watermark.prf.hmac_compiled)
        return impl.uniforms_many([key for key, _ in requests], scored.contexts,
                                  [scored.tokens if o is None else o for _, o in requests])
    if jit.loaded() and impl.version == prf.PHILOX_V1:  # the compiled pass: the same uniforms
        if all(override is None for _, override in requests):
            keys = np.array([prf.check_key(key) for key, _ in requests], dtype=np.uint64)
            return philox_compiled.uniforms_many(keys, scored.contexts, scored.tokens)
        out = np.empty((m, n), dtype=np.float32)
        for row, (key, override) in enumerate(requests):
            tokens = scored.tokens if override is None else override
            out[row] = philox_compiled.uniforms_many(np.array([prf.check_key(key)], dtype=np.uint64),
                                                     scored.contexts, tokens)[0]
        return out
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


ROUTED_STRONG = 0.9
"""Tokens with max(u_A, u_B) at least this teach the routing regression (weaker tokens
mostly carry no signal, and a coin flip of a label only shrinks the estimate)."""
ROUTED_PRIOR = 16.0
"""Pseudo-tokens at w = 1/2 (intercept) and at no slope: how much evidence the regression
needs before it moves away from ``max``."""
ROUTED_CLIP = (0.05, 0.95)
"""Bounds of w: a token of the key the regression disfavours loses at most ln(2 * 0.05)
nats against ``max``."""


def weighted_max_scores(u_a: np.ndarray, u_b: np.ndarray, w: np.ndarray | float) -> np.ndarray:
    """-ln P(T <= T_obs) for T = min(p_A / w, p_B / (1 - w)), p = 1 - u: Exp(1) under the
    null for any fixed w in (0, 1); w = 1/2 gives :func:`max_scores`. u_a, u_b [n], w [n]
    or scalar (the weight of key A)."""
    w = np.asarray(w, dtype=np.float64)
    kernel = _sidak_terms_kernel() if w.ndim == 0 and u_a.ndim == 1 else None
    if kernel is not None:  # the same arithmetic in one compiled pass; the log stays numpy's
        return -np.log(kernel(np.ascontiguousarray(u_a), np.ascontiguousarray(u_b), float(w)))
    p_a = 1.0 - u_a.astype(np.float64)  # exact: u is a float32 on the PRF's 24-bit grid
    p_b = 1.0 - u_b.astype(np.float64)
    t = np.minimum(p_a / w, p_b / (1.0 - w))
    a = np.minimum(1.0, w * t)
    b = np.minimum(1.0, (1.0 - w) * t)
    return -np.log(a + b - a * b)  # a + b - ab = 1 - (1 - a)(1 - b), without cancellation


def _sidak_terms(u_a, u_b, w):  # pragma: no cover - compiled
    """a + b - ab [n] of :func:`weighted_max_scores` at a scalar w: its numpy steps element by
    element (the same IEEE operations in the same order; no transcendental, so the values are
    the same bits)."""
    n = u_a.shape[0]
    out = np.empty(n)
    rest = 1.0 - w
    for i in range(n):
        p_a = 1.0 - np.float64(u_a[i])
        p_b = 1.0 - np.float64(u_b[i])
        t = min(p_a / w, p_b / rest)
        a = min(1.0, w * t)
        b = min(1.0, rest * t)
        out[i] = a + b - a * b
    return out


@functools.cache
def _sidak_terms_compiled():
    compiled = jit.compile_all({"_sidak_terms": _sidak_terms})
    return None if compiled is None else compiled["_sidak_terms"]


@functools.cache
def _dual_compiled():
    sidak = _sidak_terms_compiled()
    if sidak is None:
        return None
    return jit.compile_all({"_dual_arguments": _dual_arguments, "_dual_combine": _dual_combine},
                           helpers={"_sidak_terms": sidak})


def _dual_kernels():
    """The compiled passes of :func:`_dual_scores_fused` where this process has loaded numba,
    else None."""
    return _dual_compiled() if jit.loaded() else None


def _sidak_terms_kernel():
    """The compiled :func:`_sidak_terms` where this process has loaded numba, else None."""
    return _sidak_terms_compiled() if jit.loaded() else None


def routed_weights(u_a: np.ndarray, u_b: np.ndarray, coin: np.ndarray) -> np.ndarray:
    """Weights w [n] of key A, w_i from positions < i only (see the module docstring):
    ridge regression of the label 1[u_A > u_B] - 1/2 on (1, c - 1/2) over the earlier
    strong tokens, with ROUTED_PRIOR pseudo-observations pulling both coefficients to 0."""
    strong = (np.maximum(u_a, u_b) >= ROUTED_STRONG).astype(np.float64)
    label = np.sign(u_a.astype(np.float64) - u_b.astype(np.float64)) / 2.0  # ties: 0
    x = coin.astype(np.float64) - 0.5

    def before(values: np.ndarray) -> np.ndarray:  # exclusive prefix sums: position i sees j < i
        return np.concatenate(([0.0], np.cumsum(values)[:-1]))

    s0 = before(strong) + ROUTED_PRIOR
    s1 = before(strong * x)
    s2 = before(strong * x * x) + ROUTED_PRIOR / 12.0  # the prior's spread of c: Var U(0, 1)
    t0 = before(strong * label)
    t1 = before(strong * x * label)
    det = s0 * s2 - s1 * s1
    intercept = (s2 * t0 - s1 * t1) / det
    slope = (s0 * t1 - s1 * t0) / det
    return np.clip(0.5 + intercept + slope * x, *ROUTED_CLIP)


@dataclass(frozen=True)
class DualScores:
    """A dual key's per-token scores [n] from one pass of its two keys' PRF."""

    max: np.ndarray
    """:func:`max_scores` (Exp(1) under the null)."""
    weighted: np.ndarray
    """(1 - alpha) s_A + alpha s_B (the weighted statistic's terms; not Exp(1))."""
    weighted_sidak: np.ndarray
    """:func:`weighted_max_scores` at w = 1 - alpha (Exp(1) under the null): the per-token
    test of the share alpha, for tests that need Exp(1) scores (Tr-GoF)."""


def dual_scores(key: WatermarkKey, scored: ScoredPositions) -> DualScores:
    if key.spec.algorithm != "dual_key_gumbel":
        raise ValueError("dual_scores is for dual_key_gumbel keys")
    u_a, u_b = uniforms_many([(key.key_a, None), (key.key_b, None)], scored, key.spec.prf)
    alpha = key.spec.alpha
    w = min(max(1.0 - alpha, 1e-3), 1.0 - 1e-3)  # in (0, 1) also for alpha 0 or 1
    kernels = _dual_kernels() if u_a.ndim == 1 else None
    if kernels is not None:
        return _dual_scores_fused(u_a, u_b, alpha, w, kernels)
    return DualScores(max=max_scores(u_a, u_b),
                      weighted=(1.0 - alpha) * exp_scores(u_a) + alpha * exp_scores(u_b),
                      weighted_sidak=weighted_max_scores(u_a, u_b, w))


def _dual_scores_fused(u_a: np.ndarray, u_b: np.ndarray, alpha: float, w: float, kernels) -> DualScores:
    """:func:`dual_scores`' three score arrays in four calls instead of about fifteen: one
    compiled pass lays out every log1p argument (-u_A, -u_B, -m, m) and the Šidák terms, one
    numpy log1p and one numpy log take every logarithm (numpy's own transcendentals, so the
    same bits as the unfused steps: numpy's SIMD log1p and log differ from libm's in the last
    bit on some values), and one compiled pass combines them with the same IEEE operations in
    the same order as :func:`max_scores`, :func:`exp_scores` and :func:`weighted_max_scores`
    (tests/detector/test_scoring.py checks them bit for bit)."""
    arguments, terms = kernels["_dual_arguments"](np.ascontiguousarray(u_a), np.ascontiguousarray(u_b), float(w))
    out = kernels["_dual_combine"](np.log1p(arguments), np.log(terms), float(alpha))
    return DualScores(max=out[0], weighted=out[1], weighted_sidak=out[2])


def _dual_arguments(u_a, u_b, w):  # pragma: no cover - compiled
    """The log1p arguments [4n] (-u_A, -u_B, -m, m with m = max(u_A, u_B), as float64) and
    :func:`_sidak_terms` [n] of :func:`dual_scores`."""
    n = u_a.shape[0]
    arguments = np.empty(4 * n)
    for i in range(n):
        a = np.float64(u_a[i])
        b = np.float64(u_b[i])
        m = np.float64(max(u_a[i], u_b[i]))
        arguments[i] = -a
        arguments[n + i] = -b
        arguments[2 * n + i] = -m
        arguments[3 * n + i] = m
    return arguments, _sidak_terms(u_a, u_b, w)


def _dual_combine(logs, log_terms, alpha):  # pragma: no cover - compiled
    """[3, n]: max = -log1p(-m) - log1p(m); weighted = (1 - alpha) (-log1p(-u_A)) + alpha
    (-log1p(-u_B)); weighted Šidák = -log(terms): the unfused numpy expressions' operations."""
    n = log_terms.shape[0]
    out = np.empty((3, n))
    rest = 1.0 - alpha
    for i in range(n):
        out[0, i] = -logs[2 * n + i] - logs[3 * n + i]
        out[1, i] = rest * -logs[i] + alpha * -logs[n + i]
        out[2, i] = -log_terms[i]
    return out


def token_scores(key: WatermarkKey, scored: ScoredPositions, statistic: Statistic) -> np.ndarray:
    """Per-token scores [n] (float64) of ``statistic`` under ``key``."""
    if statistic == "single":
        if key.spec.algorithm != "gumbel":
            raise ValueError("statistic 'single' is for gumbel keys; use max, weighted or routed")
        return exp_scores(uniforms(key.prf_secret, scored, prf_name=key.spec.prf))
    if key.spec.algorithm != "dual_key_gumbel":
        raise ValueError(f"statistic {statistic!r} is for dual_key_gumbel keys; use single")
    if statistic == "routed":
        u_a, u_b, coin = uniforms_many([(key.key_a, None), (key.key_b, None),
                                        (key.key_coin, np.zeros_like(scored.tokens))], scored, key.spec.prf)
        return weighted_max_scores(u_a, u_b, routed_weights(u_a, u_b, coin))
    u_a, u_b = uniforms_many([(key.key_a, None), (key.key_b, None)], scored, key.spec.prf)
    if statistic == "max":
        return max_scores(u_a, u_b)
    if statistic == "weighted":
        alpha = key.spec.alpha
        return (1.0 - alpha) * exp_scores(u_a) + alpha * exp_scores(u_b)
    raise ValueError(f"unknown statistic: {statistic!r}; expected one of {list(STATISTICS)}")


class ScoreMemo:
    """One request's scored positions and per-token scores, by token list and key: the
    detector fills it, the ledger basis's shared-token test reads it (the same arrays, not
    recomputed). Holds arrays only for as long as the caller keeps it (one request); not
    shared between threads."""

    def __init__(self) -> None:
        self._positions: dict[tuple[bytes, int, bool], ScoredPositions] = {}
        self._scores: dict[tuple[int, WatermarkKey, str], object] = {}
        # The same entries by the key object's identity (the key kept beside it, so an id is
        # never reused): hashing a key hashes its spec's every field, several times a request.
        self._by_identity: dict[tuple[int, int, str], tuple[WatermarkKey, object]] = {}

    def positions(self, token_ids: np.ndarray, width: int, scope: str) -> ScoredPositions:
        """:func:`scored_positions`, once per token list, width and dedup scope."""
        tokens = np.asarray(token_ids, dtype=np.int64)
        index = (tokens.tobytes(), int(width), scope == "all")
        found = self._positions.get(index)
        if found is None:
            found = self._positions[index] = scored_positions(tokens, width, scope)
        return found

    def dual(self, key: WatermarkKey, scored: ScoredPositions) -> DualScores:
        """:func:`dual_scores`, once per key and scored positions (of this memo)."""
        return self._get(key, scored, "dual", lambda: dual_scores(key, scored))

    def token_scores(self, key: WatermarkKey, scored: ScoredPositions, statistic: Statistic) -> np.ndarray:
        """:func:`token_scores`, once per key, scored positions and statistic."""
        return self._get(key, scored, statistic, lambda: token_scores(key, scored, statistic))

    def _get(self, key: WatermarkKey, scored: ScoredPositions, name: str, compute):
        same = self._by_identity.get((id(scored), id(key), name))
        if same is not None and same[0] is key:
            return same[1]
        index = (id(scored), key, name)  # an equal key object: the entry computed for it
        found = self._scores.get(index)
        if found is None:
            found = self._scores[index] = compute()
        self._by_identity[(id(scored), id(key), name)] = (key, found)
        return found
