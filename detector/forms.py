"""Detection over alternative tokenisations of one text: the text as sent and its
normalised forms (:mod:`detector.normalize`).

Normalising undoes tokenisation attacks but can also rewrite a genuine text (indented code,
typographic characters), changing the very tokens the watermark was sampled on. So every
distinct form is scored (as sent; as sent with its whitespace runs as a model writes them,
:func:`with_runs_merged`, where that differs from the encoding; normalised keeping runs of
spaces, since genuine indentation is one; fully normalised, only where a space between two
words was widened, :data:`SPACED_WORDS`), each at threshold / m for m forms, and the verdict
rests on the best one with its p multiplied by m: a Bonferroni bound over the forms, valid
whatever their dependence, that costs at most a factor m in p and lets normalising only help.
The same factor multiplies the best form's span p-values and Holm-adjusted per-key p-values.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

from detector.detect import Deferred, DetectorConfig, Pending, detect
from detector.normalize import NormalizedText, normalize_forms
from detector.result import Candidate, DetectionResult, KeyResult, Span
from detector.scoring import ScoreMemo
from detector.segmentation import SegmentationTable, merge_space_runs

CORRECTION = "bonferroni x{m} over the text as sent and its normalised forms"


@dataclass(frozen=True)
class TextForm:
    name: str
    """``as_sent``, ``as_sent_runs_merged`` (:func:`with_runs_merged`),
    ``normalized_spaces_kept`` or ``normalized`` (what the result's ``normalization.scored``
    reports)."""
    text: str
    normalized: NormalizedText | None
    """None for the text as sent; else its character origins map offsets back."""


def original_offsets(form: TextForm, offsets: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Character ranges [(start, end)] of the form's tokens, in its own text, mapped to the
    text as sent (where spans and evidence report them)."""
    return offsets if form.normalized is None else form.normalized.original_offsets(offsets)


def with_span_chars(result: DetectionResult, offsets: Sequence[tuple[int, int]]) -> DetectionResult:
    """``result`` with its spans' character offsets: ``offsets`` [n] are the scored form's
    tokens' ranges in the text as sent; a span runs from its first token's start to its last
    token's end."""
    if not result.spans:
        return result
    return _replaced(result, spans=tuple(_span_chars(span, offsets) for span in result.spans))


def _span_chars(span: Span, offsets: Sequence[tuple[int, int]]) -> Span:
    start = offsets[span.start][0] if span.start < len(offsets) else None
    end = offsets[span.end - 1][1] if 0 < span.end <= len(offsets) else None
    return _replaced(span, char_start=start, char_end=end)


def text_forms(text: str) -> tuple[list[TextForm], NormalizedText]:
    """The distinct forms of ``text`` to score, the text as sent first, and the full
    normalisation (what it changed, for the result)."""
    both = normalize_forms(text)
    full, kept = both.collapsed, both.spaces_kept
    forms = [TextForm("as_sent", text, None)]
    for name, candidate in (("normalized", full), ("normalized_spaces_kept", kept)):
        if name == "normalized" and full.text != kept.text and not SPACED_WORDS.search(kept.text):
            continue  # it would only collapse indentation and alignment (SPACED_WORDS)
        if all(candidate.text != form.text for form in forms):
            forms.append(TextForm(name, candidate.text, candidate))
    return forms, full


SPACED_WORDS = re.compile(r"(?<=[^\W_])[ \t]{2,}(?=[^\W_])")
"""A run of spaces or tabs between two letters or digits: the mark of the whitespace attack
(single spaces between words widened), which the collapsed form undoes. Without one, the
collapsed form is not scored: its runs are indentation and alignment (after a line break,
beside punctuation: ``"\n    return"``, ``"|  Method"``), which a model writes and collapsing
only destroys, and scoring it anyway cost genuine code a Bonferroni factor 2 (bench/results/
retokenisation-bundled.json: the bundled model's outputs lost up to 0.06 more of TPR at 1e-6
as text than their encoding alone). A choice made on the text alone, never on a key, so the
Bonferroni factor over the forms scored stays valid; an attacker who widens only spaces beside
punctuation or at line starts is left with the tokens there to break."""


RUNS_MERGED = "as_sent_runs_merged"


