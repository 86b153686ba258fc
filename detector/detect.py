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

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from detector import scoring, spans, stats, trgof
from detector.config import (  # noqa: F401  (re-exported: what callers read as detector.detect.*)
    DUAL_AUTO_RAW, DUAL_AUTO_SPAN_FRACTIONS, SINGLE_RAW, SPANS_SHARE, TESTS, TRGOF_EXACT_BELOW, DetectorConfig,
    DualStatistic, Test, weights)
from detector.result import Candidate, DetectionResult, KeyResult, Span


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
    trgof_bound: bool = False
    """Tr-GoF's exact tail, which :func:`detect` would have computed, was left out because a
    lower bound shows this key cannot be the best (:mod:`detector.multikey`): its
    ``log10_p_trgof`` is the union bound, larger than the exact value (still a valid p)."""


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


@dataclass(frozen=True)
class PartialEvidence:
    """One key's evidence before Tr-GoF's exact tail: everything :func:`complete` needs."""

    candidate: Candidate
    scored: scoring.ScoredPositions
    statistic: str
    share: dict[str, float]
    per_token: np.ndarray
    total: float
    log10_p_sum: float
    log10_p_weighted: float | None
    combined: tuple[float, ...]
    """The key's whole-text components other than Tr-GoF, each p / share (log10)."""
    log10_sf: object
    span_families: tuple[SpanFamily, ...]
    gof: tuple[float, int, int, float] | None
    """Tr-GoF's (S, n, attaining order, its p-value) (:func:`detector.trgof.statistic_at`),
    None when the key's tests leave it out."""

    def trgof_lower(self) -> float:
        """log10 of the lower bound on Tr-GoF's tail that :func:`complete` screens with."""
        s, n, index, at = self.gof
        return trgof.log_sf_lower(n, index, at) / trgof.LN10

    def trgof_lower_above(self, log10_share: float, log10_bar: float) -> bool:
        """Whether :meth:`trgof_lower` - ``log10_share`` > ``log10_bar``, settled by the
        binomial tail's first term alone where it suffices
        (:func:`detector.trgof.log_sf_lower_first_term`, at most the bound, and subtraction
        keeps the order): the same answer, without the sum in most cases."""
        s, n, index, at = self.gof
        if trgof.log_sf_lower_first_term(n, index, at) / trgof.LN10 - log10_share > log10_bar:
            return True
        return self.trgof_lower() - log10_share > log10_bar

    def trgof_union(self) -> float:
        s, n, _, _ = self.gof
        return trgof.log10_union(s, n)

    def needs_exact_tail(self) -> bool:
        """Whether Tr-GoF's p can be anything but its union bound or 1 (see :func:`complete`)."""
        if self.gof is None:
            return False
        s, n, _, _ = self.gof
        return 0.0 < s and n <= trgof.EXACT_MAX_N


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
    gof = None
    if "trgof" in share:
        # Tr-GoF needs Exp(1)-null scores. Where the key-B share alpha is tested (weighted,
        # or auto on an ordinary-coin key) it runs on the weighted Šidák scores at
        # w = 1 - alpha; otherwise on the statistic's own per-token scores.
        gof_scores = parts.weighted_sidak if parts is not None and (
            statistic == "weighted" or "weighted" in share) else per_token
        pvalues = trgof.token_pvalues(gof_scores)
        s, index, at = trgof.statistic_at(pvalues)
        gof = (s, len(pvalues), index, at)
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


def finish(tokens: np.ndarray, evidence: Sequence[KeyEvidence], per_key: Sequence[KeyResult] | None,
           shares: dict[str, float], config: DetectorConfig, keys_tested: int | None = None) -> DetectionResult:
    """The result from every key's ``per_key`` entry (in the candidates' order, Holm's
    adjustment left to this) and the evidence of at least the keys that can be the best
    (in the same relative order): the best key's p Šidák-corrected for every key tested,
    and its spans. ``per_key`` None: a result without per-key entries (``keys_tested``
    keys were tested)."""
    return pending_result(tokens, evidence, per_key, shares, config, keys_tested).result()


