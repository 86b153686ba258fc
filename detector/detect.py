"""Detection: score a text (token ids) against one key or many, with error control.

Skeleton per key: scored positions -> per-token scores -> tests -> exact p (log space).
Two whole-text tests run on the same per-token scores: the sum (Gamma null; best without
edits) and Tr-GoF (:mod:`detector.trgof`; best when edits leave sparse signal). Across
keys (a tenant's rotation history, or every tenant): each key's p is Holm-adjusted in
``per_key``; the best key's p is Šidák-corrected for the number of keys.

The verdict is one weighted Bonferroni test over every component (state weights, fixed
before looking at the data; :func:`weights`): whole-text sum 1/2, whole-text Tr-GoF 1/4,
spans 1/4 (the span p-values are already corrected for every window and key). An
ordinary-coin dual key under ``auto`` has two hypotheses about the share of key-B tokens:
alpha (no speculation), which the ``weighted`` sum serves best, and an unknown share
(speculation), which ``max`` serves. The whole-text 3/4 is split ``weighted`` 0.45, ``max``
0.15, Tr-GoF 0.15 (on the weighted Šidák scores at w = 1 - alpha, which are Exp(1) under
the null and keep the power of key-A tokens), and the spans' 1/4 as ``weighted`` 3/16,
``max`` 1/16. A keyed-coin key uses ``routed`` scores throughout, with the
single-statistic split. The global p is min over components of p_c / w_c, so under the
null P(global p <= t) <= t; a text is watermarked when the whole text or any span passes
its share. Without edits this costs the sum test one factor 2 of p-value (0.3 in log10).

Tr-GoF's exact tail (:func:`detector.trgof.log_sf`, ~0.5 ms at 1,000 tokens compiled) is
computed only when it can change the result: when a cheap lower bound on its p
(:func:`detector.trgof.log_sf_lower`), divided by its weight, is at most both the key's
other whole-text components and max(threshold, TRGOF_EXACT_BELOW). Otherwise Tr-GoF's
reported p is its union (Chernoff) bound, a valid p-value too. Hence the verdict, and every
global p at most max(threshold, 0.01), are the same as with the exact tail always; only a
larger global p may come out larger (still valid), which spares the exact tail on most
unwatermarked texts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from detector import scoring, spans, stats, trgof
from detector.defaults import DEFAULT_THRESHOLD
from detector.result import Candidate, DetectionResult, KeyResult, Span

DualStatistic = Literal["auto", "max", "weighted", "routed"]
Test = Literal["auto", "sum", "trgof"]
TESTS: tuple[str, ...] = ("auto", "sum", "trgof")


class DetectorConfig(BaseModel):
    """How a detection is scored and decided."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    threshold: float = Field(default=DEFAULT_THRESHOLD, gt=0.0, lt=1.0)
    """The text is reported watermarked when its global p-value is at most this."""

    dual_statistic: DualStatistic = "auto"
    """Statistic for dual-key keys. `auto` adapts to what the key lets the detector know.
    With a keyed acceptance coin it is `routed`: the two keys weighted per token by a
    routing share learnt from the earlier tokens of the text (:mod:`detector.scoring`),
    which starts as `max` and moves only on evidence (measured never below `max` + `weighted`
    on the bundled pair's speculative text: bench/results/robustness.md). With an ordinary
    coin the share of key-B tokens is unknown (alpha without speculation, the draft
    rejection rate with it), so `auto` tests both `max` (Šidák per token, no knowledge of
    the share) and `weighted` (strongest when the share is alpha), under one correction
    (:func:`weights`). `routed` needs a keyed coin; `max`, `weighted` force one statistic."""

    spans: bool = True
    """Localise watermarked spans (windows of ``span_min_length`` tokens and up)."""

    span_min_length: int = Field(default=32, ge=4)

    test: Test = "auto"
    """Whole-text test. `auto`: the sum and Tr-GoF under one weighted Bonferroni correction
    (see the module docstring); `sum` or `trgof` alone."""


TRGOF_EXACT_BELOW = 0.01
"""Global p-values up to this (or up to the threshold, if larger) are as if Tr-GoF's exact
tail were always computed (see the module docstring)."""
SPANS_SHARE = 0.25
"""The spans' share of the threshold when spans are on."""


DUAL_AUTO_RAW = {"sum": 1.0, "weighted": 3.0, "trgof": 1.0}
"""Relative whole-text weights of an ordinary-coin dual key under ``auto`` (``sum`` is the
``max`` statistic's sum): 0.15 / 0.45 / 0.15 of the threshold with spans on."""
SINGLE_RAW = {"sum": 2.0, "trgof": 1.0}
DUAL_AUTO_SPAN_FRACTIONS = {"max": 0.25, "weighted": 0.75}
"""How an ordinary-coin dual key under ``auto`` splits the spans' share between its two
span searches."""


