"""Detection: score a text (token ids) against one key or many, with error control.

Skeleton per key: scored positions -> per-token scores -> sum -> exact p (log space).
Across keys (a tenant's rotation history, or every tenant): each key's p is Holm-adjusted
in ``per_key``; the global p is the best key's p under Šidák's correction for the number
of keys, and that key is reported as the source when the global p passes the threshold.
"""

from __future__ import annotations

import math
from typing import Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from detector import scoring, spans, stats
from detector.defaults import DEFAULT_THRESHOLD
from detector.result import Candidate, DetectionResult, KeyResult, Span

DualStatistic = Literal["auto", "max", "weighted", "routed"]


class DetectorConfig(BaseModel):
    """How a detection is scored and decided."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    threshold: float = Field(default=DEFAULT_THRESHOLD, gt=0.0, lt=1.0)
    """The text is reported watermarked when its global p-value is at most this."""

    dual_statistic: DualStatistic = "auto"
    """Statistic for dual-key keys. `auto`: `routed` for keyed-coin keys, else `max`
    (Šidák per token), which needs no knowledge of the key A / key B share; see
    bench/results/detection_power.md for the measurements behind this default."""

    routed_tau: float = Field(default=scoring.ROUTED_TAU, gt=0.0, lt=1.0)
    """Coin value below which a keyed-coin token is scored under key A alone."""

    spans: bool = True
    """Localise watermarked spans (windows of ``span_min_length`` tokens and up)."""

    span_min_length: int = Field(default=32, ge=4)


def statistic_for(candidate: Candidate, config: DetectorConfig) -> scoring.Statistic:
    spec = candidate.key.spec
    if spec.algorithm == "gumbel":
        return "single"
    if config.dual_statistic == "auto":
        return "routed" if spec.coin == "keyed" else "max"
    if config.dual_statistic == "routed" and spec.coin != "keyed":
        raise ValueError("the routed statistic needs a key with a keyed acceptance coin")
    return config.dual_statistic


def _log10_sf(statistic: str, alpha: float):
    if statistic == "weighted":
        return lambda score, n: stats.weighted_gamma_log10_sf(score, n, alpha)
    return stats.gamma_log10_sf


def detect(token_ids: Sequence[int] | np.ndarray, candidates: Sequence[Candidate],
           config: DetectorConfig | None = None) -> DetectionResult:
    """Score ``token_ids`` against every candidate key."""
    config = config or DetectorConfig()
    tokens = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if not candidates:
        raise ValueError("no keys to test")
    if tokens.size and (tokens.min() < 0 or tokens.max() > 0xFFFFFFFF):
        raise ValueError("token ids must be integers in [0, 2**32)")
    log10_threshold = math.log10(config.threshold)
    positions_cache: dict[tuple[int, str], scoring.ScoredPositions] = {}
    evidence = []
    for candidate in candidates:
        spec = candidate.key.spec
        cache_key = (spec.context_width, "all" if spec.dedup == "all" else "text")
        scored = positions_cache.get(cache_key)
        if scored is None:
            scored = scoring.scored_positions(tokens, spec.context_width, spec.dedup)
            positions_cache[cache_key] = scored
        statistic = statistic_for(candidate, config)
        per_token = scoring.token_scores(candidate.key, scored, statistic, tau=config.routed_tau)
        total = float(per_token.sum())
        log10_sf = _log10_sf(statistic, spec.alpha)
        log10_p = log10_sf(total, len(per_token))
        evidence.append((candidate, scored, statistic, per_token, total, log10_p, log10_sf))

    m = len(evidence)
    adjusted = stats.holm_adjusted([e[5] * stats.LN10 for e in evidence])
    per_key = tuple(
        KeyResult(key=c.info, statistic=st, score=total, scored_tokens=len(sc.positions),
                  log10_p_value=lp, log10_p_adjusted=adj / stats.LN10)
        for (c, sc, st, _, total, lp, _), adj in zip(evidence, adjusted)
    )
    best = min(range(m), key=lambda i: evidence[i][5])
    candidate, scored, statistic, per_token, _, best_log10_p, log10_sf = evidence[best]
    global_log10_p = stats.log_sidak(best_log10_p * stats.LN10, m) / stats.LN10
    watermarked = global_log10_p <= log10_threshold

    found: tuple[Span, ...] = ()
    if config.spans and len(tokens) >= 2 * config.span_min_length:
        hits = spans.locate(scored.positions, per_token, len(tokens), min_length=config.span_min_length,
                            family_size_factor=m, log10_threshold=log10_threshold, log10_sf=log10_sf)
        found = tuple(Span(h.start, h.end, h.scored_tokens, h.log10_p_value, candidate.info.fingerprint)
                      for h in hits)
    return DetectionResult(
        watermarked=watermarked,
        log10_p_value=global_log10_p,
        threshold=config.threshold,
        scored_tokens=len(scored.positions),
        total_tokens=int(len(tokens)),
        key=candidate.info if watermarked else None,
        keys_tested=m,
        per_key=per_key,
        spans=found,
    )