def with_adjusted(entry: KeyResult, log10_p_adjusted: float) -> KeyResult:
    """``dataclasses.replace(entry, log10_p_adjusted=...)`` at a fifth of its cost: a copy of
    every field (whatever fields KeyResult has) with the one changed. A many-key detection
    builds one per key tested (10,000 replace calls were ~55 ms)."""
    out = object.__new__(KeyResult)
    out.__dict__.update(entry.__dict__)
    out.__dict__["log10_p_adjusted"] = log10_p_adjusted  # frozen: set like its __init__ does
    return out


def pending_result(tokens: np.ndarray, evidence: Sequence[KeyEvidence], per_key: Sequence[KeyResult] | None,
                   shares: dict[str, float], config: DetectorConfig, keys_tested: int | None = None) -> "Pending":
    """:func:`finish` up to the span search: the best key and its Šidák-corrected whole-text
    p. Holm's adjustment of ``per_key`` waits for :meth:`Pending.result` (a form of a text
    that does not win never needs it: one replaced entry per key tested)."""
    if per_key is None:
        m, per_key = int(keys_tested), ()
    else:
        m = len(per_key)
    best = min(evidence, key=lambda e: e.log10_p)
    whole_log10_p = stats.log_sidak(best.log10_p * stats.LN10, m) / stats.LN10
    return Pending(tokens=tokens, best=best, per_key=tuple(per_key), keys_tested=m, whole_log10_p=whole_log10_p,
                   shares=dict(shares), config=config)


@dataclass(frozen=True)
class Pending:
    """A detection before its span search (:func:`pending_result`): its global p is
    ``whole_log10_p`` unless a span reported by :meth:`result` is more significant, and no
    span's weighted p is below :meth:`span_lower`."""

    tokens: np.ndarray
    best: KeyEvidence
    per_key: tuple[KeyResult, ...]
    """Every key's entry before Holm's adjustment (``log10_p_adjusted`` 0: :meth:`result`
    fills it in)."""
    keys_tested: int
    whole_log10_p: float
    """The best key's combined whole-text p, Šidák-corrected for every key tested (log10)."""
    shares: dict[str, float]
    config: DetectorConfig

    @property
    def with_spans(self) -> bool:
        return self.config.spans and len(self.tokens) >= 2 * self.config.span_min_length

    def span_lower(self) -> float:
        """A lower bound on the weighted log10 p of every span :meth:`result` can report
        (inf when no window can pass): the span search's own screen, without exact tails."""
        if not self.with_spans:
            return math.inf
        return _span_lower(self.best, len(self.tokens), self.config, self.keys_tested)

    def adjusted_per_key(self, log10_factor: float = 0.0) -> tuple[KeyResult, ...]:
        """``per_key`` with Holm's adjustment over every key, times ``10**log10_factor``
        (a further Bonferroni factor, :func:`detector.forms.detect_forms`'), each capped at
        1 after each step, as two separate corrections would: one new entry per key."""
        if not self.per_key:
            return ()
        adjusted = stats.holm_adjusted([r.log10_p_value * stats.LN10 for r in self.per_key])
        if not log10_factor:
            return tuple(with_adjusted(r, adj / stats.LN10) for r, adj in zip(self.per_key, adjusted))
        return tuple(with_adjusted(r, min(0.0, adj / stats.LN10 + log10_factor))
                     for r, adj in zip(self.per_key, adjusted))

    def result(self, *, per_key: tuple[KeyResult, ...] | None = None) -> DetectionResult:
        """The detection with its span search. ``per_key``: the entries to report in place
        of :meth:`adjusted_per_key` (a caller applying a further correction to them)."""
        tokens, best, config, m = self.tokens, self.best, self.config, self.keys_tested
        log10_threshold = math.log10(config.threshold)
        global_log10_p = self.whole_log10_p
        found: tuple[Span, ...] = ()
        if self.with_spans:
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
        shares = self.shares
        return DetectionResult(
            watermarked=watermarked,
            log10_p_value=global_log10_p,
            threshold=config.threshold,
            scored_tokens=len(best.scored.positions),
            total_tokens=int(len(tokens)),
            key=best.candidate.info if watermarked else None,
            keys_tested=m,
            per_key=self.adjusted_per_key() if per_key is None else per_key,
            spans=found,
            basis=("watermark",) if watermarked else (),
            # Under dual auto the sum share is the max statistic's sum, beside the weighted sum's.
            correction=("weighted Bonferroni: " + ", ".join(
                f"{'max' if name == 'sum' and 'weighted' in shares else name} {w:.3g}" for name, w in shares.items())
                        + f"; sidak over {m} key(s) tested; spans union-bound over windows x keys"),
        )