def weights(config: "DetectorConfig", with_spans: bool, dual_auto: bool = False) -> dict[str, float]:
    """Bonferroni weights of the verdict's components (sum to 1): fixed by the config, the
    key's kind and the text length only, never by the data. Spans get SPANS_SHARE; the
    whole text the rest, split sum 2 : Tr-GoF 1, or for a dual key under ``auto``
    ``max`` sum 1 : ``weighted`` sum 3 : Tr-GoF 1 (``weighted`` is the stronger statistic when
    the key-B share is alpha, as in non-speculative text, by far at low entropy:
    bench/results/robustness.md; ``max`` keeps the power when the share is not alpha)."""
    table = DUAL_AUTO_RAW if dual_auto else SINGLE_RAW
    raw = {}
    if config.test in ("auto", "sum"):
        raw["sum"] = table["sum"]
        if dual_auto:
            raw["weighted"] = table["weighted"]
    if config.test in ("auto", "trgof"):
        raw["trgof"] = table["trgof"]
    whole = 1.0 - (SPANS_SHARE if with_spans else 0.0)
    total = sum(raw.values())
    out = {name: whole * value / total for name, value in raw.items()}
    if with_spans:
        out["spans"] = SPANS_SHARE
    return out


@dataclass(frozen=True)
class KeyEvidence:
    """One key's evidence on one text (named fields; never read by position)."""

    candidate: Candidate
    scored: scoring.ScoredPositions
    statistic: str
    per_token: np.ndarray  # [n] per-token scores
    total: float
    log10_p_sum: float
    log10_p_trgof: float
    log10_p_weighted: float | None
    """The weighted sum alone, where it is one of the key's tests (ordinary-coin dual key, auto)."""
    log10_p: float
    """This key's combined whole-text p: min over its tests of p / weight share."""
    log10_sf: object  # Callable[[float, int], float], the sum statistic's null tail
    span_families: tuple["SpanFamily", ...] = ()


@dataclass(frozen=True)
class SpanFamily:
    """One span search over one key's per-token scores."""

    scores: np.ndarray  # [n]
    log10_sf: object  # Callable[[float, int], float]: a window sum's exact null tail
    log10_sf_lower: object  # Callable[[ndarray, ndarray], ndarray]: a lower bound on it
    fraction: float
    """Share of SPANS_SHARE this search spends."""
    log10_sf_many: object = None  # Callable[[ndarray, ndarray], ndarray] | None: log10_sf vectorised


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


def _log10_sf_lower(statistic: str, alpha: float):
    """Vectorised lower bound on :func:`_log10_sf` (the spans' screen)."""
    if statistic == "weighted":
        return lambda scores, ns: stats.weighted_gamma_log10_sf_lower(scores, ns, alpha)
    return stats.gamma_log10_sf_lower


