"""Key-aware re-segmentation of one word (issue 30, item 1): a measured prototype, not wired
into the service.

A model sometimes writes a word as ``encode`` never would (``Ġread`` + ``s`` for ``Ġreads``,
``(`` + ``)`` for ``()``, ``te`` + ``most`` for ``tem`` + ``ost``): a sampling choice the text
does not show. Scored as encoded, the word's tokens and the w tokens whose contexts hold them
lose their watermark. The key can tell which segmentation was written, but choosing by the key
is a search whose multiple-testing cost must be paid.

:func:`word_repairs` lists, from the token ids alone (never a key), the forms that differ from
the encoding in one word: the canonical tokens [start, end) (1 to :data:`MAX_WINDOW` tokens
within one word) written as two vocabulary tokens, or two or more written as one. Those are
the shapes the bundled model's mismatches take (bench/results/detect-core-issue30-stats2.md:
62 of 75 mismatches at T = 0.7 are a model's two tokens against one to six of encode's).
:func:`repair_log10_p` scores each such form with the ordinary detector and returns the best
p times N (Bonferroni over the N forms, valid whatever their dependence: each form is a fixed
function of the text, so its own p is valid under the null). A caller combines it with the
text forms' p by a weighted Bonferroni (:func:`combined_log10_p`): the forms keep 1 - eps of
the level, the repair gets eps.
"""

from __future__ import annotations

import math
from typing import Sequence

from detector.detect import DetectorConfig, detect
from detector.result import Candidate
from detector.segmentation import SegmentationTable

MAX_WINDOW = 3
"""Canonical tokens of one word re-segmented at most (a model's two tokens stood for one to
six of encode's; three covers 55 of the 62)."""
_SPACE_BYTES = frozenset(b" \n\t\r")


def _word_start(piece: bytes) -> bool:
    """Whether a token begins a new word (a byte-level BPE's pre-tokenizer puts a word's space
    before it, so a space-led token does)."""
    return piece[:1] in (b" ", b"\n", b"\t", b"\r")


def word_repairs(canonical: Sequence[int], table: SegmentationTable,
                 max_window: int = MAX_WINDOW) -> list[tuple[int, int, tuple[int, ...]]]:
    """(start, end, tokens): canonical[start:end] (within one word, no whitespace-only token)
    replaced by ``tokens`` (two vocabulary tokens, or one for two or more), each distinct
    resulting form once, in text order. A pure function of the ids."""
    pieces = [table.pieces.get(int(t)) for t in canonical]
    out: list[tuple[int, int, tuple[int, ...]]] = []
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    n = len(pieces)
    for start in range(n):
        first = pieces[start]
        if first is None or all(b in _SPACE_BYTES for b in first):
            continue
        data = b""
        for end in range(start + 1, min(n, start + max_window) + 1):
            piece = pieces[end - 1]
            if piece is None or (end - 1 > start and (_word_start(piece) or all(b in _SPACE_BYTES for b in piece))):
                break
            data += piece
            original = tuple(int(t) for t in canonical[start:end])
            options: list[tuple[int, ...]] = []
            if end - start >= 2 and data in table.by_bytes:
                options.append((table.by_bytes[data],))
            for cut in range(1, len(data)):
                a, b = table.by_bytes.get(data[:cut]), table.by_bytes.get(data[cut:])
                if a is not None and b is not None and cut != 0:
                    options.append((a, b))
            for tokens in options:
                if tokens != original and (start, end, tokens) not in seen:
                    seen.add((start, end, tokens))
                    out.append((start, end, tokens))
    for start in range(n - 1):  # a whitespace run written whole before a bare word
        run, word = pieces[start], pieces[start + 1]
        if run is None or word is None or not run or not all(b in _SPACE_BYTES for b in run):
            continue
        if len(word) < 2 or word[:1] != b" " or word[1:2][0] in _SPACE_BYTES:
            continue
        whole = table.by_bytes.get(run + b" ")
        if whole is None:
            continue
        rest = word[1:]
        options = []
        if rest in table.by_bytes:
            options.append((whole, table.by_bytes[rest]))
        for cut in range(1, len(rest)):
            a, b = table.by_bytes.get(rest[:cut]), table.by_bytes.get(rest[cut:])
            if a is not None and b is not None:
                options.append((whole, a, b))
        for tokens in options:
            if (start, start + 2, tokens) not in seen:
                seen.add((start, start + 2, tokens))
                out.append((start, start + 2, tokens))
    return out


def repair_class(canonical: Sequence[int], repair: tuple[int, int, tuple[int, ...]], table: SegmentationTable) -> str:
    """The shape of a repair (what :data:`CLASS_RATES` weighs): ``run`` (a whitespace run
    written whole), ``space`` (a word's space written alone: ``Ġ`` + ``word``), ``punct`` (a
    token of punctuation or digits split or merged), ``merge`` (two or more tokens as one),
    ``suffix`` (a word written as stem + a suffix of at most 2 bytes), ``other``."""
    start, end, tokens = repair
    pieces = [table.pieces[int(t)] for t in canonical[start:end]]
    new = [table.pieces[int(t)] for t in tokens]
    data = b"".join(pieces)
    if all(b in _SPACE_BYTES for b in pieces[0]):
        return "run"
    if len(new) == 2 and new[0] == b" ":
        return "space"
    if all(not chr(b).isalpha() and b < 0x80 and b not in _SPACE_BYTES for b in data.lstrip(b" ")):
        return "punct"
    if len(new) == 1:
        return "merge"
    if len(new[-1]) <= 2:
        return "suffix"
    return "other"


def repair_log10_p(canonical: Sequence[int], candidates: Sequence[Candidate], config: DetectorConfig,
                   table: SegmentationTable, rates: dict[str, float] | None = None
                   ) -> tuple[float, int, tuple[int, int, tuple[int, ...]] | None]:
    """log10 of the weighted Bonferroni min_j p_j / w_j over the N forms of
    :func:`word_repairs` (capped at 0), N, and the winning repair (None when N is 0). Weights
    w_j: equal (1 / N), or with ``rates`` (a rate per :func:`repair_class`, fixed before the
    text is seen) w_j = rates[class_j] / sum over the text's forms: a pure function of the
    text, so the bound stays valid."""
    repairs = word_repairs(canonical, table)
    if not repairs:
        return 0.0, 0, None
    if rates is None:
        log10_weights = [-math.log10(len(repairs))] * len(repairs)
    else:
        raw = [rates[repair_class(canonical, r, table)] for r in repairs]
        total = sum(raw)
        log10_weights = [math.log10(x / total) for x in raw]
    ids = [int(t) for t in canonical]
    best, best_p = None, math.inf
    for repair, log10_weight in zip(repairs, log10_weights):
        start, end, tokens = repair
        form = ids[:start] + list(tokens) + ids[end:]
        p = detect(form, candidates, config).log10_p_value - log10_weight
        if p < best_p:
            best, best_p = repair, p
    return min(0.0, best_p), len(repairs), best


def combined_log10_p(forms_log10_p: float, repair_log10_p: float, eps: float) -> float:
    """Weighted Bonferroni of the text forms' p (weight 1 - eps) and the repair's (eps):
    min(p_forms / (1 - eps), p_repair / eps), capped at 1."""
    return min(0.0, forms_log10_p - math.log10(1.0 - eps), repair_log10_p - math.log10(eps))
