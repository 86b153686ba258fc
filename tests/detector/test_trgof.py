"""Tr-GoF: the exact null against Monte Carlo, the conservative tail, and the default
combination's validity and power under edits."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from detector import trgof, trgof_compiled
from detector.detect import DetectorConfig, detect
from detector.result import Candidate
from tests.detector.test_detect import generate
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec


IMPLEMENTATIONS = ["numpy", pytest.param("compiled", marks=pytest.mark.skipif(
    not trgof_compiled.available(), reason="numba is not installed"))]


@pytest.fixture(params=IMPLEMENTATIONS)
def implementation(request, monkeypatch) -> str:
    """Runs a test with the exact tail's loop in numpy (the reference) and compiled."""
    if request.param == "numpy":
        monkeypatch.setattr(trgof_compiled, "crossing", lambda: None)
    return request.param


@pytest.mark.statistical
@pytest.mark.parametrize("n", [1, 2, 7, 40, 200])
def test_exact_null_matches_monte_carlo(n, implementation):
    rng = np.random.default_rng(n)
    trials = 40_000
    sims = np.array([trgof.statistic(rng.random(n)) for _ in range(trials)])
    for q in (0.5, 0.9, 0.99, 0.999):
        s = float(np.quantile(sims, q))
        if s <= 0.0:
            continue
        empirical = float(np.mean(sims >= s))
        exact = math.exp(trgof.log_sf(s, n))
        sigma = math.sqrt(exact * (1 - exact) / trials)
        assert abs(empirical - exact) <= 4.5 * sigma + 1e-4, (n, q, empirical, exact)


@pytest.mark.parametrize("n", [3, 50, 400, 1000])
def test_tail_is_monotone_and_below_the_union_bound(n, implementation):
    previous = 1.0
    for s in np.linspace(0.5, 60.0, 40):
        log_p = trgof.log_sf(float(s), n)
        assert log_p <= math.log(trgof.order_count(n)) - s + 1e-12  # the union (Chernoff) bound
        assert log_p <= math.log(previous) + 1e-12
        previous = math.exp(log_p)
    # Down to 1e-12 and beyond, never 0: log space.
    assert trgof.log10_sf(500.0, n) < -12 and math.isfinite(trgof.log10_sf(500.0, n))


def test_boundaries_round_up():
    n, s = 300, 20.0
    log_a = trgof.log_boundaries(s, n)
    u = np.arange(1, trgof.order_count(n) + 1) / n
    assert np.all(n * trgof._kl(u, np.exp(log_a)) <= s + 1e-9)
    assert np.all(n * trgof._kl(u, np.exp(log_a) * (1 - 1e-9)) >= s - 1e-6)


def _crossing_80_bit(log_a: np.ndarray, n: int) -> float:
    """The same Poissonised recursion in x87 extended precision, rescaled every step."""
    ld = np.longdouble
    a = np.exp(np.maximum.accumulate(log_a.astype(ld)))
    log_fact = np.concatenate(([ld(0)], np.cumsum(np.log(np.arange(1, n + 2, dtype=ld)))))
    h, log_scale, previous, r = np.ones(1, dtype=ld), ld(0), ld(0), np.arange(48, dtype=ld)
    for i in range(1, len(a) + 1):
        lam, previous = ld(n) * (a[i - 1] - previous), a[i - 1]
        if lam > 0:
            width = min(i, 48)
            h = np.convolve(h, np.exp(r[:width] * np.log(lam) - log_fact[:width]))[:i]
        elif len(h) < i:
            h = np.concatenate((h, np.zeros(1, dtype=ld)))
        top = h.max()
        h, log_scale = h / top, log_scale + np.log(top)
    m = np.arange(len(h))
    terms = np.log(h) + (ld(n) - m) * np.log(ld(n) * (1 - a[-1])) - log_fact[n - m]
    top = terms.max()
    log_keep = log_fact[n] - ld(n) * np.log(ld(n)) + log_scale + top + np.log(np.exp(terms - top).sum())
    return float(-np.expm1(log_keep))


