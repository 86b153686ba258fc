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
from typing import Sequence

import numpy as np

from detector import scoring, spans, stats, trgof
from detector.config import (  # noqa: F401  (re-exported: what callers read as detector.detect.*)
    DUAL_AUTO_RAW, DUAL_AUTO_SPAN_FRACTIONS, SINGLE_RAW, SPANS_SHARE, TESTS, TRGOF_EXACT_BELOW, DetectorConfig,
    DualStatistic, Test, weights)
from detector.key_evidence import KeyEvidence, PartialEvidence, SpanFamily  # noqa: F401  (re-exported)
from detector.result import Candidate, DetectionResult, KeyResult
from detector.verdict import (  # noqa: F401  (re-exported: what callers read as detector.detect.*)
    LOWER_MARGIN, Deferred, Pending, combined_lower, finish, pending_result, with_adjusted)


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


def _lower_kind(statistic: str, alpha: float) -> spans.LowerKind:
    """Which bound :func:`_log10_sf_lower` is (the span screen computes it compiled)."""
    return spans.LowerKind(weighted=True, alpha=alpha) if statistic == "weighted" else _GAMMA_LOWER


_GAMMA_LOWER = spans.LowerKind(weighted=False)


def partial_evidence(candidate: Candidate, scored: scoring.ScoredPositions, config: DetectorConfig,
                     with_spans: bool, memo: scoring.ScoreMemo | None = None) -> PartialEvidence:
    """The key's scores and every test but Tr-GoF's exact tail. ``memo``: where the scores
    are kept for the request's other readers (the positions ``scored`` must be the memo's)."""
    spec = candidate.key.spec
    statistic = statistic_for(candidate, config)
    # An ordinary-coin dual key under auto also tests the weighted statistic.
    share = weights(config, with_spans, dual_auto=(spec.algorithm == "dual_key_gumbel"
                                                   and config.dual_statistic == "auto"
                                                   and statistic == "max"))
    dual = spec.algorithm == "dual_key_gumbel" and statistic in ("max", "weighted")
    if memo is not None:
        parts = memo.dual(candidate.key, scored) if dual else None
        per_token = getattr(parts, statistic) if parts is not None else memo.token_scores(
            candidate.key, scored, statistic)
    else:
        parts = scoring.dual_scores(candidate.key, scored) if dual else None
        per_token = getattr(parts, statistic) if parts is not None else scoring.token_scores(
            candidate.key, scored, statistic)
    total = float(per_token.sum())
    log10_sf = _log10_sf(statistic, spec.alpha)
    log10_p_sum = log10_sf(total, len(per_token))
    log10_p_weighted = None
    combined = []
    if "sum" in share:
        combined.append(log10_p_sum - math.log10(share["sum"]))
    many = None if statistic == "weighted" else stats.gamma_log10_sf_many
    kind = _lower_kind(statistic, spec.alpha)
    families = (SpanFamily(per_token, log10_sf, _log10_sf_lower(statistic, spec.alpha), 1.0, many, kind),)
    if "weighted" in share:
        weighted = parts.weighted
        weighted_sf = _log10_sf("weighted", spec.alpha)
        log10_p_weighted = weighted_sf(float(weighted.sum()), len(weighted))
        combined.append(log10_p_weighted - math.log10(share["weighted"]))
        families = (SpanFamily(per_token, log10_sf, _log10_sf_lower(statistic, spec.alpha),
                               DUAL_AUTO_SPAN_FRACTIONS["max"], many, kind),
                    SpanFamily(weighted, weighted_sf, _log10_sf_lower("weighted", spec.alpha),
                               DUAL_AUTO_SPAN_FRACTIONS["weighted"], None, _lower_kind("weighted", spec.alpha)))
    gof = None
    if "trgof" in share:
        # Tr-GoF needs Exp(1)-null scores. Where the key-B share alpha is tested (weighted,
        # or auto on an ordinary-coin key) it runs on the weighted Šidák scores at
        # w = 1 - alpha; otherwise on the statistic's own per-token scores.
        gof_scores = parts.weighted_sidak if parts is not None and (
            statistic == "weighted" or "weighted" in share) else per_token
        s, index, at = trgof.statistic_of_scores(gof_scores)
        gof = (s, len(gof_scores), index, at)
    return PartialEvidence(candidate=candidate, scored=scored, statistic=statistic, share=share,
                           per_token=per_token, total=total, log10_p_sum=log10_p_sum,
                           log10_p_weighted=log10_p_weighted, combined=tuple(combined), log10_sf=log10_sf,
                           span_families=families, gof=gof)


