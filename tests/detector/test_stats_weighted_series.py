"""The weighted statistic's windowed series against the series it replaced (summed from k = 0
in chunks of at least 4,096 terms until the NB tail alone bounds the rest), against closed
forms and 40-digit sums, and the truncation bounds it relies on; and the vectorised Gamma tail,
whose rows now sum only the Poisson terms that matter, against the full sum and mpmath."""

import math

import mpmath
import numpy as np
import pytest

from detector import stats

LN10 = math.log(10.0)
N_GRID = (1, 2, 3, 5, 17, 64, 100, 256, 1000, 2000, 5000)
ALPHA_GRID = (0.05, 0.1, 0.3, 0.45, 0.499, 0.4999999, 0.5000001, 0.51, 0.7, 0.9, 0.95)


def _previous_log_weighted_sf(score: float, n: int, alpha: float) -> float:
    """stats._log_weighted_sf before the window (main at 03013f3), kept verbatim as the reference."""
    if n == 0 or score <= 0.0:
        return 0.0
    small, large = min(alpha, 1.0 - alpha), max(alpha, 1.0 - alpha)
    if small == 0.0:
        return stats.log_gamma_sf(score / large, n)
    if small == large:
        return stats.log_gamma_sf(score / small, 2 * n)
    r = small / large
    x = score / small
    log_1mr = math.log1p(-r)
    log_w = n * math.log(r)
    log_q = stats.log_gamma_sf(x, 2 * n)
    total = -math.inf
    k0 = 0
    while True:
        chunk = max(4096, k0 // 4)
        ks = np.arange(k0, k0 + chunk + 1, dtype=np.float64)
        steps = np.log((n + ks[:-1]) / (ks[:-1] + 1.0)) + log_1mr
        log_ws = log_w + np.concatenate(([0.0], np.cumsum(steps)))
        pmf = stats._poisson_log_pmf(2 * n + ks[:-1], x)
        log_qs = np.minimum(np.logaddexp.accumulate(np.concatenate(([log_q], pmf))), 0.0)
        total = float(np.logaddexp(total, stats._logsumexp(log_ws[:-1] + log_qs[:-1])))
        log_w, log_q = float(log_ws[-1]), float(log_qs[-1])
        k0 += chunk
        ratio = (n + k0) / (k0 + 1.0) * (1.0 - r)
        if ratio < 1.0 and log_w - math.log1p(-ratio) < total - 40.0:
            return min(0.0, total)


def _scores(n: int, alpha: float) -> list[float]:
    """From below the null mean n to the far tail: standard scores -3 .. 300 and n (1 + d)."""
    sd = math.sqrt(n * ((1.0 - alpha) ** 2 + alpha ** 2))
    body = [n + z * sd for z in (-3, -1, 0, 1, 2, 5, 10, 30, 100, 300)]
    return [s for s in body + [n * 1.5, n * 3.0, n * 5.0 + 700.0] if s > 0.0]


@pytest.mark.parametrize("n", N_GRID)
def test_windowed_series_matches_the_previous_series(n):
    worst, deepest = 0.0, 0.0
    for alpha in ALPHA_GRID:
        for score in _scores(n, alpha):
            expected = _previous_log_weighted_sf(score, n, alpha) / LN10
            got = stats.weighted_gamma_log10_sf(score, n, alpha)
            assert abs(got - expected) <= 1e-9 + 1e-12 * abs(expected), (n, alpha, score, got, expected)
            worst = max(worst, abs(got - expected))
            deepest = min(deepest, expected)
    if n >= 17:
        assert deepest < -300  # the grid reaches the far tail at every length but the tiny ones


@pytest.mark.parametrize("n", N_GRID)
def test_window_guess_needs_no_restart(n):
    # Not a correctness property (a failed head check restarts from k = 0, exactly): the
    # window's start is where the speed comes from, so a guess that misses should be seen.
    for alpha in ALPHA_GRID + (0.01, 0.99):
        small, large = min(alpha, 1.0 - alpha), max(alpha, 1.0 - alpha)
        r = small / large
        for score in _scores(n, alpha):
            x = score / small
            k1, chunk = stats._series_window(n, r, x)
            assert stats._log_weighted_series(n, r, x, k1, chunk) is not None, (n, alpha, score, k1)


def test_restart_from_zero_when_the_head_is_not_negligible(monkeypatch):
    n, alpha = 300, 0.1
    score = 2.0 * n
    r = alpha / (1.0 - alpha)
    x = score / alpha
    k1, chunk = stats._series_window(n, r, x)
    peak_past = k1 + chunk  # past the peak: the terms fall from the start, the head bound fails
    assert stats._log_weighted_series(n, r, x, peak_past, 16) is None
    monkeypatch.setattr(stats, "_series_window", lambda n_, r_, x_: (peak_past, 16))
    expected = _previous_log_weighted_sf(score, n, alpha) / LN10
    assert stats.weighted_gamma_log10_sf(score, n, alpha) == pytest.approx(expected, rel=1e-12, abs=1e-9)


@pytest.mark.parametrize("alpha", [1e-4, 1e-3, 0.01, 0.05, 0.3, 0.4999, 0.99])
@mpmath.workdps(60)  # the precision is set per test, never for the whole session
def test_n1_closed_form_to_the_far_tail(alpha):
    # n = 1: P(b X + a Y >= s) = (b e^{-s/b} - a e^{-s/a}) / (b - a), b = 1 - a (a < b).
    a, b = min(alpha, 1 - alpha), max(alpha, 1 - alpha)
    for log10_target in (-0.1, -1, -10, -100, -300, -600, -2000):
        s = -log10_target * LN10 * b
        ma, mb, ms = mpmath.mpf(a), mpmath.mpf(b), mpmath.mpf(s)
        expected = float(mpmath.log10((mb * mpmath.exp(-ms / mb) - ma * mpmath.exp(-ms / ma)) / (mb - ma)))
        # The series works with x = s / a: its terms carry a few eps * x of rounding in ln,
        # 5e-8 in log10 for a = 1e-4 at p = 1e-2000 (x = 4.6e7; the previous series: 1.6e-6).
        allowance = 1e-9 + 2e-15 * s / a
        assert stats.weighted_gamma_log10_sf(s, 1, alpha) == pytest.approx(expected, rel=1e-12, abs=allowance)


@mpmath.workdps(40)
def _mp_series_log10(score, n, alpha):
    """The NB mixture at 40 digits, summed until the NB tail (each Q <= 1) is below 1e-25 of it."""
    small, large = min(alpha, 1 - alpha), max(alpha, 1 - alpha)
    r = mpmath.mpf(small) / large
    x = mpmath.mpf(score) / small
    q = mpmath.gammainc(2 * n, x, mpmath.inf, regularized=True)
    pmf = mpmath.exp(-x + 2 * n * mpmath.log(x) - mpmath.loggamma(2 * n + 1))  # Poisson(2n; x)
    weight, total, k = r ** n, mpmath.mpf(0), 0
    while True:
        total += weight * q
        ratio = (n + k + 1) / mpmath.mpf(k + 2) * (1 - r)
        if k > n * (1 - r) / r and ratio < 1 and weight / (1 - ratio) < total * mpmath.mpf(10) ** -25:
            return float(mpmath.log10(total))
        q += pmf
        pmf *= x / (2 * n + k + 1)
        weight *= (n + k) / mpmath.mpf(k + 1) * (1 - r)
        k += 1


@pytest.mark.parametrize("n,alpha,score", [
    (20, 0.01, 30.0), (100, 0.01, 300.0), (200, 0.02, 250.0), (64, 0.3, 400.0), (1000, 0.2, 1900.0),
])
def test_small_alpha_matches_a_40_digit_series(n, alpha, score):
    # Small alpha: the NB mean n (1 - r) / r is large, so the previous series summed ~10^5
    # terms and carried ~1e-8 of rounding; the window's closed-form start carries less.
    expected = _mp_series_log10(score, n, alpha)
    assert stats.weighted_gamma_log10_sf(score, n, alpha) == pytest.approx(expected, rel=1e-12, abs=1e-9)


@pytest.mark.parametrize("x", [0.5, 3.0, 40.0, 777.7, 12_345.0, 250_000.0])
@mpmath.workdps(40)
def test_truncated_poisson_cdf_matches_mpmath(x):
    for top in sorted({0, 1, 2, 7, int(x / 3), int(x / 1.2), int(x) - 1, int(x), int(x) + 3,
                       int(x + 3 * math.sqrt(x)), int(2 * x) + 5}):
        if top < 0:
            continue
        expected = float(mpmath.log(mpmath.gammainc(top + 1, x, mpmath.inf, regularized=True)))
        # Terms of size x carry eps * x of rounding in ln (the full sum from 0 carries more:
        # 8e-9 at x = 250,000 against 5e-10 here).
        got = stats._log_poisson_cdf(top, x)
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-12 + 1e-14 * x), (x, top)


