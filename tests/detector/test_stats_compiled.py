"""The compiled weighted-Gamma tail (detector.stats_compiled) against a 34-digit sum of the
same series and against the numpy reference (detector.stats._log_weighted_sf) over a grid
from the body to the far tail, and the dispatch: the compiled path only where numba is loaded."""

import math

import mpmath
import numpy as np
import pytest

from detector import stats, stats_compiled
from watermark import jit

numba = pytest.importorskip("numba")

N_GRID = (1, 2, 3, 5, 17, 64, 100, 200, 256, 1000, 2000)
ALPHA_GRID = (0.0, 1e-3, 0.01, 0.05, 0.1, 0.3, 0.45, 0.499, 0.5, 0.5000001, 0.51, 0.7, 0.9, 0.95, 1.0)


def _scores(n: int, alpha: float) -> list[float]:
    sd = math.sqrt(n * ((1.0 - alpha) ** 2 + alpha ** 2))
    body = [n + z * sd for z in (-3, -1, 0, 0.5, 1, 2, 5, 10, 30, 100, 300)]
    return [s for s in body + [n * 1.5, n * 3.0, n * 5.0 + 700.0, n * 20.0] if s > 0.0]


def _fast():
    jit.load()
    fast = stats_compiled.compiled()
    assert fast is not None
    return fast


@pytest.mark.parametrize("n", N_GRID)
def test_compiled_weighted_tail_matches_the_reference(n):
    fast = _fast()
    for alpha in ALPHA_GRID:
        for score in _scores(n, alpha):
            expected = stats._log_weighted_sf(score, n, alpha)
            got = stats._log_weighted_sf_compiled(score, n, alpha, fast)
            # The same terms; the reference's own float error grows with its window (to ~1e-11).
            assert abs(got - expected) <= 1e-10 * max(1.0, abs(expected)), (n, alpha, score, got, expected)


def test_compiled_weighted_tail_on_random_arguments():
    fast = _fast()
    rng = np.random.default_rng(3)
    for _ in range(500):
        n, alpha = int(rng.integers(1, 400)), float(rng.uniform(0.0, 1.0))
        score = float(rng.uniform(0.0, 4.0 * n))
        expected = stats._log_weighted_sf(score, n, alpha)
        got = stats._log_weighted_sf_compiled(score, n, alpha, fast)
        assert abs(got - expected) <= 1e-10 * max(1.0, abs(expected)), (n, alpha, score)


def _series_34_digits(score: float, n: int, alpha: float) -> float:
    """ln of the series summed in 34-digit arithmetic over the reference's window and 400 terms
    either side (Q from its Poisson sum, then the same recurrences)."""
    with mpmath.workdps(34):
        small, large = min(alpha, 1.0 - alpha), max(alpha, 1.0 - alpha)
        r, x = mpmath.mpf(small) / mpmath.mpf(large), mpmath.mpf(score) / mpmath.mpf(small)
        k1, chunk = stats._series_window(n, small / large, score / small)
        k0 = max(0, k1 - 400)
        p, q = mpmath.exp(-x), mpmath.mpf(0)
        for j in range(2 * n + k0):
            q += p
            p = p * x / (j + 1)
        w = mpmath.exp(mpmath.loggamma(n + k0) - mpmath.loggamma(n) - mpmath.loggamma(k0 + 1)
                       + n * mpmath.log(r) + k0 * mpmath.log(1 - r))
        total = mpmath.mpf(0)
        for k in range(k0, k1 + chunk + 400):
            total += w * q
            q += p
            p = p * x / (2 * n + k + 1)
            w = w * (n + k) / (k + 1) * (1 - r)
        return float(mpmath.log(total))


@pytest.mark.parametrize("score,n,alpha", [(200.0, 200, 0.9), (241.5, 256, 0.9), (186.5, 200, 0.95),
                                           (194.0, 227, 0.27), (250.0, 200, 0.1), (300.0, 200, 0.1),
                                           (120.0, 64, 0.1), (60.0, 32, 0.3)])
def test_compiled_weighted_tail_is_as_close_to_34_digits_as_the_reference(score, n, alpha):
    fast = _fast()
    truth = _series_34_digits(score, n, alpha)
    got = stats._log_weighted_sf_compiled(score, n, alpha, fast)
    reference = stats._log_weighted_sf(score, n, alpha)
    assert abs(got - truth) <= 5e-12 * max(1.0, abs(truth)), (got, truth)
    assert abs(got - truth) <= max(abs(reference - truth), 1e-12 * max(1.0, abs(truth)))


