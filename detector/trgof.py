"""Tr-GoF: an edit-robust goodness-of-fit test over per-token p-values, with an exact null.

Li, Ruan, Wang, Long, Su, "Robust detection of watermarks for large language models under
human edits" (JRSS-B 2025, arXiv 2411.13868): under edits only a sparse share of tokens
still carries the watermark; a sum dilutes that signal, a truncated goodness-of-fit test
of the per-token p-values against Uniform(0, 1) does not. We use the member s = 1 of the
paper's phi-divergence family (the Berk-Jones / likelihood-ratio divergence),

    S = max_{i <= I} n K(i/n, p_(i))  over i with p_(i) < i/n (the truncation "+"),
    K(u, v) = u ln(u/v) + (1 - u) ln((1 - u)/(1 - v)),

with I = ceil(n/2) order statistics (the signal left by edits lives in the smallest
p-values; the sum statistic covers dense signal).

Null distribution, exact. For a level s, n K(i/n, v) >= s with v < i/n iff v <= a_i(s)
(K decreases in v below u), so P(S >= s) = 1 - P(U_(i) > a_i for every i <= I), a
boundary-crossing probability of uniform order statistics. With V = 1 - U that is
P(V_(m) < c_m, m <= n) with c_m = 1 - a'_(n+1-m) (a' the running maximum of a, which
leaves the event unchanged), computed by Bolshev's recursion (Shorack & Wellner,
"Empirical Processes with Applications to Statistics", 1986, sec. 9.3):

    F_0 = 1,  F_k = 1 - sum_{j<k} C(k, j) (1 - c_{j+1})^{k-j} F_j,

a sum of positive terms each computed in log space; O(I^2) work. Its float error is far
below 1e-11 absolute (tested against 80-bit arithmetic); deep in the tail the p-value is
instead bounded by a union of Chernoff bounds, P(U_(i) <= a_i) = P(Bin(n, a_i) >= i)
<= exp(-n K(i/n, a_i)) = exp(-s), so P(S >= s) <= I exp(-s): provably conservative at any
depth. The reported p is min(I e^-s, exact + 1e-11).

Per-token p-values: a score s_t that is Exp(1) under the null gives p_t = exp(-s_t). The
PRF's uniforms lie on a 2^24 grid and pass through float32, which makes P(p_t <= x)
exceed x by up to a grid step; p_t + 2^-23 is conservative (see :func:`token_pvalues`).
"""

from __future__ import annotations

import math

import numpy as np

LN10 = math.log(10.0)
GRID_SLACK = 2.0 ** -23
"""Added to each per-token p-value: one and a half grid steps of the PRF's 24-bit uniforms
plus float32 rounding (at most 2^-25), so P(p + slack <= x) <= x for every x."""
FLOAT_ALLOWANCE = 1e-11
"""Absolute allowance added to the recursion's result for its float error."""
EXACT_MAX_N = 5000
"""Above this many scored tokens only the Chernoff union bound is used (O(n))."""

_LOG_FACT = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, EXACT_MAX_N + 2, dtype=np.float64)))))


def token_pvalues(scores: np.ndarray) -> np.ndarray:
    """Conservative per-token p-values [n] from Exp(1)-null scores [n]."""
    return np.minimum(1.0, np.exp(-np.asarray(scores, dtype=np.float64)) + GRID_SLACK)


def order_count(n: int) -> int:
    """I: how many of the smallest p-values the statistic looks at."""
    return (n + 1) // 2