def with_runs_merged(variants: Sequence[TextForm], tokenised: Sequence[tuple[list[int], list | None]],
                     table: SegmentationTable | None, encode: Callable[[str], Sequence[int]]
                     ) -> tuple[list[TextForm], list[tuple[list[int], list | None]]]:
    """``variants`` and their tokenisations ``tokenised`` [(ids, character offsets)], with the
    text as sent (the first variant) segmented as a model writes whitespace runs
    (:func:`detector.segmentation.merge_space_runs`) inserted after it where that differs
    from its encoding: one more form, so one more Bonferroni factor, only there. ``table``
    None (a tokenizer that is not a byte-level BPE): unchanged."""
    variants, tokenised = list(variants), list(tokenised)
    if table is None or not variants or variants[0].name != "as_sent":
        return variants, tokenised
    merged = merge_space_runs(variants[0].text, tokenised[0][0], table, encode)
    if merged is None:
        return variants, tokenised
    variants.insert(1, TextForm(RUNS_MERGED, variants[0].text, None))
    tokenised.insert(1, (list(merged.token_ids), list(merged.offsets)))
    return variants, tokenised


def detect_forms(forms: Sequence[Sequence[int]], candidates: Sequence[Candidate],
                 config: DetectorConfig,
                 run: Callable[..., DetectionResult | Pending] | None = None,
                 memo: ScoreMemo | None = None) -> tuple[DetectionResult, int]:
    """The result for the best-scoring form (its p Bonferroni-corrected over the forms) and
    that form's index. One form is plain :func:`detector.detect.detect` (or ``run``, which
    takes the same arguments, ``defer_exact`` included: :func:`detector.multikey.detect_many`
    for many keys).

    Each distinct form is scored up to Tr-GoF's exact tails and its span search
    (:class:`~detector.detect.Deferred`), the costliest steps of a short text, which then run
    only for forms that can still win. Forms are visited by a lower bound on their whole-text
    p (Tr-GoF's lower bound standing in for its exact tail, over the keys that can be the
    form's best); a form whose lower bounds on its whole-text p and on its spans' p (the span
    search's own screen) both exceed the best global p found so far cannot be the best (ties
    go to the earlier form, as before) and is left there; otherwise its exact tails are
    computed (exactly as without deferring), the same test runs on its exact whole-text p,
    and only then its span search. The chosen form and every number reported are those of
    scoring every form in full (:func:`detect_forms_exhaustive`, which
    tests/detector/test_forms.py compares this with).

    ``memo``: handed to ``run`` (the request keeps the scores for its ledger basis)."""
    if not forms:
        raise ValueError("no forms to score")
    run = run or detect
    options = {} if memo is None else {"memo": memo}
    if len(forms) == 1:
        return run(forms[0], candidates, config, **options), 0
    m = len(forms)
    share = config.model_copy(update={"threshold": config.threshold / m})
    # Forms that tokenise alike (a normalisation that only touched what the tokeniser
    # ignores) share one detection: detect is a pure function of the token ids.
    deferred: dict[tuple[int, ...], Deferred] = {}
    per_form: list[Deferred] = []
    for tokens in forms:
        ids = tuple(tokens)
        if ids not in deferred:
            deferred[ids] = run(tokens, candidates, share, defer_exact=True, **options)
        per_form.append(deferred[ids])
    lower = {id(form): form.whole_lower() for form in deferred.values()}
    finished: dict[int, DetectionResult] = {}
    best, best_p = -1, math.inf

    def cannot_win(i: int, whole: float, span_lower: Callable[[], float]) -> bool:
        """Whether form i, whose whole-text p is at least ``whole`` and spans' p at least
        ``span_lower()``, has neither a smaller global p than the best nor an equal one at an
        earlier index (the span bound is computed only when the whole text cannot win)."""
        if whole < best_p or (whole == best_p and i < best):
            return False
        floor = min(whole, span_lower())
        return floor > best_p or (floor == best_p and i > best)

    for i in sorted(range(m), key=lambda i: (lower[id(per_form[i])], i)):
        form = per_form[i]
        if best >= 0 and id(form) not in finished:
            if cannot_win(i, lower[id(form)], form.span_lower):
                continue  # without its exact tails
            pending = form.pending()
            if cannot_win(i, pending.whole_log10_p, pending.span_lower):
                continue  # without its span search
        if id(form) not in finished:
            # per_key left empty: only the winner's entries are reported, adjusted once below.
            finished[id(form)] = form.pending().result(per_key=())
        p = finished[id(form)].log10_p_value
        if p < best_p or (p == best_p and (best < 0 or i < best)):
            best, best_p = i, p
    winner = per_form[best]
    factor = math.log10(m)
    return _corrected(finished[id(winner)], config, m, per_key=winner.pending().adjusted_per_key(factor)), best