def test_public_function_uses_the_compiled_series_once_numba_is_loaded(monkeypatch):
    _fast()
    calls = []
    real = stats._log_weighted_sf_compiled
    monkeypatch.setattr(stats, "_log_weighted_sf_compiled", lambda *a: calls.append(a) or real(*a))
    value = stats.weighted_gamma_log10_sf(250.0, 200, 0.1)
    assert calls and value == pytest.approx(stats._log_weighted_sf(250.0, 200, 0.1) / stats.LN10, rel=1e-11)


def test_compiled_gamma_sf_many_is_the_numpy_steps():
    # gamma_log10_sf_many where numba is loaded: the start rule, the row sums and the dropped-
    # head check in compiled steps, numpy's logs between them: the same values as the numpy
    # steps with the compiled row sums (the path it replaces).
    pytest.importorskip("numba")
    from watermark import jit

    jit.load()
    fast = stats_compiled.compiled()
    rng = np.random.default_rng(15)
    for size in (1, 5, 40, 300):
        n = rng.integers(0, 400, size)
        x = n * rng.uniform(0.2, 4.0, size)
        x[: size // 5] = rng.choice([0.0, -1.0, np.inf, 1e-300], size // 5)
        reference = _many_reference(x, n)
        assert np.array_equal(stats._gamma_log10_sf_many_compiled(x, n.astype(np.int64), fast), reference)
        assert np.array_equal(stats.gamma_log10_sf_many(x, n), reference)


def _many_reference(x, n):
    """gamma_log10_sf_many's numpy steps (the compiled row sums, as before the fused path)."""
    out = np.where(np.isinf(x) & (x > 0) & (n > 0), -math.inf, 0.0)
    live = np.flatnonzero((n > 0) & (x > 0.0) & np.isfinite(x))
    if not len(live):
        return out
    lf = stats._log_fact(int(n[live].max()))
    j0 = np.zeros(len(x), dtype=np.int64)
    j0[live] = stats._poisson_starts(n[live] - 1, x[live])
    log_sf, log_first = stats._poisson_sums(x, n, j0, live, lf)
    redo = live[stats._dropped_below(j0[live], x[live], log_first[live]) >= log_sf[live] - stats._SIDE_MARGIN]
    if len(redo):
        j0[redo] = 0
        log_sf[redo] = stats._poisson_sums(x, n, j0, redo, lf)[0][redo]
    out[live] = np.minimum(0.0, log_sf[live]) / stats.LN10
    return out


def test_compiled_gamma_sf_is_the_numpy_steps(monkeypatch):
    # log_gamma_sf where numba is loaded: its terms less their maximum compiled, numpy's exp and
    # sum: bit for bit the numpy steps.
    jit.load()
    assert stats_compiled.compiled() is not None
    rng = np.random.default_rng(16)
    cases = [(float(x), int(n)) for n in (1, 2, 7, 32, 200, 1000, 5000)
             for x in (0.5, n * 0.8, n * 1.0, n * 1.7, n * 4.0 + 30.0) + tuple(rng.uniform(0.1, 5.0 * n, 5))]
    compiled = [stats.log_gamma_sf(x, n) for x, n in cases]
    monkeypatch.setattr(stats_compiled, "compiled", lambda: None)
    assert compiled == [stats.log_gamma_sf(x, n) for x, n in cases]


def test_compiled_series_window_and_cdf_start_are_the_python_ones():
    # The weighted tail's window and its Poisson sum's first term, compiled: the same integers
    # as stats._series_window and stats._cdf_start (libm's log and sqrt in both).
    jit.load()
    fast = stats_compiled.compiled()
    rng = np.random.default_rng(17)
    for _ in range(20000):
        n = int(rng.integers(1, 3000))
        alpha = float(rng.uniform(0.001, 0.499))
        r = alpha / (1.0 - alpha)
        x = float(n * rng.uniform(0.1, 30.0)) / alpha
        k1, chunk = stats._series_window(n, r, x)
        j0 = stats._cdf_start(2 * n + k1 - 1, x) if k1 > 0 else 0
        assert tuple(fast["_weighted_window"](n, r, x)) == (k1, chunk, j0)
        top = int(rng.integers(0, 5000))
        assert fast["_cdf_start"](top, x / n) == stats._cdf_start(top, x / n)