def _trgof_log10_p(scores: np.ndarray, log10_share: float, log10_bar: float) -> float:
    """Tr-GoF's log10 p over Exp(1)-null scores [n]: exact where it can matter, i.e. where a
    lower bound on it, weighted by its share, is at most ``log10_bar`` (the threshold or the
    key's best other component, whichever is lower); elsewhere its union bound, a valid p
    that cannot change the verdict (see the module docstring)."""
    pvalues = trgof.token_pvalues(scores)
    s, index, at = trgof.statistic_at(pvalues)
    n = len(pvalues)
    if 0.0 < s and n <= trgof.EXACT_MAX_N and trgof.log_sf_lower(n, index, at) / trgof.LN10 - log10_share > log10_bar:
        return trgof.log10_union(s, n)
    return trgof.log10_sf(s, n)


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
    with_spans = config.spans and len(tokens) >= 2 * config.span_min_length
    shares: dict[str, float] = {}
    positions_cache: dict[tuple[int, str], scoring.ScoredPositions] = {}
    evidence: list[KeyEvidence] = []
    for candidate in candidates:
        spec = candidate.key.spec
        cache_key = (spec.context_width, "all" if spec.dedup == "all" else "text")
        scored = positions_cache.get(cache_key)
        if scored is None:
            scored = scoring.scored_positions(tokens, spec.context_width, spec.dedup)
            positions_cache[cache_key] = scored
        statistic = statistic_for(candidate, config)
        # An ordinary-coin dual key under auto also tests the weighted statistic.
        share = weights(config, with_spans, dual_auto=(spec.algorithm == "dual_key_gumbel"
                                                       and config.dual_statistic == "auto"
                                                       and statistic == "max"))
        shares.update(share)
        dual = spec.algorithm == "dual_key_gumbel" and statistic in ("max", "weighted")
        parts = scoring.dual_scores(candidate.key, scored) if dual else None
        per_token = getattr(parts, statistic) if parts is not None else scoring.token_scores(
            candidate.key, scored, statistic)
        total = float(per_token.sum())
        log10_sf = _log10_sf(statistic, spec.alpha)
        log10_p_sum = log10_sf(total, len(per_token))
        log10_p_trgof = 0.0
        log10_p_weighted = None
        combined = []
        if "sum" in share:
            combined.append(log10_p_sum - math.log10(share["sum"]))
        many = None if statistic == "weighted" else stats.gamma_log10_sf_many
        families = (SpanFamily(per_token, log10_sf, _log10_sf_lower(statistic, spec.alpha), 1.0, many),)
        if "weighted" in share:
            weighted = parts.weighted
            weighted_sf = _log10_sf("weighted", spec.alpha)
            log10_p_weighted = weighted_sf(float(weighted.sum()), len(weighted))
            combined.append(log10_p_weighted - math.log10(share["weighted"]))
            families = (SpanFamily(per_token, log10_sf, _log10_sf_lower(statistic, spec.alpha),
                                   DUAL_AUTO_SPAN_FRACTIONS["max"], many),
                        SpanFamily(weighted, weighted_sf, _log10_sf_lower("weighted", spec.alpha),
                                   DUAL_AUTO_SPAN_FRACTIONS["weighted"]))
        if "trgof" in share:
            # Tr-GoF needs Exp(1)-null scores. Where the key-B share alpha is tested (weighted,
            # or auto on an ordinary-coin key) it runs on the weighted Šidák scores at
            # w = 1 - alpha; otherwise on the statistic's own per-token scores.
            gof_scores = parts.weighted_sidak if parts is not None and (
                statistic == "weighted" or "weighted" in share) else per_token
            log10_p_trgof = _trgof_log10_p(gof_scores, math.log10(share["trgof"]), min(
                max(log10_threshold, math.log10(TRGOF_EXACT_BELOW)), min(combined, default=0.0)))
            combined.append(log10_p_trgof - math.log10(share["trgof"]))
        evidence.append(KeyEvidence(candidate=candidate, scored=scored, statistic=statistic,
                                    per_token=per_token, total=total, log10_p_sum=log10_p_sum,
                                    log10_p_trgof=log10_p_trgof, log10_p_weighted=log10_p_weighted,
                                    log10_p=min(0.0, min(combined)),
                                    log10_sf=log10_sf, span_families=families))

    m = len(evidence)
    adjusted = stats.holm_adjusted([e.log10_p * stats.LN10 for e in evidence])
    per_key = tuple(
        KeyResult(key=e.candidate.info, statistic=e.statistic, score=e.total,
                  scored_tokens=len(e.scored.positions), log10_p_value=e.log10_p,
                  log10_p_adjusted=adj / stats.LN10, log10_p_sum=e.log10_p_sum,
                  log10_p_trgof=e.log10_p_trgof if "trgof" in shares else None,
                  log10_p_weighted=e.log10_p_weighted)
        for e, adj in zip(evidence, adjusted)
    )
    best = min(evidence, key=lambda e: e.log10_p)
    whole_log10_p = stats.log_sidak(best.log10_p * stats.LN10, m) / stats.LN10
    global_log10_p = whole_log10_p

    found: tuple[Span, ...] = ()
    if with_spans:
        # The span family gets its own share of the threshold: a span passes when its
        # (window- and key-corrected) p is at most share * threshold. A dual key under auto
        # searches max and weighted scores, each with half of the share.
        ranked: list[tuple[float, spans.SpanHit]] = []
        for family in best.span_families:
            log10_share = math.log10(SPANS_SHARE * family.fraction)
            hits = spans.locate(best.scored.positions, family.scores, len(tokens),
                                min_length=config.span_min_length, family_size_factor=m,
                                log10_threshold=log10_threshold + log10_share, log10_sf=family.log10_sf,
                                log10_sf_lower=family.log10_sf_lower, log10_sf_many=family.log10_sf_many)
            hits = spans.refine(hits, best.scored.positions, family.scores, len(tokens),
                                 context_width=best.candidate.key.spec.context_width)
            ranked.extend((h.log10_p_value - log10_share, h) for h in hits)
        kept: list[tuple[float, spans.SpanHit]] = []
        for weighted_p, hit in sorted(ranked, key=lambda item: item[0]):
            if all(hit.end <= k.start or hit.start >= k.end for _, k in kept):
                kept.append((weighted_p, hit))
        found = tuple(Span(h.start, h.end, h.scored_tokens, h.log10_p_value, best.candidate.info.fingerprint)
                      for _, h in sorted(kept, key=lambda item: item[1].start))
        if kept:
            global_log10_p = min(global_log10_p, kept[0][0])
    watermarked = global_log10_p <= log10_threshold
    return DetectionResult(
        watermarked=watermarked,
        log10_p_value=global_log10_p,
        threshold=config.threshold,
        scored_tokens=len(best.scored.positions),
        total_tokens=int(len(tokens)),
        key=best.candidate.info if watermarked else None,
        keys_tested=m,
        per_key=per_key,
        spans=found,
        basis=("watermark",) if watermarked else (),
        # Under dual auto the sum share is the max statistic's sum, beside the weighted sum's.
        correction=("weighted Bonferroni: " + ", ".join(
            f"{'max' if name == 'sum' and 'weighted' in shares else name} {w:.3g}" for name, w in shares.items())
                    + f"; sidak over {m} key(s) tested; spans union-bound over windows x keys"),
    )
