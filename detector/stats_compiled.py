"""The exact Gamma and weighted-Gamma tails of :mod:`detector.stats`, compiled (numba): the
same sums, windows, chunks and truncation checks as the numpy reference beside them
(:func:`detector.stats._log_weighted_sf`, :func:`detector.stats.log_gamma_sf`), written as
scalar loops.

Why compiled: a 200-token dual-key detection asks for the weighted tail several times (the
whole text's weighted sum, and each span window that its screen lets through), and the
reference spends ~100 us a call in ~40 small numpy calls (their fixed cost, not the
arithmetic: a window is a few hundred terms); compiled, one call is a few microseconds.

Same arithmetic, not the same rounding: a log-sum-exp here adds its terms in order where
numpy sums pairwise, and numba's ``exp``/``log``/``lgamma`` are the C library's, so a value
may differ from the reference in its last few bits (tests/detector/test_stats_compiled.py
holds them to 1e-13 relative over a grid from the body to the far tail). Which terms are
summed, and every bound that decides it, is the reference's.

numba is loaded by the caller's process (watermark.jit), never by importing this module:
:func:`compiled` returns None until it has been (then the numpy reference runs)."""

from __future__ import annotations

import functools
import math

import numpy as np

from watermark import jit

_TAIL_MARGIN = 40.0
_SIDE_MARGIN = _TAIL_MARGIN + math.log(3.0)
_MIN_LOG_RATIO = 1e-6
_MAX_CHUNK = 1 << 16
_NEG_INF = -math.inf


def _lse(values, start, stop):  # pragma: no cover - compiled
    """ln sum exp(values[start:stop]) (-inf for none or all -inf)."""
    top = _NEG_INF
    for i in range(start, stop):
        if values[i] > top:
            top = values[i]
    if top == _NEG_INF:
        return _NEG_INF
    total = 0.0
    for i in range(start, stop):
        total += math.exp(values[i] - top)
    return top + math.log(total)


def _logaddexp(a, b):  # pragma: no cover - compiled
    """np.logaddexp for two floats."""
    if a == _NEG_INF:
        return b
    if b == _NEG_INF:
        return a
    top = max(a, b)
    return top + math.log1p(math.exp(-abs(a - b)))


def _log_gamma_sf(score, n, log_fact):  # pragma: no cover - compiled
    """stats.log_gamma_sf: ln P(Gamma(n, 1) >= score) by its n Poisson terms; ``log_fact``
    holds ln k! for k < n at least."""
    if n == 0 or score <= 0.0:
        return 0.0
    if not math.isfinite(score):
        return _NEG_INF
    log_score = math.log(score)
    terms = np.empty(n)
    for k in range(n):
        terms[k] = k * log_score - score - log_fact[k]
    return min(0.0, _lse(terms, 0, n))


def _poisson_log_pmf_into(first, log_fact_first, count, x, out):  # pragma: no cover - compiled
    """out[:count] = ln P(Poisson(x) = k) for k = first .. first + count - 1 (stats._poisson_log_pmf:
    ln k! as ln first! (``log_fact_first``, the caller's math.lgamma(first + 1)) plus a running
    sum of logs)."""
    log_x = math.log(x)
    running = 0.0
    for i in range(count):
        k = first + i
        if i:
            running += math.log(float(k))
        out[i] = k * log_x - x - (log_fact_first + running)


def _log_poisson_cdf(top, x, j0, log_fact_j0):  # pragma: no cover - compiled
    """stats._log_poisson_cdf: ln P(Poisson(x) <= top) from the terms j0 .. top (``j0`` and
    ln j0! from the caller: :func:`cdf_start`), or from all of them where the terms below j0
    are not provably negligible."""
    count = top + 1 - j0
    logs = np.empty(top + 1)
    _poisson_log_pmf_into(float(j0), log_fact_j0, count, x, logs)
    total = _lse(logs, 0, count)
    q = j0 / x
    if j0 > 0 and not (q < 1.0 and logs[0] + math.log(q) - math.log1p(-q) < total - _SIDE_MARGIN):
        _poisson_log_pmf_into(0.0, 0.0, top + 1, x, logs)
        total = _lse(logs, 0, top + 1)
    return min(0.0, total)


