"""Null distributions against high-precision values (mpmath), deep into the tail."""

import math

import mpmath
import numpy as np
import pytest

from detector import stats

mpmath.mp.dps = 60


def _mp_gamma_log10_sf(score, n):
    return float(mpmath.log10(mpmath.gammainc(n, score, mpmath.inf, regularized=True)))


@pytest.mark.parametrize("n,score", [
    (1, 0.5), (1, 700.0), (1, 2000.0), (3, 1.0), (10, 40.0), (200, 150.0), (200, 1200.0),
    (1000, 1000.0), (5000, 9000.0), (10_000, 30_000.0), (20_000, 21_000.0),
])
def test_gamma_sf_matches_mpmath(n, score):
    expected = _mp_gamma_log10_sf(score, n)
    got = stats.gamma_log10_sf(score, n)
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_gamma_sf_far_below_double_range():
    value = stats.gamma_log10_sf(50_000.0, 10_000)
    assert value < -308 * 10 and math.isfinite(value)
    assert value == pytest.approx(_mp_gamma_log10_sf(50_000.0, 10_000), rel=1e-9)


def test_gamma_sf_edges():
    assert stats.log_gamma_sf(5.0, 0) == 0.0
    assert stats.log_gamma_sf(0.0, 10) == 0.0
    assert stats.log_gamma_sf(-1.0, 10) == 0.0
    assert stats.log_gamma_sf(math.inf, 10) == -math.inf


def _mp_weighted_log10_sf(score, n, alpha):
    """Independent route: P(S >= s) = E_Y[ Q(n, (s - a Y) / b) ] by quadrature over Y ~ Gamma(n)."""
    a, b = mpmath.mpf(alpha), 1 - mpmath.mpf(alpha)
    s = mpmath.mpf(score)
    cut = s / a

    def integrand(y):
        tail = mpmath.gammainc(n, (s - a * y) / b, mpmath.inf, regularized=True)
        return mpmath.exp(-y + (n - 1) * mpmath.log(y) - mpmath.loggamma(n)) * tail

    inside = mpmath.quad(integrand, mpmath.linspace(0, cut, 40))
    beyond = mpmath.gammainc(n, cut, mpmath.inf, regularized=True)
    return float(mpmath.log10(inside + beyond))


@pytest.mark.parametrize("n,score,alpha", [
    (1, 2.0, 0.1), (1, 30.0, 0.3), (4, 10.0, 0.1), (20, 60.0, 0.25), (50, 160.0, 0.1),
    (100, 95.0, 0.1), (100, 300.0, 0.4),
])
def test_weighted_matches_quadrature(n, score, alpha):
    expected = _mp_weighted_log10_sf(score, n, alpha)
    assert stats.weighted_gamma_log10_sf(score, n, alpha) == pytest.approx(expected, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.3])
def test_weighted_n1_closed_form_deep_tail(alpha):
    # n = 1: P(bX + aY >= s) = (b e^{-s/b} - a e^{-s/a}) / (b - a) with b = 1 - alpha.
    b = 1 - alpha
    for log10_target in (-10, -100, -300, -600):
        s = -log10_target * math.log(10) * b
        expected = (mpmath.log(b * mpmath.exp(-s / b) - alpha * mpmath.exp(-s / alpha)) - mpmath.log(b - alpha))
        got = stats.weighted_gamma_log10_sf(s, 1, alpha)
        assert got == pytest.approx(float(expected / mpmath.log(10)), rel=1e-3)


def _mp_mixture_log10(score, n, alpha):
    """The negative-binomial mixture summed at 60 digits (recurrences for NB weights and
    for Q(2n + k, x)) until the remaining NB mass is below 1e-30 of the total."""
    small, large = min(alpha, 1 - alpha), max(alpha, 1 - alpha)
    r = mpmath.mpf(small) / large
    x = mpmath.mpf(score) / small
    a = 2 * n
    q = mpmath.gammainc(a, x, mpmath.inf, regularized=True)
    pmf = mpmath.exp(-x + a * mpmath.log(x) - mpmath.loggamma(a + 1))  # Poisson(a; x)
    weight = r ** n
    total, k, mass = mpmath.mpf(0), 0, mpmath.mpf(0)
    while True:
        total += weight * q
        mass += weight
        if k > n * (1 - r) / r and 1 - mass < total * mpmath.mpf(10) ** -30:
            break
        q += pmf
        pmf *= x / (a + k + 1)
        weight *= (n + k) / mpmath.mpf(k + 1) * (1 - r)
        k += 1
    return float(mpmath.log10(total))


