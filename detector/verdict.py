"""The verdict of a detection from its keys' evidence: the best key, its p Šidák-corrected for
every key tested, Holm's adjustment of the per-key table and the best key's spans, possibly
deferred (:class:`Pending` before the span search, :class:`Deferred` before Tr-GoF's exact
tails) so that :func:`detector.forms.detect_forms` completes only the forms that can win."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from detector import spans, stats, trgof
from detector.config import SPANS_SHARE, DetectorConfig
from detector.key_evidence import KeyEvidence, PartialEvidence
from detector.result import DetectionResult, KeyResult, Span


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
                                    log10_sf_lower=family.log10_sf_lower, log10_sf_many=family.log10_sf_many,
                                    lower_kind=family.lower_kind)
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
                                         log10_sf_lower=family.log10_sf_lower,
                                         lower_kind=family.lower_kind) - log10_share)
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
