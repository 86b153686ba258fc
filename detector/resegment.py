"""Key-aware re-segmentation of one word (issue 30, item 1): a measured prototype, not wired
into the service.

A model sometimes writes a word as ``encode`` never would (``Ġread`` + ``s`` for ``Ġreads``,
``(`` + ``)`` for ``()``, ``te`` + ``most`` for ``tem`` + ``ost``): a sampling choice the text
does not show. Scored as encoded, the word's tokens and the w tokens whose contexts hold them
lose their watermark. The key can tell which segmentation was written, but choosing by the key
is a search whose multiple-testing cost must be paid.

:func:`word_repairs` lists, from the token ids alone (never a key), the forms that differ from
the encoding in one word: the canonical tokens [start, end) (1 to :data:`MAX_WINDOW` tokens
within one word) written as two vocabulary tokens, or two or more written as one, and a
whitespace run written whole before a bare word. Those are the shapes the bundled model's
mismatches take (bench/results/detect-core-issue30-stats2.md: 62 of 75 mismatches at T = 0.7
are a model's two tokens against one to six of encode's). :func:`repair_log10_p` scores each
such form with the ordinary detector and returns the best p times N (Bonferroni over the N
forms, valid whatever their dependence: each form is a fixed function of the text, so its own
p is valid under the null); :func:`repair_sum_log10_p` does the same on the sum test alone,
incrementally (~1.6 ms per 100-token text and key against ~38 ms). A caller combines either
with the text forms' p by a weighted Bonferroni (:func:`combined_log10_p`): the forms keep
1 - eps of the level, the repair gets eps.

Measured there: at eps 0.05 it cuts the bundled model's texts lost at 1e-6 by ~18 % (none at
1e-3), short of item 1's 0.02 in six rows of ten; finding one word among N ~ 1.5 per token
costs log10(N / eps) ~ 3.4 orders, more than a mismatch costs most texts it loses. Hence not
wired in (the lead's call).
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
                if a is not None and b is not None:
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


def combined_log10_p(forms_log10_p: float, repair_log10_p: float, eps: float,
                     up_to: float | None = None) -> float:
    """The text forms' p and the repair's combined by a Bonferroni split of each level t: the
    text is rejected at t when p_forms <= t - b(t) or p_repair <= b(t), b(t) = eps * min(t,
    ``up_to``) (``up_to`` None: b(t) = eps * t, the plain weighted Bonferroni
    min(p_forms / (1 - eps), p_repair / eps)). Both parts are nondecreasing in t, so the
    rejections are nested and the smallest t that rejects is a p-value: P(p <= t) <= t for
    every t. With ``up_to`` (say 1e-5) the repair's share stops growing there: levels far above
    it (1e-3) lose only eps * up_to of the forms' share (a p larger by at most 5e-7 at eps
    0.05), where the repair, which wins only on strong texts, would buy nothing."""
    p_forms, p_repair = 10.0 ** forms_log10_p, 10.0 ** repair_log10_p
    if up_to is None or p_forms <= (1.0 - eps) * up_to:
        from_forms = forms_log10_p - math.log10(1.0 - eps)
    else:
        from_forms = math.log10(p_forms + eps * up_to)
    if up_to is None or p_repair <= eps * up_to:
        from_repair = repair_log10_p - math.log10(eps)
    else:
        from_repair = 0.0
    return min(0.0, from_forms, from_repair)


def repair_sum_log10_p(canonical: Sequence[int], key, table: SegmentationTable
                       ) -> tuple[float, int, tuple[int, int, tuple[int, ...]] | None]:
    """:func:`repair_log10_p` for one key at a fraction of its cost (:func:`sum_totals`):
    (log10 of N x the smallest form's sum-test p, capped at 0; N; the best repair). The Gamma
    tail is monotone in the score at fixed n, so only each n's best form needs it."""
    from detector import stats

    repairs, scores, counts = sum_totals(canonical, key, table)
    best, best_p = None, math.inf
    for n in sorted(set(counts.tolist())):
        if n <= 0:
            continue
        at = [i for i in range(len(repairs)) if counts[i] == n]
        top = max(at, key=lambda i: scores[i])
        p = stats.gamma_log10_sf(float(scores[top]), int(n))
        if p < best_p or (p == best_p and top < best):
            best, best_p = top, p
    if best is None:
        return 0.0, len(repairs), None
    return min(0.0, best_p + math.log10(len(repairs))), len(repairs), repairs[best]


def sum_repairs(canonical: Sequence[int], key, table: SegmentationTable
                ) -> tuple[list[tuple[int, int, tuple[int, ...]]], list[float]]:
    """The :func:`word_repairs` forms and each one's sum-test log10 p under ``key``
    (:func:`sum_totals`'s scores and counts through the Gamma tail)."""
    from detector import stats

    repairs, scores, counts = sum_totals(canonical, key, table)
    return repairs, [stats.gamma_log10_sf(float(s), int(n)) if n > 0 else math.inf
                     for s, n in zip(scores, counts)]


def sum_totals(canonical: Sequence[int], key, table: SegmentationTable):
    """The :func:`word_repairs` forms and each one's sum-test score and scored count under
    ``key`` (statistic ``single`` for a gumbel key, ``max`` for a dual key: both local, Exp(1) per
    token under the null), computed from the encoding's scores by replacing those of the
    positions a form changes (its window and the w after it) in one batched PRF pass over
    every form's new positions. A form's scored positions are the encoding's outside that
    range plus the range's own whose context is neither padding under dedup scope ``all`` nor
    among the contexts already kept (so every scored context is distinct, as the null needs;
    a key-free rule, so each form's p is valid). Where no context repeats this is exactly
    ``detect`` with ``test="sum"``, spans off and ``dual_statistic="max"`` on the form."""
    import numpy as np

    from detector import scoring
    from watermark.dedup import PAD

    repairs = word_repairs(canonical, table)
    if not repairs:
        return [], np.zeros(0), np.zeros(0, dtype=np.int64)
    spec = key.spec
    width, skip_padded = spec.context_width, spec.dedup == "all"
    statistic = "single" if spec.algorithm == "gumbel" else "max"
    tokens = np.asarray([int(t) for t in canonical], dtype=np.int64)
    base = scoring.scored_positions(tokens, width, spec.dedup)
    base_scores = scoring.token_scores(key, base, statistic)
    cumulative = np.concatenate(([0.0], np.cumsum(base_scores)))
    where: dict[tuple[int, ...], list[int]] = {}  # each scored context's positions (one, deduplicated)
    for position, context in zip(base.positions.tolist(), map(tuple, base.contexts.tolist())):
        where.setdefault(context, []).append(position)
    ids = tokens.tolist()
    ranges, new_contexts, new_tokens, owner = [], [], [], []
    for index, (start, end, replacement) in enumerate(repairs):
        lo, hi = start, min(len(ids), end + width)  # encoding's positions whose context or token changes
        first, last = np.searchsorted(base.positions, [lo, hi])
        ranges.append((int(first), int(last)))
        offset = start - max(0, start - width)
        padded = [PAD] * (width - offset) + ids[start - offset:start] + list(replacement) + ids[end:hi]
        seen = set()
        for j in range(len(replacement) + (hi - end)):  # the form's j-th changed position
            context = tuple(padded[j:j + width])
            if (skip_padded and PAD in context) or context in seen or any(
                    p < lo or p >= hi for p in where.get(context, ())):
                continue
            seen.add(context)
            new_contexts.append(context)
            new_tokens.append(padded[j + width])
            owner.append(index)
    added = np.zeros(len(repairs))
    added_count = np.zeros(len(repairs), dtype=np.int64)
    if new_tokens:
        scored = scoring.ScoredPositions(np.zeros(len(new_tokens), dtype=np.int64),
                                         np.ascontiguousarray(np.asarray(new_contexts, dtype=np.int64)),
                                         np.asarray(new_tokens, dtype=np.int64))
        scores = scoring.token_scores(key, scored, statistic)
        owner_array = np.asarray(owner)
        added = np.bincount(owner_array, weights=scores, minlength=len(repairs))
        added_count = np.bincount(owner_array, minlength=len(repairs))
    total, count = float(cumulative[-1]), len(base_scores)
    ranges_array = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    removed_scores = cumulative[ranges_array[:, 1]] - cumulative[ranges_array[:, 0]]
    scores_out = total - removed_scores + added
    counts_out = count - (ranges_array[:, 1] - ranges_array[:, 0]) + added_count
    return repairs, scores_out, counts_out
