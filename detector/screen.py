"""The screen of a many-key detection: bounds on every key's p-value from integer scan
statistics (:mod:`watermark.keyscan`), and the tables those statistics read.

A detection against m keys reports the best key's exact p, Šidák-corrected for m
(:mod:`detector.detect`). Only keys that might be the best need their exact p; the screen
finds them without computing any key's scores in floating point. Per key it bounds the
key's combined p-value P_k (the minimum over its tests of p / share) from below (L_k) and
from above (U_k); a key with L_k > min_j U_j has P_k > min_j P_j, so it is not the best key
and cannot change the global p, the verdict or the spans. Those bounds:

* **Sums.** ``sum_a``/``sum_b``/``sum_max`` add per-token upper bounds on the scores: for
  each bucket of r = 2^24 - mantissa (1/64 of an octave) the chord of the score, which is
  convex in r, lies above it. So S <= S_hi and, with GAP the largest distance between
  chord and score over any bucket (3e-5 nats), S >= S_hi - n GAP. A tail decreasing in S
  turns them into bounds on p (with margins for the detector's own float rounding).
* **Tr-GoF.** Every token's level counts the thresholds tau_1 > ... > tau_J its p-value
  may lie at or below (rounded toward more), so with c_j the tokens at level >= j, the
  i-th smallest p-value exceeds tau_j whenever c_j < i. The statistic max_i n K(i/n,
  p_(i)) (over p_(i) < i/n, i <= I) is then at most G = max_j n K(min(c_{j-1}, I)/n, tau_j),
  K(u, v) falling in v below u (``gof``). Under the null, P(S >= G) >= P(U_(1) <= a_1(G))
  = 1 - (1 - a_1)^n, a_1 the boundary n K(1/n, a_1) = G: the event puts the smallest
  p-value on or below its boundary (:func:`log10_trgof_lower`). The thresholds are fine
  where a null text's order statistics sit (steps of half a standard deviation of p_(i)
  for 4,096 tokens, then a factor 1.65 below 1/4,096), so G exceeds the statistic by a
  fraction of a nat on null text.

The screen never decides a verdict: :mod:`detector.multikey` computes every key it
keeps with :mod:`detector.detect`'s own per-key code.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from watermark import keyscan
from watermark.keyscan import CHORD_BITS, CHORD_BUCKETS, EXPONENTS, FRACTION_BITS, LEVEL_BITS, LEVEL_BUCKETS, LEVELS

LN10 = math.log(10.0)
ONE = float(1 << FRACTION_BITS)
P_FLOOR = 2.0 ** -23
"""Every per-token p-value is at least this (:data:`detector.trgof.GRID_SLACK`)."""
DESIGN_TOKENS = 4096
"""Text length the thresholds are spaced for (shorter texts get finer steps than they need)."""
STEP_SD = 0.5
"""Threshold step in standard deviations of the order statistic near it."""
TAIL_RATIO = 1.65
MARGIN = 16
"""Fixed-point units added to every chord value (far above the float64 error of the table
and of the detector's own per-token scores, about 1e-15 of a score)."""
RELATIVE_SLACK = 1e-9
"""Relative slack on thresholds and bounds against float rounding in the detector."""


def _d_lower(r: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """A lower bound on 1 - u [..] for real r [..] in buckets of float32 exponent [..]:
    r 2^-24 below 2^23 (exact there), (r - 1) 2^-24 from 2^23 on."""
    return np.where(exponent >= 23, r - 1.0, r) * 2.0 ** -24


def _bucket_edges(bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every bucket: its float32 exponent, its first r and the next bucket's first r."""
    index = np.arange(EXPONENTS << bits)
    exponent = index >> bits
    top = index & ((1 << bits) - 1)
    start = np.ldexp(1.0 + top / (1 << bits), exponent)
    return exponent, start, start + np.ldexp(1.0, exponent - bits)


def _score_single(d: np.ndarray) -> np.ndarray:
    return -np.log(d)


def _score_max(d: np.ndarray) -> np.ndarray:
    return -np.log(d) - np.log(2.0 - d)


@dataclass(frozen=True)
class Chords:
    table: np.ndarray
    """int64 [2, 2, CHORD_BUCKETS] (:attr:`watermark.keyscan.ScanTables.chord`)."""
    gap: tuple[float, float]
    """Per token, how far (nats) each form's bound may exceed the score."""


@functools.cache
def chords() -> Chords:
    """Chord tables of the single score -ln d and the Šidák maximum's -ln(d (2 - d)), both
    convex in r, with d the lower bound of :func:`_d_lower` (exact below 2^23, a grid step
    low above). A bucket's chord runs from its first r to the next bucket's."""
    exponent, start, stop = _bucket_edges(CHORD_BITS)
    # The last exponent holds r = 2^24 alone (d just below 1): a flat chord at its value.
    stop = np.where(exponent >= 24, start, stop)
    table = np.zeros((2, 2, CHORD_BUCKETS), dtype=np.int64)
    gaps = []
    points = np.linspace(0.0, 1.0, 257)
    for form, score in enumerate((_score_single, _score_max)):
        first = score(_d_lower(start, exponent))
        last = score(_d_lower(stop, exponent))
        table[form, 0] = np.ceil(first * ONE).astype(np.int64) + MARGIN
        table[form, 1] = np.maximum(0, np.floor((first - last) * ONE).astype(np.int64) - MARGIN)
        # Chord minus score on a grid of each bucket (the maximum of a convex function's gap
        # is smooth, so the grid is within a fraction of a percent of it), then the chord's
        # distance from the true score where d is not exact (r from 2^23 on: ln(r / (r - 1))).
        r = start[:, None] + (stop - start)[:, None] * points[None, :]
        chord = first[:, None] + (last - first)[:, None] * points[None, :]
        gap = np.max(chord - score(r * 2.0 ** -24), axis=1)
        gaps.append(float(np.max(gap)) * 1.05 + 2.0 ** -22 + 2 * (MARGIN + 2) / ONE)
    return Chords(table=table, gap=(gaps[0], gaps[1]))


@functools.cache
def thresholds() -> np.ndarray:
    """tau_1 > tau_2 > ... > tau_J (float64 [J]): from 1/2 in steps of STEP_SD standard
    deviations of an order statistic of DESIGN_TOKENS uniforms near tau, then by
    TAIL_RATIO, above the p-value floor."""
    out = []
    tau = 0.5
    while tau > 1.0 / DESIGN_TOKENS:
        out.append(tau)
        tau -= STEP_SD * math.sqrt(tau * (1.0 - tau) / DESIGN_TOKENS)
    while tau > 2.0 * P_FLOOR:
        out.append(tau)
        tau /= TAIL_RATIO
    if len(out) > LEVELS - 2:  # pragma: no cover - a constant change would show here
        raise ValueError("too many thresholds for the level histogram")
    return np.array(out)


def _sidak_p(t: np.ndarray, w: float) -> np.ndarray:
    """P(T <= t) for T = min(p_A / w, p_B / (1 - w)) of independent uniforms: a + b - ab."""
    a = np.minimum(1.0, w * t)
    b = np.minimum(1.0, (1.0 - w) * t)
    return a + b - a * b


PValueForm = str
"""``single``, ``max`` or ``sidak`` (the weighted Šidák scores at w = 1 - alpha)."""


def sidak_weight(alpha: float) -> float:
    """The weight w of key A in the weighted Šidák scores (:func:`detector.scoring.dual_scores`)."""
    return min(max(1.0 - alpha, 1e-3), 1.0 - 1e-3)


@functools.cache
def level_tables(form: PValueForm, alpha: float = 0.0) -> np.ndarray:
    """uint8 [2, LEVEL_BUCKETS]: per stream the level of each bucket, the number of
    thresholds at or above the smallest per-token p-value a token of the bucket can have
    (with RELATIVE_SLACK toward more). ``single``: p = d + 2^-23; ``max``: d (2 - d) +
    2^-23 at the smaller d of the two streams, so each stream's level (their maximum is
    the token's); ``sidak``: P(T <= min(d_A / w, d_B / (1 - w))) + 2^-23 at w =
    :func:`sidak_weight`, one bound per stream."""
    exponent, start, _ = _bucket_edges(LEVEL_BITS)
    d = np.where(exponent >= 24, (2.0 ** 24 - 1.0) * 2.0 ** -24, _d_lower(start, exponent))
    taus = thresholds()
    if form == "single":
        streams = [d, d]
    elif form == "max":
        streams = [d * (2.0 - d)] * 2
    elif form == "sidak":
        w = sidak_weight(alpha)
        streams = [_sidak_p(d / w, w), _sidak_p(d / (1.0 - w), w)]
    else:
        raise ValueError(f"unknown p-value form: {form!r}; expected one of ['single', 'max', 'sidak']")
    out = np.zeros((2, LEVEL_BUCKETS), dtype=np.uint8)
    for stream, p in enumerate(streams):
        low = (p + P_FLOOR) / (1.0 + RELATIVE_SLACK)
        # taus descend: the level is how many of them are >= low.
        out[stream] = np.searchsorted(-taus, -low, side="right")
    return out


@functools.cache
def _gof_rows() -> np.ndarray:
    taus = np.append(thresholds(), P_FLOOR)
    rows = np.zeros((3, LEVELS), dtype=np.int64)
    count = len(taus)
    rows[0, :count] = np.ceil(taus * ONE).astype(np.int64)
    rows[1, :count] = np.round(-np.log(taus) * ONE).astype(np.int64)
    rows[2, :count] = np.round(-np.log1p(-taus) * ONE).astype(np.int64)
    return rows


@functools.cache
def _xlnx(size: int) -> np.ndarray:
    k = np.arange(size + 1, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.where(k > 0, k * np.log(np.maximum(k, 1.0)), 0.0)
    return np.round(values * ONE).astype(np.int64)


def scan_tables(form: PValueForm, alpha: float = 0.0, longest: int = 0) -> keyscan.ScanTables:
    """The tables of :mod:`watermark.keyscan` for keys whose Tr-GoF reads ``form`` p-values,
    for texts of up to ``longest`` scored tokens (rounded up to a power of 2)."""
    if longest > keyscan.MAX_POSITIONS:
        raise ValueError(f"texts over {keyscan.MAX_POSITIONS} scored tokens cannot be screened")
    size = max(1024, 1 << max(0, longest).bit_length())
    return keyscan.ScanTables(chord=chords().table, levels=level_tables(form, float(alpha)), gof=_gof_rows(),
                              level_count=len(thresholds()), xlnx=_xlnx(size))


# --------------------------------------------------------------------------- bounds


def score_bounds(fixed: np.ndarray, n: int, gap: float) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) bounds [K] on the float score sums that ``fixed`` [K] (int64 chord
    sums) bound, for texts of n scored tokens."""
    upper = fixed.astype(np.float64) / ONE
    lower = upper - n * gap
    return lower * (1.0 - RELATIVE_SLACK) - RELATIVE_SLACK, upper * (1.0 + RELATIVE_SLACK) + RELATIVE_SLACK


def gof_upper(fixed: np.ndarray) -> np.ndarray:
    """Upper bounds [K] on the Tr-GoF statistic from ``gof`` [K]."""
    return fixed.astype(np.float64) / ONE * (1.0 + RELATIVE_SLACK)


def _first_boundary_log(s: float, n: int) -> float:
    """ln v with n K(1/n, v) >= s and v < 1/n, as close to the root as float allows (the
    boundary a_1(s) of :mod:`detector.trgof`, rounded down): Newton from the left of the
    convex decreasing f(x) = K(1/n, e^x) - s/n, then a check (bisection where it fails)."""
    u = 1.0 / n
    target = s / n

    def f(x: float) -> float:
        second = (1.0 - u) * (math.log1p(-u) - math.log1p(-math.exp(x))) if u < 1.0 else 0.0
        return u * (math.log(u) - x) + second - target

    top = math.log(u)
    x = top - (target + 1.0) / u  # f > 0 here (K >= u ln(u / v) - 1/e)
    for _ in range(100):
        v = math.exp(x)
        slope = -u + (1.0 - u) * v / (1.0 - v) if u < 1.0 else -u
        step = -f(x) / slope
        if not step > 0.0:
            break
        x = min(x + step, top)
        if step <= 1e-14 * (1.0 + abs(x)):
            break
    x -= 1e-12 * (1.0 + abs(x))
    if not f(x) >= 0.0:  # pragma: no cover - Newton from the left cannot pass the root
        lo, hi = top - (target + 1.0) / u, x
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if f(mid) >= 0.0 else (lo, mid)
        x = lo
    return x


def log10_trgof_lower(s: float, n: int) -> float:
    """log10 of a lower bound on Tr-GoF's null tail P(S >= s) for n tokens: the chance
    that the smallest of n uniforms lies at or below the first boundary a_1(s) (then S >=
    s). Lowered by a relative 1e-9 and 1e-12 for float error."""
    if n <= 0 or s <= 0.0:
        return 0.0
    x = _first_boundary_log(s, n)
    if x < -700.0:  # 1 - (1 - v)^n = n v (1 - O(n v))
        log_p = math.log(n) + x + math.log1p(-n * math.exp(max(x, -745.0)))
    else:
        log_p = math.log(-math.expm1(n * math.log1p(-math.exp(x))))
    return min(0.0, log_p - 1e-9 * abs(log_p) - 1e-12) / LN10


def trgof_statistic_at_most(log10_p: float, n: int) -> float:
    """The smallest s whose :func:`log10_trgof_lower` could be at most ``log10_p`` (a
    screen's necessary condition, loose by a relative 1e-6): the statistic whose first
    boundary v makes 1 - (1 - v)^n = 10^log10_p."""
    if n <= 0:
        return math.inf
    p = 10.0 ** min(0.0, log10_p + 1e-6 * (1.0 + abs(log10_p)))
    if p <= 0.0:
        log_v = log10_p * LN10 - math.log(n)
    else:
        log_v = math.log(-math.expm1(math.log1p(-p) / n)) if p < 1.0 else 0.0
    u = 1.0 / n
    if log_v >= math.log(u):
        return 0.0
    v = math.exp(log_v)
    second = (1.0 - u) * (math.log1p(-u) - math.log1p(-v)) if u < 1.0 else 0.0
    return max(0.0, n * (u * (math.log(u) - log_v) + second) * (1.0 - 1e-6) - 1e-6)


def log10_gamma_upper_chernoff(scores: np.ndarray, n: int) -> np.ndarray:
    """Upper bounds [K] on log10 P(Gamma(n, 1) >= s) for scores [K] (Chernoff: e^{-(s - n)}
    (s / n)^n for s > n, else 1): valid and O(1) a key, for the per-key entries of keys
    the screen leaves out."""
    s = np.asarray(scores, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_p = -(s - n) + n * np.log(np.maximum(s, 1e-300) / max(n, 1))
    return np.where((s > n) & (n > 0), np.minimum(0.0, log_p) / LN10, 0.0)


def log10_weighted_upper_chernoff(scores: np.ndarray, n: int, alpha: float) -> np.ndarray:
    """Upper bounds [K] on log10 P((1 - a) Gamma(n) + a Gamma(n) >= s): Chernoff,
    min over theta of E e^{theta S} e^{-theta s}, at the theta where the exponent's slope
    vanishes, found by bisection (the slope rises with theta; any theta in range gives a
    valid bound, this one the tightest)."""
    s = np.asarray(scores, dtype=np.float64)
    a, b = 1.0 - alpha, alpha
    top = 1.0 / max(a, b)
    live = (s > n * (a + b)) & (n > 0)
    lo, hi = np.zeros_like(s), np.full_like(s, top)
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        slope = n * a / (1.0 - a * mid) + n * b / (1.0 - b * mid) - s
        lo, hi = np.where(slope < 0.0, mid, lo), np.where(slope < 0.0, hi, mid)
    theta = lo  # the slope is negative here: the exponent is at most its value at 0 (= 0)
    log_p = -n * np.log1p(-a * theta) - n * np.log1p(-b * theta) - theta * s
    return np.where(live, np.minimum(0.0, log_p) / LN10, 0.0)
