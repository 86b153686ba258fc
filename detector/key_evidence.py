"""One key's evidence on one text, before and after Tr-GoF's exact tail (detector.detect
computes it; detector.verdict turns the best key's into the result)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detector import scoring, trgof
from detector.result import Candidate


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
    lower_kind: object = None  # detector.spans.LowerKind | None: which bound log10_sf_lower is


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