def _kl(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        first = u * (np.log(u) - np.log(v))
        second = np.where(u < 1.0, (1.0 - u) * (np.log1p(-u) - np.log1p(-v)), 0.0)
    return first + second


def statistic(pvalues: np.ndarray) -> float:
    """S (>= 0) of per-token p-values [n]."""
    n = len(pvalues)
    if n == 0:
        return 0.0
    count = order_count(n)
    p = np.sort(np.asarray(pvalues, dtype=np.float64))[:count]
    u = np.arange(1, count + 1, dtype=np.float64) / n
    below = p < u
    if not below.any():
        return 0.0
    return float(max(0.0, np.max(n * _kl(u[below], p[below]))))


def log_boundaries(s: float, n: int) -> np.ndarray:
    """ln a_i(s) [I]: the largest v < i/n with n K(i/n, v) >= s, rounded up (conservative).

    Bisection in ln v; the returned end always satisfies n K(i/n, v) <= s, so it is >= the
    exact root and the crossing probability computed from it is >= the exact one."""
    count = order_count(n)
    u = np.arange(1, count + 1, dtype=np.float64) / n
    target = s / n
    hi = np.log(u)  # K(u, u) = 0 <= target
    lo = hi - (target + 1.0) / u  # K(u, v) >= u ln(u/v) - 1/e > target here
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        above = _kl(u, np.exp(mid)) >= target
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    return hi


_KERNEL = 48
"""Poisson increments kept per boundary step; dropping the rest only lowers the computed
non-crossing probability, so it can only raise the p-value (conservative)."""


def _crossing_exact(log_a: np.ndarray, n: int) -> float:
    """P(U_(i) <= a_i for some i <= I) for n iid uniforms; log_a [I] = ln a_i.

    Poissonised forward recursion over the boundaries (Noe 1972, one-sided): with a Poisson
    process of rate n on [0, 1], counts in disjoint intervals are independent Poisson, and
    conditioning on N(1) = n gives the uniform sample. h_i(m) = weight of the paths with
    N(a_i) = m that satisfied N(a_l) <= l - 1 for every l <= i; each step convolves with
    the Poisson kernel lambda^r / r! (lambda = n (a_i - a_{i-1})) and drops m > i - 1.
    Every term is positive (no cancellation); each step is rescaled in log space."""
    log_a = np.maximum.accumulate(log_a)
    a = np.exp(log_a)
    count = len(a)
    lf = _LOG_FACT
    h = np.ones(1)
    log_scale = 0.0
    previous = 0.0
    r = np.arange(_KERNEL, dtype=np.float64)
    for i in range(1, count + 1):
        lam = n * (a[i - 1] - previous)
        previous = a[i - 1]
        if lam > 0.0:
            width = min(i, _KERNEL)
            kernel = np.exp(r[:width] * math.log(lam) - lf[:width])
            h = np.convolve(h, kernel)[:i]
        elif len(h) < i:
            h = np.concatenate((h, [0.0]))
        top = float(h.max())
        if top <= 0.0:
            return 1.0
        h /= top
        log_scale += math.log(top)
    # The last stretch (a_I, 1] takes the remaining n - m points.
    m = np.arange(len(h))
    rest = n * (1.0 - a[-1])
    with np.errstate(divide="ignore"):
        terms = np.log(h) + (n - m) * (math.log(rest) if rest > 0.0 else -math.inf) - lf[n - m]
    top = float(terms.max())
    if top == -math.inf:
        return 1.0
    log_keep = lf[n] - n * math.log(n) + log_scale + top + math.log(float(np.exp(terms - top).sum()))
    return min(1.0, max(0.0, -math.expm1(min(0.0, log_keep))))


def log_sf(s: float, n: int) -> float:
    """ln P(S >= s) under the null (exact + float allowance, or the union bound)."""
    if n == 0 or s <= 0.0:
        return 0.0
    count = order_count(n)
    log_union = math.log(count) - s
    if n > EXACT_MAX_N or log_union < math.log(FLOAT_ALLOWANCE) - 2.0:
        return min(0.0, log_union)
    exact = _crossing_exact(log_boundaries(s, n), n)
    return min(0.0, log_union, math.log(exact + FLOAT_ALLOWANCE))


def log10_sf(s: float, n: int) -> float:
    return log_sf(s, n) / LN10


def log10_pvalue(scores: np.ndarray) -> float:
    """log10 p of Tr-GoF over Exp(1)-null per-token scores [n]."""
    p = token_pvalues(scores)
    return log10_sf(statistic(p), len(p))
