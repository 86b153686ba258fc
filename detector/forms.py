"""Detection over alternative tokenisations of one text: the text as sent and its
normalised forms (:mod:`detector.normalize`).

Normalising undoes tokenisation attacks but can also rewrite a genuine text (indented code,
typographic characters), changing the very tokens the watermark was sampled on. So every
distinct form is scored (as sent; normalised keeping runs of spaces, since genuine
indentation is one; fully normalised), each at threshold / m for m forms, and the verdict
rests on the best one with its p multiplied by m: a Bonferroni bound over the forms, valid
whatever their dependence, that costs at most a factor m in p and lets normalising only help.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

from detector.detect import DetectorConfig, detect
from detector.normalize import NormalizedText, normalize
from detector.result import Candidate, DetectionResult

CORRECTION = "bonferroni x{m} over the text as sent and its normalised forms"


@dataclass(frozen=True)
class TextForm:
    name: str
    """``as_sent``, ``normalized_spaces_kept`` or ``normalized`` (what the result's
    ``normalization.scored`` reports)."""
    text: str
    normalized: NormalizedText | None
    """None for the text as sent; else its character origins map offsets back."""


def text_forms(text: str) -> tuple[list[TextForm], NormalizedText]:
    """The distinct forms of ``text`` to score, the text as sent first, and the full
    normalisation (what it changed, for the result)."""
    full = normalize(text)
    forms = [TextForm("as_sent", text, None)]
    kept = normalize(text, collapse_whitespace=False)
    for name, candidate in (("normalized", full), ("normalized_spaces_kept", kept)):
        if all(candidate.text != form.text for form in forms):
            forms.append(TextForm(name, candidate.text, candidate))
    return forms, full


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