def _span_lower(evidence: "KeyEvidence | PartialEvidence", total: int, config: DetectorConfig, m: int) -> float:
    """A lower bound on the weighted log10 p of every span that a search over ``evidence``'s
    span families can report (inf when no window can pass): the search's own screen."""
    log10_threshold = math.log10(config.threshold)
    out = math.inf
    for family in evidence.span_families:
        log10_share = math.log10(SPANS_SHARE * family.fraction)
        out = min(out, spans.lower_bound(evidence.scored.positions, family.scores, total,
                                         min_length=config.span_min_length, family_size_factor=m,
                                         log10_threshold=log10_threshold + log10_share,
                                         log10_sf_lower=family.log10_sf_lower) - log10_share)
    return out


def combined_lower(partial: PartialEvidence) -> float:
    """A lower bound on the combined log10 p that :func:`complete` gives ``partial``, without
    Tr-GoF's exact tail: a lower bound on it stands in for it (the exact tail and the union
    bound that :func:`complete` may put in its place are both at least that); a Tr-GoF p that is
    never an exact tail (:meth:`PartialEvidence.needs_exact_tail` false) is computed as
    :func:`complete` computes it."""
    parts = list(partial.combined)
    if partial.gof is not None:
        s, n, index, at = partial.gof
        # The bound's first term (at most the bound, and a fraction of its cost): the form's
        # bound is taken on every form, most of which never need Tr-GoF's tail at all.
        tail = (trgof.log_sf_lower_first_term(n, index, at) / trgof.LN10 if partial.needs_exact_tail()
                else trgof.log10_sf(s, n))
        parts.append(tail - math.log10(partial.share["trgof"]))
    return min(0.0, min(parts))


LOWER_MARGIN = 1e-9
"""log10 slack given to :meth:`Deferred.whole_lower`: Šidák's correction is computed in two
branches (stats.log_sidak), so a bound a few ulps below a key's p could round above the
corrected p; the slack keeps the bound a bound (it only makes a screen finish more)."""


class Deferred:
    """A detection before Tr-GoF's exact tails and its span search (``defer_exact`` of
    :func:`detect` and :func:`detector.multikey.detect_many`): lower bounds on its global p
    from the keys that can be its best, and :meth:`pending`, the detection as ``defer_spans``
    gives it (the exact tails computed once, on the first call, exactly as without deferring).
    :func:`detector.forms.detect_forms` completes only the forms that can win."""

    def __init__(self, tokens: np.ndarray, config: DetectorConfig, keys_tested: int,
                 partials: Sequence[PartialEvidence], exact) -> None:
        self.tokens, self.config, self.keys_tested = tokens, config, keys_tested
        self.partials = tuple(partials)
        """The keys that can be the best (every key, or the screen's survivors)."""
        self._exact = exact
        self._pending: Pending | None = None

    def pending(self) -> Pending:
        if self._pending is None:
            self._pending = self._exact()
        return self._pending

    def whole_lower(self) -> float:
        """At most :attr:`Pending.whole_log10_p` of :meth:`pending`."""
        best = min(combined_lower(p) for p in self.partials)
        return stats.log_sidak(best * stats.LN10, self.keys_tested) / stats.LN10 - LOWER_MARGIN

    def span_lower(self) -> float:
        """At most :meth:`Pending.span_lower` of :meth:`pending`: the least over every key
        that can be the best (whichever is, its spans are searched)."""
        if not (self.config.spans and len(self.tokens) >= 2 * self.config.span_min_length):
            return math.inf
        return min(_span_lower(p, len(self.tokens), self.config, self.keys_tested) for p in self.partials)