@pytest.mark.parametrize("n,alpha,depth", [
    (1, 0.1, 5.0), (10, 0.1, 2.2), (10, 0.2, 4.0), (100, 0.1, 1.6), (300, 0.1, 2.0), (1000, 0.1, 1.3),
    pytest.param(10_000, 0.1, 1.05, marks=pytest.mark.slow),
])
def test_weighted_matches_high_precision_series(n, alpha, depth):
    score = depth * n  # the null mean is n; depth n reaches far into the tail for large n
    expected = _mp_mixture_log10(score, n, alpha)
    got = stats.weighted_gamma_log10_sf(score, n, alpha)
    assert got == pytest.approx(expected, rel=1e-3)


def test_weighted_reaches_below_1e300_and_beyond():
    for n in (1, 10, 100, 1000, 10_000):
        value = stats.weighted_gamma_log10_sf(4.0 * n + 700.0, n, 0.1)
        assert value < -300 and math.isfinite(value)


def test_weighted_special_alphas():
    assert stats.weighted_gamma_log10_sf(30.0, 10, 0.0) == pytest.approx(stats.gamma_log10_sf(30.0, 10))
    assert stats.weighted_gamma_log10_sf(30.0, 10, 1.0) == pytest.approx(stats.gamma_log10_sf(30.0, 10))
    assert stats.weighted_gamma_log10_sf(15.0, 10, 0.5) == pytest.approx(stats.gamma_log10_sf(30.0, 20))
    with pytest.raises(ValueError):
        stats.weighted_gamma_log10_sf(1.0, 1, 1.5)


def test_sidak_and_holm():
    log_p = math.log(1e-3)
    assert math.exp(stats.log_sidak(log_p, 5)) == pytest.approx(1 - (1 - 1e-3) ** 5)
    assert stats.log_sidak(-1000.0, 10) == pytest.approx(math.log(10) - 1000.0)
    adjusted = [math.exp(v) for v in stats.holm_adjusted([math.log(p) for p in (0.01, 0.04, 0.03, 0.5)])]
    assert adjusted == pytest.approx([0.04, 0.09, 0.09, 0.5])


@pytest.mark.parametrize("n", [1, 2, 5, 32, 200, 1000])
def test_gamma_lower_bound_is_below_the_exact_tail(n):
    import numpy as np

    scores = np.concatenate((np.linspace(0.01, 3 * n + 60, 97), [n - 1.0, float(n), n + 1.0]))
    lower = stats.gamma_log10_sf_lower(scores, np.full(len(scores), n))
    exact = np.array([stats.gamma_log10_sf(float(s), n) for s in scores])
    assert np.all(lower <= exact + 1e-12)
    # and tight enough to screen: within log10 sqrt(2 pi n) + 1 of the tail where it is small
    deep = exact < -6
    assert np.all(exact[deep] - lower[deep] <= math.log10(math.sqrt(2 * math.pi * n)) + 1.0)


@pytest.mark.parametrize("alpha", [0.1, 0.3, 0.5, 0.9])
@pytest.mark.parametrize("n", [1, 4, 32, 300])
def test_weighted_lower_bound_is_below_the_exact_tail(n, alpha):
    import numpy as np

    scores = np.linspace(0.01, 2.5 * n + 50, 61)
    lower = stats.weighted_gamma_log10_sf_lower(scores, np.full(len(scores), n), alpha)
    exact = np.array([stats.weighted_gamma_log10_sf(float(s), n, alpha) for s in scores])
    assert np.all(lower <= exact + 1e-12)


def test_vectorised_gamma_tail_matches_the_scalar_one():
    rng = np.random.default_rng(4)
    ns = np.concatenate(([0, 1, 2, 5], rng.integers(1, 3000, 200)))
    scores = np.concatenate(([1.0, 0.0, 3.0, 40.0], rng.uniform(0.0, 3.0, 200) * ns[4:]))
    scores[5] = np.inf
    many = stats.gamma_log10_sf_many(scores, ns)
    for s, n, m in zip(scores, ns, many):
        one = stats.gamma_log10_sf(float(s), int(n))
        assert (one == m) or abs(one - m) <= 1e-12 * max(1.0, abs(one)), (s, n, one, m)
