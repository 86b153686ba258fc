"""Localisation: where in a longer, mixed text the watermark is.

Windows are fixed before looking at the data (they depend on the text length only):
lengths 2^j from ``min_length`` up to the text length, each slid by half its length, plus
one window flush with the end of the text per length. Each window gets its exact p-value
from the same null as the whole text; the family (every window, times the number of keys
examined) is corrected with a weighted union bound (equal share per window length, see
:func:`log10_multiplicities`), so under the null the chance that any span is reported is
at most the threshold. Significant windows are then reduced to disjoint spans,
most significant first (see :func:`merge`), and their boundaries are refined at token
resolution (see :func:`refine`). The p-value reported for a span is its grid window's
corrected one: refinement moves the offsets only, so it spends no error budget (and no
verdict or p-value depends on it).
"""

from __future__ import annotations

import functools
import heapq
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from watermark import jit

LN10 = math.log(10.0)


@dataclass(frozen=True)
class Window:
    start: int
    end: int


def windows(total: int, min_length: int) -> list[Window]:
    """The fixed window family for a text of ``total`` tokens."""
    out: list[Window] = []
    length = min_length
    while length <= total:
        step = max(1, length // 2)
        starts = list(range(0, total - length + 1, step))
        if starts[-1] != total - length:
            starts.append(total - length)
        out.extend(Window(s, s + length) for s in starts)
        length *= 2
    return out


def log10_multiplicities(family: list[Window], family_size_factor: int = 1) -> np.ndarray:
    """log10 of each window's Bonferroni factor [len(family)]: every window length (scale)
    gets an equal share of the budget, split evenly among that length's windows, so a
    window's p is multiplied by (number of lengths) x (windows of its length) x keys. The
    weights sum to 1 and depend on the text length only. Equal shares per scale (rather
    than per window) spend less on the many short windows, where a watermark that reaches
    the threshold at all is strong, and more on the few long ones that low-entropy text
    needs (the multiscale scan's usual weighting)."""
    lengths = np.array([w.end - w.start for w in family])
    scales, index, per_scale = np.unique(lengths, return_inverse=True, return_counts=True)
    return np.log10(len(scales) * per_scale[index] * max(1, family_size_factor)).astype(np.float64)


@functools.lru_cache(maxsize=512)
def _grid(total: int, min_length: int, family_size_factor: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The window family as arrays (starts, ends, log10 multiplicities), or None if empty:
    fixed by the text length, so built once per length (read-only arrays)."""
    family = windows(total, min_length)
    if not family:
        return None
    out = (np.array([w.start for w in family]), np.array([w.end for w in family]),
           log10_multiplicities(family, family_size_factor))
    for array in out:
        array.setflags(write=False)
    return out


@dataclass(frozen=True)
class SpanHit:
    start: int
    end: int
    scored_tokens: int
    log10_p_value: float


@dataclass(frozen=True)
class LowerKind:
    """Which lower bound a ``log10_sf_lower`` callable is, so that :func:`_screen` can
    compute it in its compiled pass (:func:`_screen_windows`): ``weighted`` False:
    :func:`detector.stats.gamma_log10_sf_lower`; True:
    :func:`detector.stats.weighted_gamma_log10_sf_lower` at ``alpha``."""

    weighted: bool
    alpha: float = 0.0


def locate(positions: np.ndarray, scores: np.ndarray, total: int, *, min_length: int,
           family_size_factor: int, log10_threshold: float,
           log10_sf: Callable[[float, int], float],
           log10_sf_lower: Callable[[np.ndarray, np.ndarray], np.ndarray],
           log10_sf_many: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
           lower_kind: LowerKind | None = None) -> list[SpanHit]:
    """Significant merged spans.

    positions [n] (ascending scored positions) and scores [n] are one key's evidence;
    ``family_size_factor`` multiplies the window count in the correction (keys examined).
    ``log10_sf`` is the exact null tail of a window's score sum; ``log10_sf_lower`` a
    vectorised lower bound on it (sums [k], counts [k] -> [k]), used only to skip windows
    that cannot pass: a lower bound, never an upper one, so no passing window is skipped.
    ``log10_sf_many``, if given, is ``log10_sf`` vectorised (sums [k], counts [k] -> [k]).
    ``lower_kind``: which bound ``log10_sf_lower`` is (:class:`LowerKind`), so that the
    screen computes it compiled where numba is loaded.
    """
    screened = _screen(positions, scores, total, min_length=min_length, family_size_factor=family_size_factor,
                       log10_threshold=log10_threshold, log10_sf_lower=log10_sf_lower, lower_kind=lower_kind)
    if screened is None:
        return []
    starts, ends, log10_m, sums, counts, live, lower = screened
    hits: list[SpanHit] = []
    if log10_sf_many is None:
        return _merge_lazily(live, lower, starts, ends, sums, counts, log10_m, log10_threshold, log10_sf)
    exact = log10_sf_many(sums[live], counts[live]) if len(live) else []
    merge_of = _kernel("_merge_windows") if len(live) else None
    if merge_of is not None:  # the hits and their merge in one compiled pass (the same floats and order)
        kept_starts, kept_ends, kept_counts, kept_p = merge_of(live, exact, log10_m, starts, ends, counts,
                                                              float(log10_threshold))
        return [SpanHit(s, e, c, p) for s, e, c, p in zip(kept_starts.tolist(), kept_ends.tolist(),
                                                           kept_counts.tolist(), kept_p.tolist())]
    for i, log10_p in zip(live.tolist(), exact):
        adjusted = min(0.0, float(log10_p) + float(log10_m[i]))
        if adjusted <= log10_threshold:
            hits.append(SpanHit(int(starts[i]), int(ends[i]), int(counts[i]), adjusted))
    return merge(hits)


def _screen(positions: np.ndarray, scores: np.ndarray, total: int, *, min_length: int, family_size_factor: int,
            log10_threshold: float, log10_sf_lower: Callable[[np.ndarray, np.ndarray], np.ndarray],
            lower_kind: LowerKind | None = None):
    """The window grid's sums and counts and the windows that may pass: (starts, ends, log10
    multiplicities, sums, counts, live [k], lower bounds on live's corrected log10 p [k]), or
    None when the text has no window.

    With ``lower_kind`` and numba loaded, all of it in one compiled pass
    (:func:`_screen_windows`): the same sums and counts; the bounds from libm's log, which
    may differ from numpy's in the last bit. A bound only decides which windows get an exact
    tail and in what order :func:`_merge_lazily` looks at them (neither changes what is
    reported: every window that can pass keeps a bound below its exact p by far more than
    an ulp, the one-term bound being a factor of about sqrt(2 pi n) below the tail), and
    :func:`lower_bound`'s screens in :func:`detector.forms.detect_forms`, which only decide
    what is computed."""
    grid = _grid(total, min_length, family_size_factor)
    if grid is None:
        return None
    starts, ends, log10_m = grid
    screen_of = _kernel("_screen_windows") if lower_kind is not None and scores.dtype == np.float64 else None
    if screen_of is not None:
        from detector import stats

        sums, counts, live, lower = screen_of(
            np.ascontiguousarray(positions), np.ascontiguousarray(scores), starts, ends, log10_m,
            stats._log_fact(len(scores)), lower_kind.weighted, float(lower_kind.alpha), float(log10_threshold))
        return starts, ends, log10_m, sums, counts, live, lower
    sums_of = _kernel("_window_sums")
    if sums_of is not None and scores.dtype == np.float64:
        sums, counts = sums_of(np.ascontiguousarray(positions), np.ascontiguousarray(scores), starts, ends)
    else:
        prefix = np.concatenate(([0.0], np.cumsum(scores)))
        lo = np.searchsorted(positions, starts, side="left")
        hi = np.searchsorted(positions, ends, side="left")
        counts = hi - lo
        sums = prefix[hi] - prefix[lo]
    live = np.flatnonzero(counts > 0)
    lower = log10_sf_lower(sums[live], counts[live]) + log10_m[live]
    keep = lower <= log10_threshold
    return starts, ends, log10_m, sums, counts, live[keep], lower[keep]


def lower_bound(positions: np.ndarray, scores: np.ndarray, total: int, *, min_length: int,
                family_size_factor: int, log10_threshold: float,
                log10_sf_lower: Callable[[np.ndarray, np.ndarray], np.ndarray],
                lower_kind: LowerKind | None = None) -> float:
    """A lower bound on the corrected log10 p of every span :func:`locate` can report with
    these arguments (inf when none can pass): the screen :func:`locate` runs first, without
    any exact tail (a caller deciding whether the spans can matter at all)."""
    screened = _screen(positions, scores, total, min_length=min_length, family_size_factor=family_size_factor,
                       log10_threshold=log10_threshold, log10_sf_lower=log10_sf_lower, lower_kind=lower_kind)
    if screened is None or not len(screened[-1]):
        return math.inf
    return min(0.0, float(screened[-1].min()))


def _merge_lazily(live: np.ndarray, lower: np.ndarray, starts: np.ndarray, ends: np.ndarray, sums: np.ndarray,
                  counts: np.ndarray, log10_m: np.ndarray, log10_threshold: float,
                  log10_sf: Callable[[float, int], float]) -> list[SpanHit]:
    """:func:`merge` of the passing windows among ``live`` [k] (with lower bounds [k] on their
    corrected log10 p), computing a window's exact p only when it can still be reported.

    Windows come off a heap in :func:`merge`'s order, keyed first by the lower bound and,
    once computed, by the exact p (a bound sorts before an equal exact p, so no window is
    taken before one that might beat it; then shorter first, then earlier, as merge's
    stable sort). A window whose bound comes off the heap overlapping a span already kept
    has an exact p no smaller than that span's, so merge would drop it: its exact p is never
    computed. On a watermarked text most windows overlap the first spans kept, which is what
    this saves (the weighted statistic's tail has no vectorised form)."""
    heap = [(float(b), 0, int(ends[i] - starts[i]), int(i)) for i, b in zip(live.tolist(), lower.tolist())]
    heapq.heapify(heap)
    kept: list[SpanHit] = []
    while heap:
        value, exact, length, i = heapq.heappop(heap)
        start, end = int(starts[i]), int(ends[i])
        if any(start < k.end and k.start < end for k in kept):
            continue
        if exact:
            kept.append(SpanHit(start, end, int(counts[i]), value))
            continue
        adjusted = min(0.0, float(log10_sf(float(sums[i]), int(counts[i]))) + float(log10_m[i]))
        if adjusted <= log10_threshold:
            heapq.heappush(heap, (adjusted, 1, length, i))
    return sorted(kept, key=lambda h: h.start)


def merge(hits: list[SpanHit]) -> list[SpanHit]:
    """Most significant windows first, each kept unless it overlaps one already kept:
    a window holding the watermarked stretch plus unmarked text is less significant than
    a tighter one, so this returns tight, disjoint spans."""
    kept: list[SpanHit] = []
    for hit in sorted(hits, key=lambda h: (h.log10_p_value, h.end - h.start)):
        if all(hit.end <= k.start or hit.start >= k.end for k in kept):
            kept.append(hit)
    return sorted(kept, key=lambda h: h.start)


REFINE_ROUNDS = 16
"""At most this many re-estimates of a span's mean score in :func:`refine` (it settles in
two or three on every text measured)."""


def refine(hits: list[SpanHit], positions: np.ndarray, scores: np.ndarray, total: int, *,
           context_width: int = 0) -> list[SpanHit]:
    """Token-resolution boundaries for each grid hit: within the hit extended by half its
    length on each side, the stretch of scored tokens maximising sum(score - c), with c
    halfway between the null mean 1 and the mean score of the stretch itself (Kadane's
    maximum-subarray scan; the mean re-estimated from the stretch found until it settles).
    A stretch of tokens whose mean is above c raises the z-score of the stretch it joins, so
    the result is the most significant stretch around the hit, consistent with its own mean.

    The first estimate starts from the grid window's mean, which is where this function
    used to stop. A grid window is fixed by the text length, not by the data, so it can
    straddle unmarked text, whose scores dilute its mean: in the page test's case (an edited
    generation pasted after a human paragraph, tests/service/test_ui_evidence.py; issue 21
    measured another such case ~125 characters early) the window's mean of 1.64 gave a cut of
    1.32, which let in the paragraph's last 53 tokens, whose scores happen to average 1.36
    under that key: an underline starting 198 characters inside the human text. Against the
    stretch's own mean (1.92, cut 1.46) they lower its significance and stay out. (The
    maximum-likelihood change point cuts at m ln m / (m - 1), lower at every mean m: with it
    in place of this cut, bench/span_boundaries.py found more boundaries within 10
    characters but ran into the human text two to three times as often.)

    Offsets [start, end) become one past the last token of the stretch and, with
    ``context_width`` w, the first token of the context of its first scored token (w tokens
    before it, never inside the previous span): that token's score says it was sampled
    after exactly these w tokens, so they belong to the generation too; without them a
    pasted generation's underline started w tokens late, always. The p-value stays the
    window's."""
    out: list[SpanHit] = []
    refine_all = _kernel("_refine_hits") if hits and scores.dtype == np.float64 else None
    if refine_all is not None:  # every hit in one compiled pass: the same sums, cuts and scans
        firsts, lasts = refine_all(np.ascontiguousarray(positions), np.ascontiguousarray(scores),
                                   np.array([h.start for h in hits], dtype=np.int64),
                                   np.array([h.end for h in hits], dtype=np.int64), int(total), REFINE_ROUNDS)
        for hit, first, last in zip(hits, firsts.tolist(), lasts.tolist()):
            out.append(hit if last < 0 else SpanHit(int(positions[first]), int(positions[last - 1]) + 1,
                                                    int(last - first), hit.log10_p_value))
        hits = ()
    for hit in hits:
        length = hit.end - hit.start
        lo_pos, hi_pos = max(0, hit.start - length // 2), min(total, hit.end + length // 2)
        lo, hi = np.searchsorted(positions, [lo_pos, hi_pos], side="left")
        in_lo, in_hi = np.searchsorted(positions, [hit.start, hit.end], side="left")
        if in_hi <= in_lo or hi <= lo:
            out.append(hit)
            continue
        region = np.asarray(scores[lo:hi], dtype=np.float64)
        best_range = (int(in_lo), int(in_hi))
        seen = {best_range}
        kadane = _kernel("_kadane_loop")
        for _ in range(REFINE_ROUNDS):
            # ndarray.mean's own value (its pairwise sum over the count), without its wrapper.
            stretch = scores[best_range[0]:best_range[1]]
            cut = 0.5 * (1.0 + float(np.add.reduce(stretch) / len(stretch)))
            if kadane is not None:
                first, last = kadane(region, cut)
                found = (int(lo) + first, int(lo) + last) if last > 0 else best_range
            else:
                found = _max_subarray(region, cut, int(lo)) or best_range
            if found in seen:
                best_range = found
                break
            seen.add(found)
            best_range = found
        first, last = best_range
        out.append(SpanHit(int(positions[first]), int(positions[last - 1]) + 1, int(last - first),
                           hit.log10_p_value))
    kept = _disjoint(out)
    if context_width <= 0:
        return kept
    widened: list[SpanHit] = []
    for hit in kept:  # sorted by start, disjoint
        floor = widened[-1].end if widened else 0
        widened.append(SpanHit(max(floor, hit.start - context_width), hit.end, hit.scored_tokens, hit.log10_p_value))
    return widened


def _max_subarray(values: np.ndarray, cut: float, offset: int) -> tuple[int, int] | None:
    """[first, last) (plus ``offset``) of the stretch of ``values`` [n] (float64) maximising
    sum(v - cut); None if no value exceeds ``cut``."""
    best, best_range, running, run_start = 0.0, None, 0.0, 0
    # The differences in one vectorised step (the same IEEE subtraction as per element); the
    # running sum stays a sequential loop, so every comparison sees the same floats as before.
    for i, step in enumerate((values - cut).tolist()):
        if running <= 0.0:
            running, run_start = 0.0, i
        running += step
        if running > best:
            best, best_range = running, (offset + run_start, offset + i + 1)
    return best_range


def _kadane_loop(values, cut):  # pragma: no cover - compiled
    """:func:`_max_subarray` (offset 0) compiled: the same sequential sums and comparisons,
    (0, 0) for None."""
    best = 0.0
    first = 0
    last = 0
    running = 0.0
    run_start = 0
    for i in range(values.shape[0]):
        if running <= 0.0:
            running = 0.0
            run_start = i
        running += values[i] - cut
        if running > best:
            best = running
            first = run_start
            last = i + 1
    return first, last


def _window_sums(positions, scores, starts, ends):  # pragma: no cover - compiled
    """The grid windows' score sums and scored-token counts [k]: :func:`_screen`'s numpy steps
    (a running prefix sum, the windows' first and last scored positions by binary search, the
    difference of two prefix sums) in one pass, the same floats."""
    prefix = np.empty(scores.shape[0] + 1)
    prefix[0] = 0.0
    running = 0.0
    for i in range(scores.shape[0]):
        running += scores[i]
        prefix[i + 1] = running
    lo = np.searchsorted(positions, starts)
    hi = np.searchsorted(positions, ends)
    counts = hi - lo
    sums = np.empty(starts.shape[0])
    for w in range(starts.shape[0]):
        sums[w] = prefix[hi[w]] - prefix[lo[w]]
    return sums, counts


_LN10 = LN10
_LOG10_2 = math.log10(2.0)


def _screen_windows(positions, scores, starts, ends, log10_m, log_fact, weighted, alpha,
                    log10_threshold):  # pragma: no cover - compiled
    """:func:`_screen`'s steps in one pass: the window sums and counts as :func:`_window_sums`,
    and for each window with a scored token the lower bound on its corrected log10 p
    (:func:`detector.stats.gamma_log10_sf_lower`, or ``weighted_gamma_log10_sf_lower`` at
    ``alpha``, term for term, with libm's log) plus its log10 multiplicity; returns (sums,
    counts, live, lower): the windows whose bound is at most the threshold, and their bounds."""
    sums, counts = _window_sums(positions, scores, starts, ends)
    k = starts.shape[0]
    live = np.empty(k, dtype=np.int64)
    lower = np.empty(k)
    small = min(alpha, 1.0 - alpha)
    large = max(alpha, 1.0 - alpha)
    found = 0
    for w in range(k):
        n = counts[w]
        if n <= 0:
            continue
        x = sums[w]
        if weighted:
            rest = (x - small * max(n - 1, 0)) / large
            bound = -_LOG10_2
            if rest > 0.0:
                bound = min(0.0, (n - 1) * math.log(rest) - rest - log_fact[n - 1]) / _LN10 - _LOG10_2
        else:
            bound = 0.0
            if x > 0.0:
                bound = min(0.0, (n - 1) * math.log(x) - x - log_fact[n - 1]) / _LN10
        bound += log10_m[w]
        if bound <= log10_threshold:
            live[found] = w
            lower[found] = bound
            found += 1
    return sums, counts, live[:found], lower[:found]


def _numpy_sum(values, start, count):  # pragma: no cover - compiled
    """np.add.reduce(values[start:start + count]) for float64 values, bit for bit: numpy's
    pairwise summation (8 running sums over blocks of at most 128, halves split at multiples
    of 8 above that) added to the reduction's initial 0.0 (checked against numpy in
    tests/detector/test_spans.py)."""
    if count < 8:
        res = 0.0
        for i in range(count):
            res += values[start + i]
        return res
    if count <= 128:
        r0 = values[start]
        r1 = values[start + 1]
        r2 = values[start + 2]
        r3 = values[start + 3]
        r4 = values[start + 4]
        r5 = values[start + 5]
        r6 = values[start + 6]
        r7 = values[start + 7]
        i = 8
        stop = count - count % 8
        while i < stop:
            r0 += values[start + i]
            r1 += values[start + i + 1]
            r2 += values[start + i + 2]
            r3 += values[start + i + 3]
            r4 += values[start + i + 4]
            r5 += values[start + i + 5]
            r6 += values[start + i + 6]
            r7 += values[start + i + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < count:
            res += values[start + i]
            i += 1
        return res
    half = count // 2
    half -= half % 8
    return _numpy_sum(values, start, half) + _numpy_sum(values, start + half, count - half)


def _merge_windows(live, exact, log10_m, starts, ends, counts, log10_threshold):  # pragma: no cover - compiled
    """:func:`locate`'s hits from the live windows' exact log10 p [L] and :func:`merge` of them:
    each window's corrected p min(0, p + log10 m), those at most the threshold taken in
    order of (p, length), ties in window order (a stable sort, as Python's), each kept unless
    it overlaps one kept before; returned sorted by start as (starts, ends, counts, p)."""
    found = live.shape[0]
    index = np.empty(found, dtype=np.int64)
    adjusted = np.empty(found)
    lengths = np.empty(found, dtype=np.int64)
    hits = 0
    for j in range(found):
        i = live[j]
        value = exact[j] + log10_m[i]
        value = value if value < 0.0 else 0.0
        if value <= log10_threshold:
            index[hits] = i
            adjusted[hits] = value
            lengths[hits] = ends[i] - starts[i]
            hits += 1
    index = index[:hits]
    adjusted = adjusted[:hits]
    # By (p, length), ties in window order: stable sorts by the second key, then the first.
    order = np.argsort(lengths[:hits], kind="mergesort")
    order = order[np.argsort(adjusted[order], kind="mergesort")]
    kept = np.empty(hits, dtype=np.int64)
    count = 0
    for o in order:
        i = index[o]
        free = True
        for k in range(count):
            other = index[kept[k]]
            if not (ends[i] <= starts[other] or starts[i] >= ends[other]):
                free = False
                break
        if free:
            kept[count] = o
            count += 1
    kept = kept[:count]
    kept_starts = np.empty(count, dtype=np.int64)
    for k in range(count):
        kept_starts[k] = starts[index[kept[k]]]
    kept = kept[np.argsort(kept_starts, kind="mergesort")]
    out_starts = np.empty(count, dtype=np.int64)
    out_ends = np.empty(count, dtype=np.int64)
    out_counts = np.empty(count, dtype=np.int64)
    out_p = np.empty(count)
    for k in range(count):
        i = index[kept[k]]
        out_starts[k] = starts[i]
        out_ends[k] = ends[i]
        out_counts[k] = counts[i]
        out_p[k] = adjusted[kept[k]]
    return out_starts, out_ends, out_counts, out_p


def _refine_hits(positions, scores, starts, ends, total, rounds):  # pragma: no cover - compiled
    """:func:`refine`'s loop over hits [h] (grid windows [start, end)): the stretch [first,
    last) of scored tokens each settles on, by the same steps (the region's bounds by binary
    search, the stretch's mean as ndarray.mean's pairwise sum over its count, the cut, the
    compiled scan, the same stop when a stretch repeats); last -1 where refine keeps the hit."""
    h = starts.shape[0]
    firsts = np.empty(h, dtype=np.int64)
    lasts = np.empty(h, dtype=np.int64)
    seen_first = np.empty(rounds + 1, dtype=np.int64)
    seen_last = np.empty(rounds + 1, dtype=np.int64)
    for k in range(h):
        start = starts[k]
        end = ends[k]
        length = end - start
        lo = np.searchsorted(positions, max(0, start - length // 2))
        hi = np.searchsorted(positions, min(total, end + length // 2))
        in_lo = np.searchsorted(positions, start)
        in_hi = np.searchsorted(positions, end)
        if in_hi <= in_lo or hi <= lo:
            firsts[k] = -1
            lasts[k] = -1
            continue
        best_first = in_lo
        best_last = in_hi
        seen_first[0] = in_lo
        seen_last[0] = in_hi
        seen = 1
        for _ in range(rounds):
            count = best_last - best_first
            cut = 0.5 * (1.0 + (0.0 + _numpy_sum(scores, best_first, count)) / count)
            first, last = _kadane_loop(scores[lo:hi], cut)
            if last > 0:
                found_first = lo + first
                found_last = lo + last
            else:
                found_first = best_first
                found_last = best_last
            repeated = False
            for j in range(seen):
                if seen_first[j] == found_first and seen_last[j] == found_last:
                    repeated = True
            best_first = found_first
            best_last = found_last
            if repeated:
                break
            seen_first[seen] = found_first
            seen_last[seen] = found_last
            seen += 1
        firsts[k] = best_first
        lasts[k] = best_last
    return firsts, lasts


@functools.cache
def _compiled():
    return jit.compile_all({"_kadane_loop": _kadane_loop, "_window_sums": _window_sums,
                            "_screen_windows": _screen_windows, "_numpy_sum": _numpy_sum,
                            "_refine_hits": _refine_hits, "_merge_windows": _merge_windows})


def _kernel(name: str):
    """The compiled function ``name`` (of :func:`_compiled`'s) where this process has loaded
    numba (watermark.jit), else None: a one-off detection stays on numpy."""
    compiled = _compiled() if jit.loaded() else None
    return None if compiled is None else compiled[name]


def _disjoint(hits: list[SpanHit]) -> list[SpanHit]:
    kept: list[SpanHit] = []
    for hit in sorted(hits, key=lambda h: h.log10_p_value):
        if all(hit.end <= k.start or hit.start >= k.end for k in kept):
            kept.append(hit)
    return sorted(kept, key=lambda h: h.start)


def warm_up() -> None:
    """Compile the span search's kernels now, with the types a detection gives them (the
    gateway's start, service.warmup: no request compiles): a search over made-up scores that
    finds a span under each null tail a detection uses (Gamma, vectorised; weighted, lazily)."""
    from detector import stats

    positions = np.arange(64, dtype=np.int64)
    scores = np.concatenate((np.full(32, 0.5), np.full(32, 4.0)))
    families = ((stats.gamma_log10_sf, stats.gamma_log10_sf_lower, stats.gamma_log10_sf_many),
                (lambda s, n: stats.weighted_gamma_log10_sf(s, n, 0.1),
                 lambda s, n: stats.weighted_gamma_log10_sf_lower(s, n, 0.1), None))
    for (log10_sf, log10_sf_lower, many), kind in zip(families, (LowerKind(False), LowerKind(True, 0.1))):
        for lower_kind in (None, kind):
            hits = locate(positions, scores, len(positions), min_length=16, family_size_factor=1,
                          log10_threshold=-2.0, log10_sf=log10_sf, log10_sf_lower=log10_sf_lower,
                          log10_sf_many=many, lower_kind=lower_kind)
            refine(hits, positions, scores, len(positions), context_width=4)
