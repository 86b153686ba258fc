"""Detection over alternative tokenisations of one text: the text as sent and its
normalised form (:mod:`detector.normalize`).

Normalising undoes tokenisation attacks but can also rewrite a genuine text (indented code,
typographic characters), changing the very tokens the watermark was sampled on. So both
forms are scored, each at threshold / m for m forms, and the verdict rests on the better
one with its p multiplied by m: a Bonferroni bound over the forms, valid whatever their
dependence, that costs at most a factor m in p and lets normalising only help.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from detector.detect import DetectorConfig, detect
from detector.result import Candidate, DetectionResult

CORRECTION = "bonferroni x{m} over the text as sent and its normalised form"


def detect_forms(forms: Sequence[Sequence[int]], candidates: Sequence[Candidate],
                 config: DetectorConfig) -> tuple[DetectionResult, int]:
    """The result for the best-scoring form (its p Bonferroni-corrected over the forms) and
    that form's index. One form is plain :func:`detector.detect.detect`."""
    if not forms:
        raise ValueError("no forms to score")
    if len(forms) == 1:
        return detect(forms[0], candidates, config), 0
    m = len(forms)
    share = config.model_copy(update={"threshold": config.threshold / m})
    results = [detect(tokens, candidates, share) for tokens in forms]
    best = min(range(m), key=lambda i: results[i].log10_p_value)
    factor = math.log10(m)
    result = results[best]
    result = dataclasses.replace(
        result, threshold=config.threshold, log10_p_value=min(0.0, result.log10_p_value + factor),
        per_key=tuple(dataclasses.replace(k, log10_p_adjusted=min(0.0, k.log10_p_adjusted + factor))
                      for k in result.per_key),
        correction=f"{result.correction}; {CORRECTION.format(m=m)}")
    return result, best
