"""The weighted-Gamma tail of :mod:`detector.stats`, compiled (numba): the same series
(Moschopoulos' negative-binomial mixture of Gamma tails), the same window, the same bounds
on what it leaves out (:func:`detector.stats._log_weighted_sf` is the reference), but its
terms built from their ratios in linear space, NB(k + 1) / NB(k) = (n + k) / (k + 1) (1 - r),
P(a + 1; x) / P(a; x) = x / (a + 1), Q(a + 1) = Q(a) + P(a), with exact logarithms once a block
of :data:`_BLOCK` terms, where the reference takes five logs and exps a term.

Why: a 200-token dual-key detection asks for the weighted tail several times (the whole
text's weighted sum under each form, and each span window its screen lets through), ~2,000
terms each; the reference spent 70-100 us a call (numpy's per-call cost and a transcendental
a term), compiled it is ~10 us.

Accuracy: the reference's own float error grows with the window (its running sums of logs
reach 1e5 and round at 1e-11); against a 34-digit sum of the same series the compiled terms
are as close or closer (tests/detector/test_stats_compiled.py), and the two agree to 1e-10 of
max(1, |ln p|) everywhere, to ~1e-13 on windows of a few hundred terms.

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


MAX_TERMS = 8192
"""Longest window summed compiled (200 tokens at alpha 0.1: 1,700 to 3,500 terms); longer ones
(alpha near 0 or 1, thousands of tokens) run the reference, whose float error there is of the
same order as the difference between the two (see the module docstring)."""

_BLOCK = 32
"""Terms per block of :func:`_log_weighted_series`: ratios multiply in linear space within a
block, and each block starts again from exact logarithms (a ratio of at most ~1e6 a term
keeps 32 products inside the float range; the float error of a product grows by one rounding
a term, reset every block)."""


def _log_weighted_series(n, r, x, k1, chunk, log_w, log_q, log_fact_pmf):  # pragma: no cover - compiled
    """stats._log_weighted_series over its first chunk: (ln of the sum, status), status 0 where
    the first chunk's bounds end the series, 1 where the reference returns None (the head below
    k1 not provably negligible), 2 where it would sum a further chunk, or a float left its range
    (the caller then runs the reference). ``log_w`` is ln NB(k1; n, r), ``log_q`` ln Q(2n + k1, x)
    and ``log_fact_pmf`` ln (2n + k1)!, the caller's (CPython's math.lgamma).

    The same terms NB(k) Q(2n + k, x), k = k1 .. k1 + chunk, and the same bounds on the rest,
    but computed as the terms' ratios in linear space (NB(k + 1) / NB(k) = (n + k) / (k + 1)
    (1 - r), P(a + 1) / P(a) = x / (a + 1), Q(a + 1) = Q(a) + P(a)) rather than a log and an exp
    per term: a few exact logarithms a block of :data:`_BLOCK` terms."""
    one_minus_r = 1.0 - r
    log_x = math.log(x)
    a0 = 2 * n + k1
    base_w, m_w = log_w, 1.0  # NB(k1 + j) = m_w e^base_w
    base_p, m_p = a0 * log_x - x - log_fact_pmf, 1.0  # P(a0 + j; x) = m_p e^base_p
    log_q0 = min(log_q, 0.0)
    scale_q = max(log_q0, base_p)  # Q(a0 + j) = acc e^scale_q, at most 1
    acc = math.exp(log_q0 - scale_q)
    cap = math.exp(-scale_q)
    total = _NEG_INF
    log_t0 = base_w + log_q0
    log_t1 = _NEG_INF
    log_tl = _NEG_INF  # terms chunk - 1 and chunk (the tail's slope), ln NB at chunk
    log_tm = _NEG_INF
    log_w_last = _NEG_INF
    j = 0
    while j <= chunk:
        if m_w != 1.0:
            base_w += math.log(m_w)
            m_w = 1.0
        if m_p != 1.0:
            base_p += math.log(m_p)
            m_p = 1.0
        if base_p > scale_q + 200.0:  # keep acc in range as P rises
            acc *= math.exp(scale_q - base_p)
            scale_q = base_p
            cap = math.exp(-scale_q)
        step_p = math.exp(base_p - scale_q)
        stop = min(j + _BLOCK, chunk + 1)
        block = 0.0
        while j < stop:
            q = acc if acc < cap else cap
            t = m_w * q
            if j < chunk:
                block += t
            if j == 1 or j >= chunk - 1:
                log_t = base_w + math.log(m_w) + scale_q + math.log(q)
                if j == 1:
                    log_t1 = log_t
                if j == chunk - 1:
                    log_tm = log_t
                if j == chunk:
                    log_tl = log_t
                    log_w_last = base_w + math.log(m_w)
            k = k1 + j
            acc += m_p * step_p
            m_w *= (n + k) / (k + 1.0) * one_minus_r
            m_p *= x / (a0 + j + 1.0)
            j += 1
        if block > 0.0:
            total = _logaddexp(total, base_w + scale_q + math.log(block))
        if not (math.isfinite(acc) and math.isfinite(m_w) and math.isfinite(m_p) and m_w > 0.0):
            return 0.0, 2
    if chunk < 2 or not math.isfinite(total):
        return 0.0, 2
    head = _NEG_INF
    if k1 > 0:
        slope = log_t1 - log_t0
        head = log_t0 - math.log(math.expm1(slope)) if slope > _MIN_LOG_RATIO else math.inf
    k0 = k1 + chunk
    slope = log_tl - log_tm
    tail = log_tl - math.log(-math.expm1(slope)) if slope < -_MIN_LOG_RATIO else math.inf
    ratio = (n + k0) / (k0 + 1.0) * (1.0 - r)
    if ratio < 1.0:
        tail = min(tail, log_w_last - math.log1p(-ratio))
    if tail < total - _SIDE_MARGIN:
        return (min(0.0, total), 0) if head < total - _SIDE_MARGIN else (0.0, 1)
    return 0.0, 2


def _poisson_rows(x, log_x, n, j0, rows, log_fact, log_sf, log_first):  # pragma: no cover - compiled
    """stats._poisson_sums on ``rows``: log_sf[r] = ln sum_{j = j0[r]}^{n[r] - 1} P(Poisson(x[r]) = j)
    and log_first[r] = ln P(Poisson(x[r]) = j0[r]), each term j ln x - x - ln j! as there
    (``log_x`` is numpy's ln x; the sum runs in order where numpy's is pairwise)."""
    for index in range(rows.shape[0]):
        r = rows[index]
        first = j0[r]
        stop = n[r]
        top = _NEG_INF
        for j in range(first, stop):
            term = j * log_x[r] - x[r] - log_fact[j]
            if term > top:
                top = term
        total = 0.0
        for j in range(first, stop):
            total += math.exp(j * log_x[r] - x[r] - log_fact[j] - top)
        log_sf[r] = top + math.log(total)
        log_first[r] = first * log_x[r] - x[r] - log_fact[first]


_BELOW_ONE = float(np.nextafter(1.0, 0.0))
_LN10 = math.log(10.0)


def _many_prepare(x, n):  # pragma: no cover - compiled
    """stats.gamma_log10_sf_many, first step: the answer for rows that need no sum (0, or -inf
    for an infinite score) [k], the live rows (n > 0, finite x > 0) [L], the arguments of
    numpy's log for them [2L] (:func:`stats._poisson_starts`' max(x / max(top, 1), 1 + 1e-12),
    then x itself) and the largest live n."""
    k = x.shape[0]
    out = np.zeros(k)
    live = np.empty(k, dtype=np.int64)
    found = 0
    n_max = 0
    for r in range(k):
        if math.isinf(x[r]) and x[r] > 0 and n[r] > 0:
            out[r] = _NEG_INF
        if n[r] > 0 and x[r] > 0.0 and math.isfinite(x[r]):
            live[found] = r
            found += 1
            n_max = max(n_max, n[r])
    args = np.empty(2 * found)
    for j in range(found):
        r = live[j]
        args[j] = max(x[r] / max(float(n[r] - 1), 1.0), 1.0 + 1e-12)
        args[found + j] = x[r]
    return out, live[:found], args, n_max


def _many_sums(x, n, live, logs, log_fact):  # pragma: no cover - compiled
    """Second step: each live row's first term j0 (stats._poisson_starts, from numpy's logs),
    its Poisson sum and first term (:func:`_poisson_rows`, numpy's ln x), and the clipped
    ratio q = j0 / x of stats._dropped_below with its negation (numpy's log and log1p take
    them next). Returns (j0 [k], ln x [k], log_sf [k], log_first [k], inside [L], -inside [L])."""
    k = x.shape[0]
    found = live.shape[0]
    j0 = np.zeros(k, dtype=np.int64)
    log_x = np.zeros(k)
    for j in range(found):
        r = live[j]
        top = n[r] - 1
        top_f = float(top)
        spread = 12.0 * math.sqrt(x[r]) + 32.0
        steps = math.ceil((_SIDE_MARGIN + 10.0) / logs[j]) + 2.0
        if top_f > 0 and top_f < x[r]:
            width = min(steps, spread)
        else:
            width = top_f - x[r] + spread
        j0[r] = max(0, top - np.int64(max(0.0, width)))
        log_x[r] = logs[found + j]
    log_sf = np.zeros(k)
    log_first = np.zeros(k)
    _poisson_rows(x, log_x, n, j0, live, log_fact, log_sf, log_first)
    inside = np.empty(found)
    negated = np.empty(found)
    for j in range(found):
        r = live[j]
        q = j0[r] / x[r]
        inside[j] = min(max(q, 1e-300), _BELOW_ONE)
        negated[j] = -inside[j]
    return j0, log_x, log_sf, log_first, inside, negated


def _many_finish(x, n, live, j0, log_x, log_fact, log_sf, log_first, log_inside, log1p_negated,
                 out):  # pragma: no cover - compiled
    """Last step: rows whose dropped head is not provably below exp(-_SIDE_MARGIN) of their sum
    (stats._dropped_below, from numpy's logs) summed again from j = 0; out[live] = min(0,
    log_sf) / ln 10."""
    found = live.shape[0]
    redo = np.empty(found, dtype=np.int64)
    count = 0
    for j in range(found):
        r = live[j]
        q = j0[r] / x[r]
        if j0[r] == 0:
            bound = _NEG_INF
        elif q < 1.0:
            bound = log_first[r] + log_inside[j] - log1p_negated[j]
        else:
            bound = math.inf
        if bound >= log_sf[r] - _SIDE_MARGIN:
            redo[count] = r
            count += 1
    if count:
        for j in range(count):
            j0[redo[j]] = 0
        again = np.zeros(x.shape[0])
        first = np.zeros(x.shape[0])
        _poisson_rows(x, log_x, n, j0, redo[:count], log_fact, again, first)
        for j in range(count):
            log_sf[redo[j]] = again[redo[j]]
    for j in range(found):
        r = live[j]
        out[r] = min(0.0, log_sf[r]) / _LN10
    return out


def _gamma_terms_shifted(score, n, log_score, log_fact):  # pragma: no cover - compiled
    """stats.log_gamma_sf's Poisson terms k ln(score) - score - ln k! [n] (k = 0 .. n - 1, with
    CPython's ln(score)) less their maximum, and that maximum: the logsumexp's steps before
    its exp (numpy's, taken by the caller)."""
    terms = np.empty(n)
    top = _NEG_INF
    for k in range(n):
        terms[k] = float(k) * log_score - score - log_fact[k]
        if terms[k] > top:
            top = terms[k]
    for k in range(n):
        terms[k] = terms[k] - top
    return terms, top


def _series_window(n, r, x):  # pragma: no cover - compiled
    """stats._series_window, the same float steps (its logs and square roots are libm's, as
    CPython's math module calls them: the same numbers, tested)."""
    b = 2.0 * n + 1.0 - (1.0 - r) * x
    c = 2.0 * n - (1.0 - r) * x * n
    disc = b * b - 4.0 * c
    peak = max(0.0, 0.5 * (-b + math.sqrt(disc))) if disc > 0.0 else 0.0
    nb_mean = n * (1.0 - r) / r
    nb_sd = math.sqrt(n * (1.0 - r)) / r
    if 2.0 * n + peak < x:
        sd = 1.0 / math.sqrt(n / ((peak + 1.0) * (n + peak)) + 1.0 / (2.0 * n + peak))
    else:
        peak = nb_mean
        sd = nb_sd
    start = max(0, int(peak - 12.0 * sd - 16.0))
    mid = peak + 6.0 * sd
    fall = -math.log((n + mid) / (mid + 1.0) * (1.0 - r))
    slow = min(mid + (_SIDE_MARGIN + 5.0) / fall, peak + 24.0 * sd) if fall > 0.0 else 0.0
    end = max(max(peak + 12.0 * sd, slow), nb_mean + 12.0 * nb_sd) + 16.0
    return start, max(16, int(end) - start)


def _cdf_start(top, x):  # pragma: no cover - compiled
    """stats._cdf_start, the same float steps."""
    spread = 12.0 * math.sqrt(x) + 32.0
    if 0 < top and top < x:
        width = min(math.ceil((_SIDE_MARGIN + 10.0) / math.log(max(x / top, 1.0 + 1e-12))) + 2.0, spread)
    else:
        width = top - x + spread
    return max(0, top - max(0, int(width)))


def _weighted_window(n, r, x):  # pragma: no cover - compiled
    """(k1, chunk, j0): the weighted series' window (:func:`_series_window`) and, where it
    starts past 0, the first Poisson term of ln Q(2n + k1, x) (:func:`_cdf_start`)."""
    k1, chunk = _series_window(n, r, x)
    j0 = _cdf_start(2 * n + k1 - 1, x) if k1 > 0 else 0
    return k1, chunk, j0


def _weighted_from(n, r, x, k1, chunk, log_w, j0, log_fact_j0, log_fact_pmf):  # pragma: no cover - compiled
    """:func:`_log_poisson_cdf` then :func:`_log_weighted_series` from k1 > 0, in one call."""
    log_q = _log_poisson_cdf(2 * n + k1 - 1, x, j0, log_fact_j0)
    return _log_weighted_series(n, r, x, k1, chunk, log_w, log_q, log_fact_pmf)


_FUNCTIONS = {"_series_window": _series_window, "_cdf_start": _cdf_start, "_weighted_window": _weighted_window,
              "_weighted_from": _weighted_from, "_gamma_terms_shifted": _gamma_terms_shifted,
              "_many_prepare": _many_prepare, "_many_sums": _many_sums, "_many_finish": _many_finish,
              "_lse": _lse, "_logaddexp": _logaddexp, "_log_gamma_sf": _log_gamma_sf,
              "_poisson_log_pmf_into": _poisson_log_pmf_into, "_log_poisson_cdf": _log_poisson_cdf,
              "_log_weighted_series": _log_weighted_series, "_poisson_rows": _poisson_rows}


@functools.cache
def _compile():
    return jit.compile_all(dict(_FUNCTIONS))


def compiled():
    """The compiled functions (name -> function), or None where this process has not loaded
    numba (watermark.jit.loaded: a one-off detection stays on numpy) or has none."""
    if not jit.loaded():
        return None
    return _compile()