@pytest.mark.parametrize("n,alpha,score", [(3, 0.1, 40.0), (10, 0.3, 12.0), (25, 0.05, 60.0), (40, 0.45, 90.0)])
@mpmath.workdps(40)
def test_series_terms_are_log_concave(n, alpha, score):
    # The head and tail bounds rest on term(k + 1) / term(k) never increasing (NB and Poisson
    # CDF both log-concave); checked at 40 digits on the terms themselves.
    small, large = min(alpha, 1 - alpha), max(alpha, 1 - alpha)
    r = mpmath.mpf(small) / large
    x = mpmath.mpf(score) / small
    terms = []
    for k in range(0, 400):
        weight = mpmath.binomial(n + k - 1, k) * r ** n * (1 - r) ** k
        terms.append(weight * mpmath.gammainc(2 * n + k, x, mpmath.inf, regularized=True))
    ratios = [terms[k + 1] / terms[k] for k in range(len(terms) - 1)]
    assert all(ratios[k + 1] <= ratios[k] * (1 + mpmath.mpf(10) ** -30) for k in range(len(ratios) - 1))


def _windows_far_and_near(rng):
    ns = np.concatenate(([1, 2, 3, 32, 5000], rng.integers(1, 5001, 300)))
    # from below the mean to 4x it (log10 p to about -2,600 at n = 5,000)
    scores = ns * np.concatenate(([0.5, 3.0, 1.0, 2.0, 2.5], rng.uniform(0.2, 4.0, 300)))
    return scores, ns


