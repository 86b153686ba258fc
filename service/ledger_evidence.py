"""The ledger as a second basis of a detection: exact copies and shared k-grams.

A recorded generation whose output is exactly the text is an exact copy. Shared k-grams
(:mod:`keys.kgrams`) show an edited copy only when the shared phrases could not have been
written independently: their chance-collision bound says the digests really match, not that
the text was copied. The bundled model reproduces pydoc boilerplate ("Methods defined
here:", "Data descriptors defined here: ... dictionary for instance variables") with no
choice to make, and the standard library's own documentation, written by people, shares
those phrases: 40 of 102 2,000-character chunks of it shared 2-17 k-grams with one of 20
generations, each with a collision bound below 1e-26, and were reported as edited copies.

So a k-gram match counts (``passes``) only when, besides its collision bound passing the
threshold, the watermark test over the shared tokens alone, under the match's key, passes
:data:`SHARED_LEVEL` (Bonferroni over the matches tested). A shared token whose whole
context lies inside the shared k-gram has the same context in the text as in the generation,
so its score is the generation's: high where the model sampled among real alternatives under
the watermark, Exp(1) where it had no choice.
This is a gate, not an exact test of "written independently": a writer who happens to agree
with the generation on 8+ tokens it sampled with real choice shares those tokens' high scores,
but that agreement is itself rare; what the gate removes is agreement on phrases with no choice
in them, the common case (boilerplate, stock phrases).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from detector.detect import DetectorConfig, statistic_for
from detector.evidence import token_evidence
from detector.result import Candidate
from detector.stats import gamma_log10_sf, weighted_gamma_log10_sf
from keys import kgrams
from keys.kgrams import KgramMatch

SHARED_LEVEL = 1e-3
"""Level of the watermark test over a match's shared tokens (before the Bonferroni split)."""
MAX_TESTED = 5
"""Matches whose shared tokens are tested (the best by collision bound)."""


def with_shared_evidence(session, matches: Sequence[KgramMatch], candidates: Sequence[Candidate],
                         token_ids: Sequence[int], config: DetectorConfig) -> list[KgramMatch]:
    """``matches`` with ``shared_tokens`` and ``log10_shared_p`` filled in for the (at most
    :data:`MAX_TESTED`) best whose collision bound passes the threshold."""
    threshold = math.log10(config.threshold)
    by_key = {c.info.key_id: c for c in candidates if c.info.key_id}
    scores: dict[str, dict[int, float]] = {}
    digests: dict[str, list[int]] = {}  # the text's k-gram digests per key, computed once
    out, tested = [], 0
    for match in matches:
        candidate = by_key.get(match.key_id)
        if candidate is None or match.log10_false_match_bound > threshold or tested >= MAX_TESTED:
            out.append(match)
            continue
        tested += 1
        statistics = _statistics(candidate, config)
        if match.key_id not in scores:
            scores[match.key_id] = {
                statistic: {t.index: t.score for t in token_evidence(token_ids, candidate, statistic).tokens if t.scored}
                for statistic in statistics}
        # Tokens whose whole context lies inside a shared k-gram: their scores are the generation's.
        if match.key_id not in digests:
            digests[match.key_id] = kgrams.position_digests(token_ids, candidate.key.secret)
        positions = kgrams.matched_positions(session, key_id=match.key_id, generation_id=match.generation_id,
                                             secret=candidate.key.secret, token_ids=token_ids,
                                             skip=candidate.key.spec.context_width, at=digests[match.key_id])
        log10_p, n = 0.0, 0
        for statistic in statistics:
            shared = [score for index, score in scores[match.key_id][statistic].items() if index in positions]
            n = len(shared)
            if not shared:
                continue
            if statistic == "weighted":
                p = weighted_gamma_log10_sf(sum(shared), n, candidate.key.spec.alpha)
            else:
                p = gamma_log10_sf(sum(shared), n)
            log10_p = min(log10_p, min(0.0, p + math.log10(len(statistics))))  # Bonferroni over the statistics
        out.append(dataclasses.replace(match, shared_tokens=n, log10_shared_p=round(float(log10_p), 6)))
    return out


def _statistics(candidate: Candidate, config: DetectorConfig) -> list[str]:
    """The statistics the shared tokens are tested with: the detector's, and for ordinary-coin
    dual keys under ``auto`` both ``max`` and ``weighted``, as the whole-text verdict does
    (the key-B share is unknown: α without speculation, the rejection rate with it)."""
    statistic = statistic_for(candidate, config)
    spec = candidate.key.spec
    if config.dual_statistic == "auto" and spec.algorithm == "dual_key_gumbel" and spec.coin == "ordinary":
        return ["max", "weighted"]
    return [statistic]


def passing(kgram_matches: Sequence[KgramMatch], threshold: float) -> list[bool]:
    """Per match: does it put the ledger in ``basis`` (collision bound at or below the
    threshold and the shared tokens' watermark test at SHARED_LEVEL / matches tested)?"""
    tested = sum(m.log10_shared_p is not None for m in kgram_matches)
    level = math.log10(SHARED_LEVEL / max(1, tested))
    return [m.log10_false_match_bound <= math.log10(threshold) and m.log10_shared_p is not None
            and m.log10_shared_p <= level for m in kgram_matches]


def with_ledger_basis(result: dict[str, Any], matches: list[dict[str, Any]], kgram_matches: Sequence[KgramMatch],
                      threshold: float) -> dict[str, Any]:
    """``result`` (a detection result's dict) with its ledger evidence: ``ledger_matches``,
    ``kgram_matches`` (each with ``passes``) and ``"ledger"`` in ``basis`` when an exact
    copy is recorded or a k-gram match passes, even when the watermark does not
    (``watermarked`` stays the watermark's verdict)."""
    passes = passing(kgram_matches, threshold)
    result["ledger_matches"] = matches
    result["kgram_matches"] = [{**m.to_dict(), "passes": p} for m, p in zip(kgram_matches, passes)]
    if (matches or any(passes)) and "ledger" not in result["basis"]:
        result["basis"] = [*result["basis"], "ledger"]
    return result