def complete(partial: PartialEvidence, log10_threshold: float, log10_gate: float = math.inf,
             log10_screen_lower: float | None = None) -> KeyEvidence:
    """The key's evidence with Tr-GoF's p: its exact tail where it can matter, i.e. where a
    lower bound on it, weighted by its share, is at most the threshold (or 0.01) and the
    key's best other component; elsewhere its union bound, a valid p that cannot change the
    verdict (see the module docstring). A caller testing many keys may also pass
    ``log10_gate``, a bound below which some key's combined p is known to lie: where
    ``log10_screen_lower`` (any lower bound on Tr-GoF's log10 p, the one above by default),
    weighted, exceeds it, this key cannot be the best and the exact tail is left out too
    (``trgof_bound``)."""
    combined = list(partial.combined)
    log10_p_trgof = 0.0
    bound = False
    if partial.gof is not None:
        log10_share = math.log10(partial.share["trgof"])
        log10_bar = min(max(log10_threshold, math.log10(TRGOF_EXACT_BELOW)), min(combined, default=0.0))
        s, n, _, _ = partial.gof
        if partial.needs_exact_tail() and partial.trgof_lower_above(log10_share, log10_bar):
            log10_p_trgof = trgof.log10_union(s, n)
        elif partial.needs_exact_tail() and (partial.trgof_lower() if log10_screen_lower is None
                                              else log10_screen_lower) - log10_share > log10_gate:
            log10_p_trgof, bound = trgof.log10_union(s, n), True
        else:
            log10_p_trgof = trgof.log10_sf(s, n)
        combined.append(log10_p_trgof - log10_share)
    return KeyEvidence(candidate=partial.candidate, scored=partial.scored, statistic=partial.statistic,
                       per_token=partial.per_token, total=partial.total, log10_p_sum=partial.log10_p_sum,
                       log10_p_trgof=log10_p_trgof, log10_p_weighted=partial.log10_p_weighted,
                       log10_p=min(0.0, min(combined)), log10_sf=partial.log10_sf,
                       span_families=partial.span_families, trgof_bound=bound)


def check_tokens(token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Token ids as int64 [n], or ValueError."""
    tokens = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if tokens.size and (tokens.min() < 0 or tokens.max() > 0xFFFFFFFF):
        raise ValueError("token ids must be integers in [0, 2**32)")
    return tokens


def positions_key(spec) -> tuple[int, str]:
    """Keys whose specs give the same key here score the same positions of a text."""
    return spec.context_width, "all" if spec.dedup == "all" else "text"


def detect(token_ids: Sequence[int] | np.ndarray, candidates: Sequence[Candidate],
           config: DetectorConfig | None = None, *, defer_spans: bool = False, defer_exact: bool = False,
           memo: scoring.ScoreMemo | None = None) -> "DetectionResult | Pending | Deferred":
    """Score ``token_ids`` against every candidate key. ``defer_spans``: the :class:`Pending`
    detection before its span search (:func:`detector.forms.detect_forms` finishes only the
    forms that can win); ``defer_exact``: the :class:`Deferred` detection before Tr-GoF's
    exact tails too. ``memo``: keeps the scores for the request's other readers."""
    config = config or DetectorConfig()
    tokens = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if not candidates:
        raise ValueError("no keys to test")
    check_tokens(tokens)
    log10_threshold = math.log10(config.threshold)
    with_spans = config.spans and len(tokens) >= 2 * config.span_min_length
    shares: dict[str, float] = {}
    positions_cache: dict[tuple[int, str], scoring.ScoredPositions] = {}
    partials: list[PartialEvidence] = []
    for candidate in candidates:
        spec = candidate.key.spec
        cache_key = positions_key(spec)
        scored = positions_cache.get(cache_key)
        if scored is None:
            scored = (memo.positions(tokens, spec.context_width, spec.dedup) if memo is not None
                      else scoring.scored_positions(tokens, spec.context_width, spec.dedup))
            positions_cache[cache_key] = scored
        partial = partial_evidence(candidate, scored, config, with_spans, memo)
        shares.update(partial.share)
        partials.append(partial)

    def exact() -> Pending:
        evidence = [complete(partial, log10_threshold) for partial in partials]
        per_key = tuple(key_result(e, "trgof" in shares) for e in evidence)
        return pending_result(tokens, evidence, per_key, shares, config)

    if defer_exact:
        return Deferred(tokens, config, len(candidates), partials, exact)
    pending = exact()
    return pending if defer_spans else pending.result()


def key_result(e: KeyEvidence, trgof_reported: bool) -> KeyResult:
    """``per_key``'s entry of a key computed in full (Holm's adjustment comes in :func:`finish`)."""
    return KeyResult(key=e.candidate.info, statistic=e.statistic, score=e.total,
                     scored_tokens=len(e.scored.positions), log10_p_value=e.log10_p,
                     log10_p_adjusted=0.0, log10_p_sum=e.log10_p_sum,
                     log10_p_trgof=e.log10_p_trgof if trgof_reported else None,
                     log10_p_weighted=e.log10_p_weighted, screened=e.trgof_bound)