@pytest.mark.skipif(np.finfo(np.longdouble).eps >= 1e-18, reason="needs 80-bit long double")
@pytest.mark.parametrize("n,s", [(200, 15.0), (1000, 27.8), (3000, 24.0), (5000, 25.6)])
def test_exact_tail_float_error_is_far_below_the_allowance(n, s, implementation):
    # Where the exact branch is used (p down to ~1e-11) 1 - keep cancels; its error must stay
    # well inside FLOAT_ALLOWANCE so that exact + allowance is conservative.
    log_a = trgof.log_boundaries(s, n)
    reference = _crossing_80_bit(log_a, n)
    computed = trgof._crossing_exact(log_a, n)
    assert computed + trgof.FLOAT_ALLOWANCE >= reference
    assert abs(computed - reference) <= trgof.FLOAT_ALLOWANCE / 5, (computed, reference)


def test_token_pvalues_are_conservative_on_the_prf_grid():
    # Smallest uniform the PRF can give for 1 - u: one grid step; its p must be >= P(p <= it).
    grid = 2.0 ** 24
    u = np.float32((grid) / (grid + 1))  # the largest uniform on the grid
    p = trgof.token_pvalues(-np.log1p(-np.array([u], dtype=np.float64)))[0]
    assert p >= 1.0 / grid


def test_statistic_edge_cases():
    assert trgof.statistic(np.array([])) == 0.0
    assert trgof.statistic(np.full(10, 0.9)) == 0.0
    assert trgof.log_sf(0.0, 10) == 0.0 and trgof.log_sf(5.0, 0) == 0.0


@pytest.mark.statistical
@pytest.mark.parametrize("test,spec", [
    ("auto", {}), ("trgof", {}),
    ("auto", {"algorithm": "dual_key_gumbel"}),  # max + weighted + Tr-GoF + both span families
    ("auto", {"algorithm": "dual_key_gumbel", "coin": "keyed"}),  # routed throughout
])
def test_default_combination_is_valid_on_null_text(test, spec):
    rng = np.random.default_rng(17)
    config = DetectorConfig(test=test)
    trials = 1500
    ps = []
    for _ in range(trials):
        key = WatermarkKey(int(rng.integers(0, 2**63)), WatermarkSpec(**spec))
        ps.append(detect(rng.integers(0, 5000, int(rng.integers(20, 400))), [Candidate.inline(key)], config).p_value)
    ps = np.array(ps)
    for t in (1e-3, 0.01, 0.05, 0.2):
        assert np.mean(ps <= t) <= t + 3 * math.sqrt(t * (1 - t) / trials), t


def _substitute(tokens, rate, rng):
    tokens = list(tokens)
    for i in np.flatnonzero(rng.random(len(tokens)) < rate):
        tokens[i] = int(rng.integers(0, 5000))
    return tokens


def test_auto_detects_edited_text_the_sum_misses_more_often():
    rng = np.random.default_rng(3)
    wins = {"sum": 0, "auto": 0}
    for seed in range(12):
        key = WatermarkKey(7000 + seed, WatermarkSpec())
        tokens, _ = generate(key, 300, scale=1.5, seed=seed)
        edited = _substitute(tokens, 0.3, rng)
        for test in wins:
            wins[test] += detect(edited, [Candidate.inline(key)], DetectorConfig(test=test, spans=False)).watermarked
    assert wins["auto"] >= wins["sum"]


def test_span_aware_verdict_and_refined_offsets():
    key = WatermarkKey(31337, WatermarkSpec())
    marked, _ = generate(key, 200, scale=2.5, seed=11)
    rng = np.random.default_rng(0)
    text = list(rng.integers(0, 5000, 400)) + marked + list(rng.integers(0, 5000, 400))
    result = detect(text, [Candidate.inline(key)])
    assert result.watermarked and result.basis == ("watermark",)
    span = min(result.spans, key=lambda s: s.log10_p_value)
    overlap = min(span.end, 600) - max(span.start, 400)
    iou = overlap / (max(span.end, 600) - min(span.start, 400))
    assert iou >= 0.85, (span.start, span.end)