def test_vectorised_gamma_tail_keeps_the_full_sums_values():
    # The rows now start at _poisson_starts; the terms they keep are the full sum's, so only
    # the dropped terms (provably < e^-41 of the sum) and the order of summation differ.
    scores, ns = _windows_far_and_near(np.random.default_rng(11))
    many = stats.gamma_log10_sf_many(scores, ns)
    one = np.array([stats.gamma_log10_sf(float(s), int(n)) for s, n in zip(scores, ns)])
    assert np.all(np.abs(many - one) <= 1e-12 * np.maximum(1.0, np.abs(one)))
    assert one.min() < -2000
    starts = stats._poisson_starts(ns - 1, scores)
    assert np.mean(starts > 0) > 0.5  # most rows are truncated, or this tests nothing


@pytest.mark.parametrize("n,score", [(1000, 1000.0), (1000, 2500.0), (5000, 9000.0), (5000, 20_000.0), (64, 300.0)])
@mpmath.workdps(40)
def test_vectorised_gamma_tail_matches_mpmath(n, score):
    expected = float(mpmath.log10(mpmath.gammainc(n, score, mpmath.inf, regularized=True)))
    got = stats.gamma_log10_sf_many(np.array([score]), np.array([n]))[0]
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)  # test_stats' tolerance for the scalar sum


def test_vectorised_gamma_tail_sums_every_term_when_a_start_is_not_safe(monkeypatch):
    scores, ns = _windows_far_and_near(np.random.default_rng(12))
    expected = stats.gamma_log10_sf_many(scores, ns)
    # Starts at the top term: the dropped terms are then not negligible wherever more than one
    # term matters, and those rows must be summed from 0 again.
    monkeypatch.setattr(stats, "_poisson_starts", lambda top, x: np.maximum(top, 0))
    got = stats.gamma_log10_sf_many(scores, ns)
    assert np.all(np.abs(got - expected) <= 1e-12 * np.maximum(1.0, np.abs(expected)))


@pytest.mark.parametrize("n,alpha,score", [(1, 0.1, 3.0), (64, 0.1, 124.0), (64, 0.45, 200.0), (1000, 0.1, 2191.0),
                                           (1000, 0.3, 1000.0), (5000, 0.1, 10_982.5)])
def test_a_short_first_chunk_is_continued_to_the_same_sum(n, alpha, score):
    # The window's end is a guess too: from a 16-term first chunk the series must continue
    # (sized by the falling terms' ratio, or by a quarter of k while they still rise).
    small, large = min(alpha, 1.0 - alpha), max(alpha, 1.0 - alpha)
    r, x = small / large, score / small
    k1, _ = stats._series_window(n, r, x)
    got = stats._log_weighted_series(n, r, x, k1, 16)
    expected = _previous_log_weighted_sf(score, n, alpha)
    assert got is not None and got == pytest.approx(expected, rel=1e-12, abs=1e-9 * LN10)


@pytest.mark.parametrize("start", [0.0, -3.0, -400.0, -700.0, -5000.0])
def test_running_sums_match_logaddexp(start):
    rng = np.random.default_rng(7)
    for shape in ("rising", "falling", "peaked"):
        k = np.arange(3000, dtype=np.float64)
        logs = {"rising": -20.0 + 0.01 * k, "falling": -0.5 - 0.3 * k,
                "peaked": -1.0 - 1e-4 * (k - 1500.0) ** 2}[shape] + rng.normal(0.0, 0.1, len(k))
        logs = np.minimum(logs, -0.01) - 5.0
        expected = np.minimum(np.logaddexp.accumulate(np.concatenate(([start], logs))), 0.0)
        got = stats._log_running_sums(start, logs)
        assert np.all(np.abs(got - expected) <= 1e-12 * np.maximum(1.0, np.abs(expected))), (start, shape)