def detect_forms_exhaustive(forms: Sequence[Sequence[int]], candidates: Sequence[Candidate],
                            config: DetectorConfig,
                            run: Callable[..., DetectionResult] | None = None) -> tuple[DetectionResult, int]:
    """:func:`detect_forms` with every distinct form scored in full, spans included (the
    reference its screen is checked against)."""
    if not forms:
        raise ValueError("no forms to score")
    run = run or detect
    if len(forms) == 1:
        return run(forms[0], candidates, config), 0
    m = len(forms)
    share = config.model_copy(update={"threshold": config.threshold / m})
    scored: dict[tuple[int, ...], DetectionResult] = {}
    results = []
    for tokens in forms:
        ids = tuple(tokens)
        if ids not in scored:
            scored[ids] = run(tokens, candidates, share)
        results.append(scored[ids])
    best = min(range(m), key=lambda i: results[i].log10_p_value)
    return _corrected(results[best], config, m), best


def _corrected(result: DetectionResult, config: DetectorConfig, m: int,
               per_key: tuple[KeyResult, ...] | None = None) -> DetectionResult:
    """The best of m forms' result with its p, per-key and span p-values multiplied by m.
    ``per_key``: its entries already corrected (:meth:`detector.detect.Pending.adjusted_per_key`)."""
    factor = math.log10(m)
    if per_key is None:
        per_key = tuple(dataclasses.replace(k, log10_p_adjusted=min(0.0, k.log10_p_adjusted + factor))
                        for k in result.per_key)
    return _replaced(
        result, threshold=config.threshold, log10_p_value=min(0.0, result.log10_p_value + factor),
        per_key=per_key,
        spans=tuple(_replaced(s, log10_p_value=min(0.0, s.log10_p_value + factor)) for s in result.spans),
        correction=f"{result.correction}; {CORRECTION.format(m=m)}")


def _replaced(item, **changes):
    """``dataclasses.replace(item, **changes)`` for the frozen, slot-less result dataclasses
    (DetectionResult, Span: no ``__post_init__``, no init-only fields) at a fraction of its cost:
    a copy of every field with the named ones changed (as detector.verdict.with_adjusted)."""
    out = object.__new__(type(item))
    out.__dict__.update(item.__dict__)
    out.__dict__.update(changes)
    return out


def distinct_forms(forms: Sequence[Sequence[int]], min_length: int = 0) -> list[list[int]]:
    """The distinct token-id lists among ``forms`` with at least ``min_length`` tokens, in order
    (two forms often tokenise alike: a search run on both would only double its correction)."""
    out: list[list[int]] = []
    for tokens in forms:
        tokens = list(tokens)
        if len(tokens) >= min_length and tokens not in out:
            out.append(tokens)
    return out


Match = TypeVar("Match")


def merge_form_matches(per_form: Sequence[Sequence[Match]]) -> list[Match]:
    """Ledger k-gram matches found in each of m forms of one text (``ledger.kgrams.KgramMatch``,
    with their shared tokens' evidence) merged: per generation and key, the strongest (a tested
    match by its shared tokens' p, then the collision bound), with its collision bound and
    shared-token p multiplied by m (Bonferroni over the forms searched). Best first.

    Every form is searched because the ledger's case is an edited copy whose watermark no
    longer passes: there the best watermark p among the forms is noise, and the form it picks
    (whitespace runs collapsed, say) may share no k-gram with the generation while the text
    as sent shares many. The factor m keeps each match's stated bounds valid whichever form
    matched; with one form (token ids, or text normalisation left unchanged) nothing changes."""
    best: dict[tuple[str, str], Match] = {}
    for matches in per_form:
        for match in matches:
            key = (match.generation_id, match.key_id)
            if key not in best or _strength(match) < _strength(best[key]):
                best[key] = match
    factor = math.log10(max(1, len(per_form)))
    out = [dataclasses.replace(
        match, log10_false_match_bound=min(0.0, match.log10_false_match_bound + factor),
        log10_shared_p=None if match.log10_shared_p is None else min(0.0, round(match.log10_shared_p + factor, 6)))
        for match in best.values()]
    return sorted(out, key=lambda match: (match.log10_false_match_bound, -match.matched))


def _strength(match) -> tuple[float, float]:
    """Smaller is stronger: a tested match (its shared tokens' p) before an untested one, then
    the smaller collision bound."""
    shared = match.log10_shared_p if match.log10_shared_p is not None else math.inf
    return shared, match.log10_false_match_bound