@pytest.mark.parametrize("n", [1, 2, 9, 60, 400, 1500])
def test_lower_bound_is_below_the_exact_tail(n, implementation):
    # The screen that lets detect() skip the exact tail must never exceed it.
    rng = np.random.default_rng(n)
    for trial in range(60):
        scores = rng.exponential(size=n)
        if trial % 2:
            scores[: n // 15 + 1] += rng.uniform(0.0, 8.0)
        s, i, v = trgof.statistic_at(trgof.token_pvalues(scores))
        assert s == trgof.statistic(trgof.token_pvalues(scores))
        if s > 0.0:
            assert trgof.log_sf_lower(n, i, v) <= trgof.log_sf(s, n) + 1e-12, (n, s)
            assert trgof.log_sf(s, n) <= trgof.log10_union(s, n) * trgof.LN10 + 1e-12


def test_boundary_newton_survives_far_left_starts():
    # i = 1 starts at ln v ~ -n; K is evaluated from ln v, so Newton (not bisection) finds it.
    for n, s in [(1000, 12.0), (5000, 20.0)]:
        log_a = trgof.log_boundaries(s, n)
        u = np.arange(1, trgof.order_count(n) + 1) / n
        assert np.all(n * trgof._kl(u, np.exp(log_a)) <= s + 1e-9)
        assert np.all(n * trgof._kl_log(u, log_a - 1e-9 * (1 + np.abs(log_a))) >= s - 1e-5)


@pytest.mark.parametrize("spec", [{}, {"algorithm": "dual_key_gumbel"}])
def test_skipping_the_exact_tail_changes_no_verdict_and_no_small_p(spec, monkeypatch, implementation):
    # detect() computes Tr-GoF's exact tail only where a lower bound says it can matter; with
    # the screen disabled (always exact) the verdict and every global p <= 0.01 must agree.
    rng = np.random.default_rng(23)
    cases = []
    for seed in range(30):
        key = WatermarkKey(9100 + seed, WatermarkSpec(**spec))
        if seed % 3 == 0:
            tokens = [int(t) for t in rng.integers(0, 5000, 300)]
        else:
            tokens, _ = generate(key, 300, scale=1.2, seed=seed)
            tokens = _substitute(tokens, 0.1 * (seed % 4), rng)
        cases.append((tokens, key))
    screened = [detect(t, [Candidate.inline(k)]) for t, k in cases]
    monkeypatch.setattr(trgof, "log_sf_lower", lambda n, i, v: -math.inf)
    exact = [detect(t, [Candidate.inline(k)]) for t, k in cases]
    for a, b in zip(screened, exact):
        assert a.watermarked == b.watermarked
        assert a.log10_p_value >= b.log10_p_value - 1e-12
        if b.log10_p_value <= -2.0:
            assert a.log10_p_value == b.log10_p_value


@pytest.mark.parametrize("n,s", [(50, 6.0), (1000, 6.0), (1000, 27.0), (3000, 20.0)])
def test_blocked_recursion_matches_the_stepwise_one(n, s, monkeypatch, implementation):
    # Blocks move the counts far below the boundary with one combined Poisson kernel; the
    # paths this drops must not show above the float noise (up to ~5e-14 each way between
    # the two orders of summation; both within 1e-13 of the 80-bit recursion).
    log_a = trgof.log_boundaries(s, n)
    blocked = trgof._crossing_exact(log_a, n)
    monkeypatch.setattr(trgof, "_BLOCK", 1)
    stepwise = trgof._crossing_exact(log_a, n)
    assert abs(blocked - stepwise) <= 2e-13, (blocked, stepwise)


def test_convolver_is_np_convolve_bit_for_bit():
    # The exact tail's recursion calls numpy's correlate directly on reversed kernels.
    full = trgof._convolver()
    rng = np.random.default_rng(3)
    for length, width in [(1, 1), (1, 21), (5, 21), (21, 21), (22, 21), (80, 21), (300, 57), (3, 1)]:
        x, kernel = rng.random(length), rng.random(width)
        assert np.array_equal(full(x, np.ascontiguousarray(kernel[::-1])), np.convolve(x, kernel)), (length, width)


@pytest.mark.parametrize("n,s", [(2, 3.0), (50, 6.0), (1000, 27.8), (3000, 20.0), (5000, 25.6)])
def test_kernel_columns_cut_changes_nothing(n, s, monkeypatch):
    # Only the columns that can exceed _NEGLIGIBLE of their row are computed; with every
    # column computed the tail is the same, bit for bit. (The numpy reference's cut: the
    # compiled kernels stop row by row instead.)
    log_a = trgof.log_boundaries(s, n)
    cut = trgof._crossing_exact(log_a, n, compiled=False)
    monkeypatch.setattr(trgof, "_LOG_NEGLIGIBLE", -math.inf)
    assert trgof._crossing_exact(log_a, n, compiled=False) == cut


@pytest.mark.parametrize("n", [1, 2, 3, 7, 50, 200, 1000, 3000, 5000])
def test_boundaries_are_tight_and_conservative_from_every_start(n):
    # Newton starts near the root where that start is checked to lie left of it, else far
    # left; either way each a_i is >= the root (n K <= s) and within float noise of it.
    u = np.arange(1, trgof.order_count(n) + 1) / n
    for s in (0.01, 0.5, 3.0, 12.0, 27.8, 60.0, 200.0):
        log_a = trgof.log_boundaries(s, n)
        assert np.all(log_a <= np.log(u))
        assert np.all(n * trgof._kl_log(u, log_a) <= s + 1e-9), (n, s)
        below = log_a - 1e-9 * (1 + np.abs(log_a))
        assert np.all(n * trgof._kl_log(u, below) >= s - 1e-5 * max(1.0, s)), (n, s)


compiled_only = pytest.mark.skipif(not trgof_compiled.available(), reason="numba is not installed")


@compiled_only
@pytest.mark.parametrize("n", [1, 2, 3, 7, 50, 200, 1000, 3000, 5000])
def test_compiled_loop_matches_the_numpy_reference(n):
    # Same recursion and truncations; the compiled kernels stop row by row at their last term
    # above _NEGLIGIBLE (conservative) and come from ratios, and the sums run in another order:
    # float noise only (measured <= 7.4e-14), far inside FLOAT_ALLOWANCE (the final 1 - keep
    # cancels, hence an absolute bound).
    for s in (0.01, 0.5, 3.0, 6.0, 12.0, 20.0, 27.8, 40.0):
        log_a = trgof.log_boundaries(s, n)
        reference = trgof._crossing_exact(log_a, n, compiled=False)
        compiled = trgof._crossing_exact(log_a, n, compiled=True)
        assert abs(compiled - reference) <= trgof.FLOAT_ALLOWANCE / 20, (n, s, compiled, reference)


@compiled_only
def test_compiled_loop_reports_when_every_path_crossed():
    # A first kernel with no mass at 0 sends every path over the first boundary (N(a_1) <= 0).
    kernels = np.array([[0.0, 1.0], [1.0, 0.5]])
    widths = np.array([2, 2])
    starts, ends, depths = np.array([0]), np.array([2]), np.array([16])
    blocks, block_widths = np.ones((1, 1)), np.array([1])
    *_, alive = trgof._forward_numpy(kernels, widths, starts, ends, blocks, block_widths, depths)
    trgof_compiled.crossing()  # compiles the loop, which replaces the module's _forward
    *_, compiled_alive = trgof_compiled._forward(kernels, widths, starts, ends, blocks, block_widths, depths,
                                                 trgof._NEGLIGIBLE)
    assert not alive and not compiled_alive


def test_numba_loads_only_where_it_pays():
    # Not with the detector, not for one exact tail (the numpy loop is far cheaper than
    # loading numba, ~0.3 s): a one-off detection never pays for it. A process that keeps
    # computing exact tails loads it by itself; warm_up (the gateway's start) loads it.
    code = ("import sys; from detector import detect, trgof; print('numba' in sys.modules); "
            "trgof.log_sf(20.0, 64); print('numba' in sys.modules); "
            "[trgof.log_sf(20.0, 64) for _ in range(20)]; print('numba' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.stdout.split() == ["False", "False", str(trgof_compiled.available())]
    code = "import sys; from detector import trgof; trgof.warm_up(); print('numba' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.stdout.split() == [str(trgof_compiled.available())]


@compiled_only
def test_compiled_loop_runs_where_no_cache_can_be_written(tmp_path):
    # numba's cache falls back from NUMBA_CACHE_DIR to the package's __pycache__ to the user
    # cache; where none is writable the loop compiles per process instead of failing.
    package = tmp_path / "detector"
    package.mkdir()
    source = Path(trgof.__file__).parent
    for name in ("__init__.py", "trgof.py", "trgof_compiled.py"):
        shutil.copy(source / name, package / name)
    (package / "__pycache__").write_text("")  # a file where the cache directory would go
    helpers = tmp_path / "watermark"
    helpers.mkdir()
    for name in ("__init__.py", "jit.py"):
        shutil.copy(source.parent / "watermark" / name, helpers / name)
    env = {**os.environ, "NUMBA_CACHE_DIR": "/dev/null/numba", "XDG_CACHE_HOME": "/dev/null/cache",
           "HOME": "/dev/null", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(tmp_path)}
    code = ("from detector import trgof, trgof_compiled; "
            "print(type(trgof_compiled.crossing()._cache).__name__, repr(trgof.log_sf(20.0, 300)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=tmp_path, env=env)
    cache, value = done.stdout.split()
    assert cache == "NullCache"
    # (compiled there; here compiled or numpy, whichever this process runs: 1e-13 apart)
    assert math.isclose(float(value), trgof.log_sf(20.0, 300), rel_tol=1e-11)


@compiled_only
@pytest.mark.parametrize("lam", [0.0, 1e-9, 0.3, 1.0, 2.5, 17.0, 60.0])
def test_compiled_kernel_rows_are_poisson_terms(lam):
    # A row's terms come from its largest by ratios: they must be lam^r / r! / e^scale to
    # float noise, and stop at the last term above _NEGLIGIBLE of the largest (at most 48).
    trgof_compiled.crossing()  # compiles the helpers, which replace the module's functions
    columns, scale = trgof._KERNEL, 1.5
    row = np.empty(columns)
    width = trgof_compiled._poisson_row(lam, scale, columns, trgof._NEGLIGIBLE, trgof._LOG_FACT, row)
    r = np.arange(columns)
    with np.errstate(divide="ignore", invalid="ignore"):
        exact = np.exp(np.where(r > 0, r * np.log(lam), 0.0) - trgof._LOG_FACT[:columns] - scale)
    if lam == 0.0:
        exact[1:] = 0.0
    kept = exact > trgof._NEGLIGIBLE * exact.max()
    assert width == columns - int(np.argmax(kept[::-1]))
    assert np.allclose(row[:width], exact[:width], rtol=1e-13, atol=0.0)
    assert not row[width:].any()


def test_statistic_of_scores_is_the_numpy_statistic():
    # Compiled selection and combination, numpy's exp, log and log1p: the same (S, i, p_(i)).
    pytest.importorskip("numba")
    from watermark import jit

    jit.load()
    assert trgof_compiled.statistic_kernels() is not None
    rng = np.random.default_rng(13)
    for n in (1, 2, 3, 10, 199, 200, 1001):
        for boost in (0.0, 0.5, 2.0, 6.0):
            scores = rng.exponential(1.0, n)
            scores[: n // 3] += boost * rng.exponential(1.0, n // 3)
            expected = trgof.statistic_at(trgof.token_pvalues(scores))
            assert trgof.statistic_of_scores(scores) == expected
    assert trgof.statistic_of_scores(np.zeros(5)) == trgof.statistic_at(trgof.token_pvalues(np.zeros(5)))
