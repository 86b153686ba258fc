"""Exact null distributions in log space, and multiple-testing corrections.

Every detection statistic here is a sum of per-token scores that are Exp(1) under the null
hypothesis (text independent of the key): single key, the per-token Šidák maximum and the
routing-aware score give S ~ Gamma(n, 1); the dual-key weighted statistic gives
(1 - a) * Gamma(n, 1) + a * Gamma(n, 1) with independent terms. p-values are returned as
natural or base-10 logarithms so that they never underflow (a 20,000-token watermarked
text has log10 p far below -308).

Gamma(n, 1) upper tail, integer n: Q(n, x) = P(Poisson(x) <= n - 1), a finite sum of
Poisson probabilities summed in log space: exact up to float rounding at any depth.

Weighted sum (Moschopoulos 1985, "The distribution of the sum of independent gamma random
variables", Ann. Inst. Statist. Math. 37): with t = min(a, 1 - a), T = max(a, 1 - a) and
r = t / T, S / t = Gamma(2n + K, 1) where K ~ NegativeBinomial(n, r) counts failures
(an Exp(rate r) is a Geometric(r) sum of Exp(1) draws). Hence

    P(S >= s) = sum_k NB(k; n, r) * Q(2n + k, s / t),

a sum of positive terms computed in log space; Q(2n + k + 1, x) follows from Q(2n + k, x)
by adding one Poisson probability. The terms are log-concave in k (the NB pmf is, the CDF of
the log-concave Poisson pmf is, and so is their product; An 1998, "Log-concave probability
distributions", Econ. Theory 80), so their ratios never increase: the terms below a start k1
sum to at most term(k1) / (rho - 1) with rho = term(k1 + 1) / term(k1) > 1, and those from K
on to at most term(K) / (1 - rho') with rho' = term(K) / term(K - 1) < 1. The series is summed
over a window around its peak, each of the three truncations (head, tail, and the Poisson
sum that starts Q at k1) checked below exp(-40) / 3 of the total, so that together they
stay below exp(-40) of it, as before.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from detector import stats_compiled

LN10 = math.log(10.0)
_TAIL_MARGIN = 40.0  # what a truncated series leaves out stays below exp(-40) of its sum
# Each of the weighted series' three truncations gets a third of that margin.
_SIDE_MARGIN = _TAIL_MARGIN + math.log(3.0)
# The slope of a log term below which a geometric bound is not trusted: a slope's float
# rounding is about eps times the log terms' size (1e-11 at 1e5, p ~ 1e-43,000), so at 1e-6
# it moves a bound by a factor 1 + 1e-5 at most, nothing against the e^-41 it is checked to.
_MIN_LOG_RATIO = 1e-6
_BELOW_ONE = float(np.nextafter(1.0, 0.0))
# Longest chunk of the weighted series: windows of millions of terms (alpha near 0, where the
# NB's mean n (1 - alpha) / alpha is huge) ran 3x slower in one piece (temporaries out of cache).
_MAX_CHUNK = 1 << 16


def _logsumexp(values: np.ndarray) -> float:
    top = float(np.max(values))
    if top == -math.inf:
        return -math.inf
    return top + math.log(float(np.sum(np.exp(values - top))))


def _poisson_log_pmf(ks: np.ndarray, x: float) -> np.ndarray:
    """log P(Poisson(x) = k) for integer ks (contiguous ascending), x > 0."""
    first = int(ks[0])
    log_fact = math.lgamma(first + 1) + np.concatenate(([0.0], np.cumsum(np.log(ks[1:].astype(np.float64)))))
    return ks * math.log(x) - x - log_fact


def log_gamma_sf(score: float, n: int) -> float:
    """ln P(Gamma(n, 1) >= score) for integer n >= 0 (ln 1 = 0 for n = 0 or score <= 0)."""
    if n < 0:
        raise ValueError("n must be >= 0")
    if n == 0 or score <= 0.0:
        return 0.0
    if not math.isfinite(score):
        return -math.inf
    fast = stats_compiled.compiled()
    if fast is not None:
        # The same terms and the same logsumexp: the terms less their maximum in one compiled
        # pass, numpy's exp and pairwise sum over them (three calls instead of about nine).
        shifted, top = fast["_gamma_terms_shifted"](float(score), int(n), math.log(score), _log_fact(n - 1))
        return min(0.0, top + math.log(float(np.add.reduce(np.exp(shifted)))))
    ks = np.arange(n, dtype=np.float64)
    # The terms rise until k ~ score: in the far tail only the top ones matter, but the
    # full sum is cheap and exact, and it also serves the body (where Q ~ 1). (The terms of
    # _poisson_log_pmf from k = 0, with ln k! from the cached table: the same values.)
    return min(0.0, _logsumexp(ks * math.log(score) - score - _log_fact(n - 1)))


def gamma_log10_sf(score: float, n: int) -> float:
    """log10 P(Gamma(n, 1) >= score)."""
    return log_gamma_sf(score, n) / LN10


def _poisson_starts(top: np.ndarray, x: np.ndarray) -> np.ndarray:
    """First index j0 [k] of the Poisson terms that P(Poisson(x) <= top) needs, for tops [k]
    and means x [k] > 0: about 12 sd of Poisson(x) below ``top``, or fewer where top < x and the
    terms fall geometrically below it ((margin + 10) / ln(x / top) steps). A guess: the caller
    checks the dropped terms with :func:`_dropped_below`."""
    top_f = top.astype(np.float64)
    spread = 12.0 * np.sqrt(x) + 32.0
    # (the floor on the log only matters where top >= x, where steps is not used)
    steps = np.ceil((_SIDE_MARGIN + 10.0) / np.log(np.maximum(x / np.maximum(top_f, 1.0), 1.0 + 1e-12))) + 2.0
    width = np.where((top_f > 0) & (top_f < x), np.minimum(steps, spread), top_f - x + spread)
    return np.maximum(0, top - np.maximum(0.0, width).astype(np.int64))


def _dropped_below(j0: np.ndarray, x: np.ndarray, log_first: np.ndarray) -> np.ndarray:
    """ln of a bound [k] on the Poisson terms below j0 [k] given ln p_j0 [k] (-inf where j0 = 0;
    +inf where no bound holds). Below j0 < x each term is at most j0 / x of the one above it
    (p_{j-1} / p_j = j / x), so they sum to at most p_j0 q / (1 - q), q = j0 / x."""
    q = j0 / x
    # The clips change no value that is used: q = 0 and q >= 1 are answered by the wheres.
    inside = np.clip(q, 1e-300, _BELOW_ONE)
    bound = np.where(q < 1.0, log_first + np.log(inside) - np.log1p(-inside), math.inf)
    return np.where(j0 == 0, -math.inf, bound)


def _log_poisson_cdf(top: int, x: float) -> float:
    """ln P(Poisson(x) <= top) = ln Q(top + 1, x) from the terms j0 .. top only, or from all of
    them where the terms below j0 are not provably below exp(-_SIDE_MARGIN) of the sum: the
    rules of :func:`_poisson_starts` and :func:`_dropped_below` for one row, in scalar
    arithmetic (numpy's per-call cost on one-element arrays was ~20 us of ~35)."""
    j0 = _cdf_start(top, x)
    logs = _poisson_log_pmf(np.arange(j0, top + 1, dtype=np.float64), x)
    total = _logsumexp(logs)
    q = j0 / x
    if j0 > 0 and not (q < 1.0 and float(logs[0]) + math.log(q) - math.log1p(-q) < total - _SIDE_MARGIN):
        total = _logsumexp(_poisson_log_pmf(np.arange(top + 1, dtype=np.float64), x))
    return min(0.0, total)


def _cdf_start(top: int, x: float) -> int:
    """:func:`_log_poisson_cdf`'s first term j0 (:func:`_poisson_starts`' rule for one row)."""
    spread = 12.0 * math.sqrt(x) + 32.0
    if 0 < top < x:
        width = min(math.ceil((_SIDE_MARGIN + 10.0) / math.log(max(x / top, 1.0 + 1e-12))) + 2.0, spread)
    else:
        width = top - x + spread
    return max(0, top - max(0, int(width)))


def _series_window(n: int, r: float, x: float) -> tuple[int, int]:
    """Where the terms NB(k; n, r) Q(2n + k, x) matter: (first k, number of terms), a guess.

    In the far tail (2n + k < x) Q(a + 1, x) / Q(a, x) is about x / a, so the terms peak where
    (n + k) / (k + 1) (1 - r) x / (2n + k) = 1 (a quadratic in k), with curvature about
    n / (k (n + k)) + 1 / (2n + k) of the log term; elsewhere Q is near 1 and the terms follow
    the NB law (mean n (1 - r) / r, sd sqrt(n (1 - r)) / r). The window starts 12 sd below the
    peak (a drop of about e^-72 for a Gaussian shape) and ends 12 sd above it, or further where
    the terms fall more slowly (a skewed NB, or Q near 1 past the peak): at the NB's rate
    -ln((n + k) / (k + 1) (1 - r)) from 6 sd above the peak on, up to 24 sd, and at least to
    12 NB sd above the NB mean. Only the cost depends on this
    guess: the series checks its own head and tail bounds, starts again from k = 0 when the
    head's fails and sums further when the tail's does (see :func:`_log_weighted_series`)."""
    b = 2.0 * n + 1.0 - (1.0 - r) * x
    c = 2.0 * n - (1.0 - r) * x * n
    disc = b * b - 4.0 * c
    peak = max(0.0, 0.5 * (-b + math.sqrt(disc))) if disc > 0.0 else 0.0
    nb_mean, nb_sd = n * (1.0 - r) / r, math.sqrt(n * (1.0 - r)) / r
    if 2.0 * n + peak < x:
        sd = 1.0 / math.sqrt(n / ((peak + 1.0) * (n + peak)) + 1.0 / (2.0 * n + peak))
    else:
        peak, sd = nb_mean, nb_sd
    start = max(0, int(peak - 12.0 * sd - 16.0))
    mid = peak + 6.0 * sd  # a Gaussian shape is down e^-18 there
    fall = -math.log((n + mid) / (mid + 1.0) * (1.0 - r))
    # The NB's slope alone overshoots where it is nearly flat (r tiny: the NB is then close to
    # Gaussian and 12 sd suffice), hence the cap at 24 sd.
    slow = min(mid + (_SIDE_MARGIN + 5.0) / fall, peak + 24.0 * sd) if fall > 0.0 else 0.0
    # Where Q is near 1/2 at the peak, Q's fall below it sets the start, but above it the
    # terms follow the NB (12 NB sd above its mean).
    end = max(peak + 12.0 * sd, slow, nb_mean + 12.0 * nb_sd) + 16.0
    return start, max(16, int(end) - start)


def _log_running_sums(log_start: float, log_terms: np.ndarray) -> np.ndarray:
    """ln of start, start + t_0, start + t_0 + t_1, ... [m + 1] for ln t [m], each at most 0
    (they are probabilities). In linear space scaled by the largest value, at half the cost of
    np.logaddexp.accumulate, where start is above e^-600 of it: then every partial sum is a
    normal float, and a term that underflows is below e^-145 of every partial sum (under the
    rounding); partial sums of positive terms round by about m eps relative, as logaddexp's.
    Otherwise by logaddexp."""
    top = max(log_start, float(log_terms.max())) if len(log_terms) else log_start
    if log_start - top > -600.0:
        scaled = np.exp(np.concatenate(([log_start], log_terms)) - top)
        return np.minimum(np.log(np.cumsum(scaled)) + top, 0.0)
    return np.minimum(np.logaddexp.accumulate(np.concatenate(([log_start], log_terms))), 0.0)


def _log_weighted_series(n: int, r: float, x: float, k1: int, chunk: int) -> float | None:
    """ln sum_{k} NB(k; n, r) Q(2n + k, x) summed from k = k1 in chunks (the first ``chunk``
    terms long), or None when k1 > 0 and the head below k1 is not provably negligible."""
    log_1mr = math.log1p(-r)
    if k1 == 0:
        log_w = n * math.log(r)  # NB(0; n, r)
        log_q = log_gamma_sf(x, 2 * n)  # Q(2n, x)
    else:
        log_w = math.lgamma(n + k1) - math.lgamma(n) - math.lgamma(k1 + 1) + n * math.log(r) + k1 * log_1mr
        log_q = _log_poisson_cdf(2 * n + k1 - 1, x)
    total = -math.inf
    head = -math.inf
    k0 = k1
    while True:
        chunk = min(chunk, _MAX_CHUNK)
        ks = np.arange(k0, k0 + chunk + 1, dtype=np.float64)
        # NB(k + 1) / NB(k) = (n + k) / (k + 1) * (1 - r).
        steps = np.log((n + ks[:-1]) / (ks[:-1] + 1.0)) + log_1mr
        log_ws = log_w + np.concatenate(([0.0], np.cumsum(steps)))
        # Q(a + 1, x) = Q(a, x) + Poisson(a; x) with a = 2n + k.
        pmf = _poisson_log_pmf(2 * n + ks[:-1], x)
        log_qs = _log_running_sums(log_q, pmf)
        terms = log_ws + log_qs  # terms k0 .. k0 + chunk; the last one is not summed yet
        total = float(np.logaddexp(total, _logsumexp(terms[:-1])))
        if k0 == k1 and k1 > 0:
            # Ratios never increase, so every ratio below k1 is >= term(k1 + 1) / term(k1).
            slope = float(terms[1] - terms[0])
            head = float(terms[0]) - math.log(math.expm1(slope)) if slope > _MIN_LOG_RATIO else math.inf
        log_w, log_q = float(log_ws[-1]), float(log_qs[-1])
        k0 += chunk
        # Two bounds on the terms from k0 on, either suffices: the ratios from k0 on are at
        # most term(k0) / term(k0 - 1) (log-concavity), and each Q <= 1 with NB ratios at
        # most the one at k0.
        slope = float(terms[-1] - terms[-2])
        tail = float(terms[-1]) - math.log(-math.expm1(slope)) if slope < -_MIN_LOG_RATIO else math.inf
        ratio = (n + k0) / (k0 + 1.0) * (1.0 - r)
        if ratio < 1.0:
            tail = min(tail, log_w - math.log1p(-ratio))
        if tail < total - _SIDE_MARGIN:
            return min(0.0, total) if head < total - _SIDE_MARGIN else None
        if slope < -_MIN_LOG_RATIO:
            # Falling already: by log-concavity term(k0 + m) <= term(k0) rho^m, so m terms
            # more bring the first bound below the margin (1.25 m + 16 against rounding).
            m = (tail - total + _SIDE_MARGIN) / -slope
            chunk = min(int(1.25 * m) + 16, max(chunk, k0 // 4))  # (a nearly flat slope overshoots)
        else:
            chunk = max(chunk, k0 // 4)


def _log_weighted_sf(score: float, n: int, alpha: float) -> float:
    if n == 0 or score <= 0.0:
        return 0.0
    small, large = min(alpha, 1.0 - alpha), max(alpha, 1.0 - alpha)
    if small == 0.0:
        return log_gamma_sf(score / large, n)
    if small == large:
        return log_gamma_sf(score / small, 2 * n)
    r = small / large
    x = score / small
    k1, chunk = _series_window(n, r, x)
    log_p = _log_weighted_series(n, r, x, k1, chunk)
    if log_p is None:  # the window's guess started too close to the peak: sum the whole head
        log_p = _log_weighted_series(n, r, x, 0, chunk + k1)
    return log_p


def weighted_gamma_log10_sf(score: float, n: int, alpha: float) -> float:
    """log10 P(S >= score) for S = (1 - alpha) * Gamma(n, 1) + alpha * Gamma(n, 1), independent.

    Exact (negative-binomial mixture of Gammas, see the module docstring) for any n >= 0
    and alpha in [0, 1], at any depth of the tail.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError("alpha must be in [0, 1]")
    if n < 0:
        raise ValueError("n must be >= 0")
    if not math.isfinite(score):
        return -math.inf if score > 0 else 0.0
    fast = stats_compiled.compiled()
    if fast is not None:
        return _log_weighted_sf_compiled(float(score), int(n), float(alpha), fast) / LN10
    return _log_weighted_sf(float(score), int(n), float(alpha)) / LN10


def _log_weighted_sf_compiled(score: float, n: int, alpha: float, fast) -> float:
    """:func:`_log_weighted_sf` with its series' terms compiled (detector.stats_compiled: the
    terms' ratios in linear space, a few logarithms a block instead of five a term). The window
    and every ln k! the series starts from are worked out here as the reference does
    (math.lgamma is CPython's own; numba's differs by ulps that grow with k). The reference runs
    where the window holds more than stats_compiled.MAX_TERMS terms or a second chunk is needed."""
    if n == 0 or score <= 0.0:
        return 0.0
    small, large = min(alpha, 1.0 - alpha), max(alpha, 1.0 - alpha)
    if small == 0.0 or small == large:
        return _log_weighted_sf(score, n, alpha)
    r = small / large
    x = score / small
    # The window and the Poisson sum's first term by the compiled copies of _series_window and
    # _cdf_start (the same numbers); only the ln k! of CPython's math.lgamma stay here.
    k1, chunk, j0 = fast["_weighted_window"](n, r, x)
    if chunk > stats_compiled.MAX_TERMS:
        return _log_weighted_sf(score, n, alpha)
    if k1 > 0:
        log_w = math.lgamma(n + k1) - math.lgamma(n) - math.lgamma(k1 + 1) + n * math.log(r) + k1 * math.log1p(-r)
        log_p, status = fast["_weighted_from"](n, r, x, k1, chunk, log_w, j0, math.lgamma(j0 + 1),
                                               math.lgamma(2 * n + k1 + 1))
        if status == 1:  # the window's guess started too close to the peak: sum the whole head
            log_p, status = fast["_log_weighted_series"](n, r, x, 0, chunk + k1, n * math.log(r),
                                                         fast["_log_gamma_sf"](x, 2 * n, _log_fact(2 * n)),
                                                         math.lgamma(2 * n + 1))
        return log_p if status == 0 else _log_weighted_sf(score, n, alpha)
    log_p, status = fast["_log_weighted_series"](n, r, x, 0, chunk, n * math.log(r),
                                                 fast["_log_gamma_sf"](x, 2 * n, _log_fact(2 * n)),
                                                 math.lgamma(2 * n + 1))
    if status == 0:
        return log_p
    return _log_weighted_sf(score, n, alpha)


def warm_up() -> None:
    """Compile the weighted tail's kernels now (service.warmup): a series from k = 0 (a short
    text's body) and one from a later start (the far tail), and the vectorised Gamma tail."""
    for score, n in ((1.0, 2), (250.0, 200), (60.0, 16)):
        weighted_gamma_log10_sf(score, n, 0.1)
    gamma_log10_sf_many(np.array([30.0, 5.0]), np.array([10, 10]))


def _log_fact(n_max: int) -> np.ndarray:
    """ln k! for k = 0 .. n_max (read-only): a prefix of one cached table, the same values as
    computing it for n_max alone (a cumulative sum is sequential, so its prefixes do not
    depend on its length); detection asks for it several times a text."""
    return _log_fact_table(1 << max(10, (n_max + 1).bit_length()))[:n_max + 1]


@functools.lru_cache(maxsize=None)
def _log_fact_table(size: int) -> np.ndarray:
    table = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, size, dtype=np.float64)))))
    table.setflags(write=False)
    return table