def _log_weighted_series(n, r, x, k1, chunk, log_w, j0, log_fact_j0, log_fact_pmf, log_fact):  # pragma: no cover
    """stats._log_weighted_series over its first chunk: (ln of the sum, status), status 0 where
    the first chunk's bounds end the series, 1 where the reference returns None (the head below
    k1 not provably negligible), 2 where it would sum a further chunk (the caller then runs the
    reference: the ln k! each chunk starts from is CPython's math.lgamma, which only the caller
    has). ``log_w`` is ln NB(k1; n, r) and ``log_fact_pmf`` ln (2n + k1)!, both the caller's;
    ``j0`` and ``log_fact_j0`` are :func:`cdf_start`'s for Q(2n + k1, x) (unused at k1 = 0)."""
    log_1mr = math.log1p(-r)
    if k1 == 0:
        log_q = _log_gamma_sf(x, 2 * n, log_fact)
    else:
        log_q = _log_poisson_cdf(2 * n + k1 - 1, x, j0, log_fact_j0)
    chunk = min(chunk, _MAX_CHUNK)
    log_ws = np.empty(chunk + 1)
    pmf = np.empty(chunk + 1)
    log_qs = np.empty(chunk + 1)
    terms = np.empty(chunk + 1)
    # NB(k + 1) / NB(k) = (n + k) / (k + 1) * (1 - r), a running sum of the log steps.
    log_ws[0] = log_w + 0.0
    running = 0.0
    for i in range(chunk):
        k = float(k1 + i)
        running += math.log((n + k) / (k + 1.0)) + log_1mr
        log_ws[i + 1] = log_w + running
    # Q(a + 1, x) = Q(a, x) + Poisson(a; x), a = 2n + k (stats._log_running_sums).
    _poisson_log_pmf_into(float(2 * n + k1), log_fact_pmf, chunk, x, pmf)
    top = log_q
    for i in range(chunk):
        if pmf[i] > top:
            top = pmf[i]
    if log_q - top > -600.0:
        acc = math.exp(log_q - top)
        log_qs[0] = min(math.log(acc) + top, 0.0)
        for i in range(chunk):
            acc += math.exp(pmf[i] - top)
            log_qs[i + 1] = min(math.log(acc) + top, 0.0)
    else:
        acc = log_q
        log_qs[0] = min(acc, 0.0)
        for i in range(chunk):
            acc = _logaddexp(acc, pmf[i])
            log_qs[i + 1] = min(acc, 0.0)
    for i in range(chunk + 1):
        terms[i] = log_ws[i] + log_qs[i]
    total = _lse(terms, 0, chunk)
    head = _NEG_INF
    if k1 > 0:
        slope = terms[1] - terms[0]
        head = terms[0] - math.log(math.expm1(slope)) if slope > _MIN_LOG_RATIO else math.inf
    k0 = k1 + chunk
    slope = terms[chunk] - terms[chunk - 1]
    tail = terms[chunk] - math.log(-math.expm1(slope)) if slope < -_MIN_LOG_RATIO else math.inf
    ratio = (n + k0) / (k0 + 1.0) * (1.0 - r)
    if ratio < 1.0:
        tail = min(tail, log_ws[chunk] - math.log1p(-ratio))
    if tail < total - _SIDE_MARGIN:
        return (min(0.0, total), 0) if head < total - _SIDE_MARGIN else (0.0, 1)
    return 0.0, 2


_FUNCTIONS = {"_lse": _lse, "_logaddexp": _logaddexp, "_log_gamma_sf": _log_gamma_sf,
              "_poisson_log_pmf_into": _poisson_log_pmf_into, "_log_poisson_cdf": _log_poisson_cdf,
              "_log_weighted_series": _log_weighted_series}


@functools.cache
def _compile():
    return jit.compile_all(dict(_FUNCTIONS))


def compiled():
    """The compiled functions (name -> function), or None where this process has not loaded
    numba (watermark.jit.loaded: a one-off detection stays on numpy) or has none."""
    if not jit.loaded():
        return None
    return _compile()