def gamma_log10_sf_many(scores: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """log10 P(Gamma(n, 1) >= score) [k] for scores [k] and integer ns [k]: the Poisson sum of
    :func:`log_gamma_sf` (the same term values), for many windows in one vectorised pass (rows
    in chunks of about 2^20 terms). A row sums only the terms from :func:`_poisson_starts` on
    (in the far tail a few dozen, not n) when those it drops are provably below
    exp(-_SIDE_MARGIN) of its sum (:func:`_dropped_below`); the other rows sum every term."""
    x = np.asarray(scores, dtype=np.float64)
    n = np.asarray(ns, dtype=np.int64)
    fast = stats_compiled.compiled()
    if fast is not None and x.ndim == 1 and n.shape == x.shape:
        return _gamma_log10_sf_many_compiled(np.ascontiguousarray(x), np.ascontiguousarray(n), fast)
    out = np.where(np.isinf(x) & (x > 0) & (n > 0), -math.inf, 0.0)
    live = np.flatnonzero((n > 0) & (x > 0.0) & np.isfinite(x))
    if not len(live):
        return out
    lf = _log_fact(int(n[live].max()))
    j0 = np.zeros(len(x), dtype=np.int64)
    j0[live] = _poisson_starts(n[live] - 1, x[live])
    log_sf, log_first = _poisson_sums(x, n, j0, live, lf)
    redo = live[_dropped_below(j0[live], x[live], log_first[live]) >= log_sf[live] - _SIDE_MARGIN]
    if len(redo):
        j0[redo] = 0
        log_sf[redo] = _poisson_sums(x, n, j0, redo, lf)[0][redo]
    out[live] = np.minimum(0.0, log_sf[live]) / LN10
    return out


def _gamma_log10_sf_many_compiled(x: np.ndarray, n: np.ndarray, fast) -> np.ndarray:
    """:func:`gamma_log10_sf_many` in three compiled steps (detector.stats_compiled) with every
    logarithm numpy's, taken in three numpy calls between them (ln of the start rule's ratios
    and of x; ln q and ln(1 - q) of the dropped-head check): the same rules, starts, terms and
    sums as the numpy steps with the compiled row sums, so the same values (tested)."""
    out, live, args, n_max = fast["_many_prepare"](x, n)
    if not len(live):
        return out
    lf = _log_fact(int(n_max))
    j0, log_x, log_sf, log_first, inside, negated = fast["_many_sums"](x, n, live, np.log(args), lf)
    return fast["_many_finish"](x, n, live, j0, log_x, lf, log_sf, log_first, np.log(inside), np.log1p(negated), out)


def _poisson_sums(x: np.ndarray, n: np.ndarray, j0: np.ndarray, rows: np.ndarray,
                  lf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ln sum_{j = j0}^{n - 1} P(Poisson(x) = j) and ln P(Poisson(x) = j0), on ``rows`` of the
    arrays [k] (others left 0), in blocks of about 2^20 terms of equal-ish width."""
    log_sf = np.zeros(len(x))
    log_first = np.zeros(len(x))
    fast = stats_compiled.compiled()
    if fast is not None:  # row by row in one compiled pass; ln x stays numpy's
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        log_x = np.zeros(len(x))
        log_x[rows] = np.log(x[rows])
        fast["_poisson_rows"](x, log_x, n, j0, rows, lf, log_sf, log_first)
        return log_sf, log_first
    widths = n - j0
    rows = rows[np.argsort(widths[rows], kind="stable")]
    start = 0
    while start < len(rows):
        stop = start + 1
        while stop < len(rows) and (stop - start + 1) * int(widths[rows[stop]]) <= 1 << 20:
            stop += 1
        block = rows[start:stop]
        ks = j0[block][:, None] + np.arange(int(widths[block].max()))[None, :]
        inside = ks < n[block][:, None]
        ks = np.where(inside, ks, 0)
        xr = x[block][:, None]
        terms = ks.astype(np.float64) * np.log(xr) - xr - lf[ks]
        terms[~inside] = -math.inf
        top = terms.max(axis=1)
        log_sf[block] = top + np.log(np.exp(terms - top[:, None]).sum(axis=1))
        log_first[block] = terms[:, 0]
        start = stop
    return log_sf, log_first


def gamma_log10_sf_lower(scores: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """Lower bounds [k] on log10 P(Gamma(n, 1) >= score), for scores [k] and integer ns [k].

    Q(n, x) = P(Poisson(x) <= n - 1) >= P(Poisson(x) = n - 1): one term of the sum. It is
    within a factor of about sqrt(2 pi n) of the exact tail where the tail is small, which
    makes it a cheap screen: a window whose lower bound misses a threshold cannot pass it.
    (An upper bound such as Chernoff's cannot screen: it would drop windows that pass.)"""
    x = np.asarray(scores, dtype=np.float64)
    n = np.asarray(ns, dtype=np.int64)
    out = np.zeros(x.shape)
    live = (n > 0) & (x > 0.0)
    if live.any():
        lf = _log_fact(int(n[live].max()))
        k = n[live] - 1
        out[live] = np.minimum(0.0, k * np.log(x[live]) - x[live] - lf[k]) / LN10
    return out


def weighted_gamma_log10_sf_lower(scores: np.ndarray, ns: np.ndarray, alpha: float) -> np.ndarray:
    """Lower bounds [k] on log10 P((1 - alpha) A + alpha B >= score), A, B iid Gamma(n, 1).

    With t = min(alpha, 1 - alpha), T = max(...): the event {B' >= n - 1} has probability
    >= 1/2 (the median of Gamma(n, 1) exceeds n - 1/3; Chen & Rubin 1986), and on it the
    sum exceeds T A' + t (n - 1), so P >= 1/2 * P(A' >= (score - t (n - 1)) / T), bounded
    below by :func:`gamma_log10_sf_lower`."""
    small, large = min(alpha, 1.0 - alpha), max(alpha, 1.0 - alpha)
    x = np.asarray(scores, dtype=np.float64)
    n = np.asarray(ns, dtype=np.int64)
    rest = (x - small * np.maximum(n - 1, 0)) / large
    return np.where(rest > 0.0, gamma_log10_sf_lower(np.maximum(rest, 0.0), n) - math.log10(2.0), -math.log10(2.0))


def log_sidak(log_p: float, m: int) -> float:
    """ln of 1 - (1 - p)^m: the probability that the smallest of m independent null
    p-values is <= p (the global p of a search over m keys)."""
    if m <= 1 or log_p == 0.0:
        return log_p
    if log_p < -20.0:
        # 1 - (1 - p)^m = m p (1 - (m - 1) p / 2 + ...); p < 2e-9 makes the rest negligible.
        p = math.exp(log_p)
        return math.log(m) + log_p + math.log1p(-(m - 1) * p / 2.0)
    p = math.exp(log_p)
    return math.log(-math.expm1(m * math.log1p(-p)))


def holm_adjusted(log_ps: list[float]) -> list[float]:
    """Holm step-down adjusted p-values (ln), in the input order."""
    m = len(log_ps)
    order = sorted(range(m), key=lambda i: log_ps[i])
    adjusted = [0.0] * m
    running = -math.inf
    for rank, index in enumerate(order):
        value = min(0.0, math.log(m - rank) + log_ps[index])
        running = max(running, value)
        adjusted[index] = running
    return adjusted
