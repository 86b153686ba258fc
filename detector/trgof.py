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
boundary-crossing probability of uniform order statistics (a' the running maximum of a
leaves the event unchanged), computed by a Poissonised forward recursion over the
boundaries (Noe 1972; :func:`_crossing_exact`): a sum of positive terms, O(I^2) work in
the worst case and far less with the truncations it states. Its float error is far below
1e-11 absolute (tested against 80-bit arithmetic). The recursion's kernels and loop run
compiled (numba, :mod:`detector.trgof_compiled`, ~0.3 ms at n = 1,000) where numba is
installed, and in numpy (the reference, ~1.3 ms) otherwise. Deep in the tail the p-value is
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

from detector import trgof_compiled
from watermark import jit

LN10 = math.log(10.0)
GRID_SLACK = 2.0 ** -23
"""Added to each per-token p-value: one and a half grid steps of the PRF's 24-bit uniforms
plus float32 rounding (at most 2^-25), so P(p + slack <= x) <= x for every x."""
FLOAT_ALLOWANCE = 1e-11 if np.finfo(np.longdouble).eps < 1e-18 else 1e-10
"""Absolute allowance added to the recursion's result for its float error: measured at most
about 1e-13 up to n = 5000 with an x87 long double for the final cancellation (tested), and
up to about 5e-11 without one, hence the larger allowance on such platforms."""
EXACT_MAX_N = 5000
"""Above this many scored tokens only the Chernoff union bound is used (O(n))."""
EXACT_TAIL_WORK = 250_000
"""What one exact tail weighs in :func:`watermark.jit.worth_loading` (its numpy loop costs
about as much as 250,000 PRF evaluations): the 16th exact tail of a process loads numba."""

# ln k! for k <= EXACT_MAX_N + 1, each entry rounded on its own (a running sum of logs would
# carry its rounding error into every later entry).
_LOG_FACT = np.array([math.lgamma(k + 1.0) for k in range(EXACT_MAX_N + 2)])
_LOG_FACT_EXTENDED = np.concatenate(([np.longdouble(0.0)], np.cumsum(np.log(np.arange(1, EXACT_MAX_N + 2, dtype=np.longdouble)))))


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
    return statistic_at(pvalues)[0]


def statistic_at(pvalues: np.ndarray) -> tuple[float, int, float]:
    """(S, i, p_(i)): S of per-token p-values [n] and the order i <= I where it is attained
    (i = 0 and p = 1 when S = 0)."""
    n = len(pvalues)
    if n == 0:
        return 0.0, 0, 1.0
    count = order_count(n)
    p = np.partition(np.asarray(pvalues, dtype=np.float64), count - 1)[:count]
    p.sort()
    u = np.arange(1, count + 1, dtype=np.float64) / n
    below = np.flatnonzero(p < u)
    if not len(below):
        return 0.0, 0, 1.0
    values = n * _kl(u[below], p[below])
    best = int(np.argmax(values))
    if not values[best] > 0.0:
        return 0.0, 0, 1.0
    return float(values[best]), int(below[best]) + 1, float(p[below[best]])


def statistic_of_scores(scores: np.ndarray) -> tuple[float, int, float]:
    """:func:`statistic_at` of :func:`token_pvalues` of Exp(1)-null scores [n], the same
    numbers: where numba is loaded, the selection and the combination run compiled
    (:mod:`detector.trgof_compiled`) and the transcendentals stay numpy's (one exp over the
    scores, one log and one log1p over the orders below i/n), five calls instead of about
    twenty-five."""
    kernels = trgof_compiled.statistic_kernels()
    scores = np.asarray(scores, dtype=np.float64)
    if kernels is None or scores.ndim != 1 or not len(scores):
        return statistic_at(token_pvalues(scores))
    args, negated, index = kernels["_below"](np.exp(-scores), GRID_SLACK)
    s, i, at = kernels["_best"](args, np.log(args), np.log1p(negated), index, len(scores))
    return float(s), int(i), float(at)


def log_sf_lower(n: int, i: int, v: float) -> float:
    """ln of a lower bound on P(S >= s) for s = n K(i/n, v) attained at order i by p_(i) = v
    (:func:`statistic_at`): the boundary a_i(s) is >= v, so {S >= s} contains
    {U_(i) <= v}, whose probability is P(Binomial(n, v) >= i), summed in log space (and
    lowered by 1e-9 for float error). Within a factor of about I of the exact tail: a cheap
    screen for whether the exact tail can matter."""
    if i <= 0 or n == 0:
        return 0.0
    if not 0.0 < v < 1.0:
        return 0.0 if v >= 1.0 else -math.inf
    ks = np.arange(i, n + 1)
    lf = _LOG_FACT if n <= EXACT_MAX_N else np.array([math.lgamma(k + 1.0) for k in range(n + 1)])
    terms = lf[n] - lf[ks] - lf[n - ks] + ks * math.log(v) + (n - ks) * math.log1p(-v)
    top = float(terms.max())
    return min(0.0, top + math.log(float(np.exp(terms - top).sum())) - 1e-9)


def log_sf_lower_first_term(n: int, i: int, v: float) -> float:
    """A number at most :func:`log_sf_lower` (same arguments): the sum's first term,
    ln P(Binomial(n, v) = i), lowered by the same 1e-9, computed with the same arithmetic.
    (The sum's terms are all positive, so its log is at least its largest term's.)"""
    if i <= 0 or n == 0:
        return 0.0
    if not 0.0 < v < 1.0:
        return 0.0 if v >= 1.0 else -math.inf
    lf = _LOG_FACT if n <= EXACT_MAX_N else None
    log_fact = (lambda k: lf[k]) if lf is not None else (lambda k: math.lgamma(k + 1.0))
    first = float(log_fact(n) - log_fact(i) - log_fact(n - i) + i * math.log(v) + (n - i) * math.log1p(-v))
    return min(0.0, first - 1e-9) - 1e-12 * (1.0 + abs(first))


def log10_sf_lower(pvalues: np.ndarray) -> float:
    """log10 of :func:`log_sf_lower` at the statistic of per-token p-values [n]."""
    s, i, v = statistic_at(pvalues)
    return log_sf_lower(len(pvalues), i, v) / LN10 if s > 0.0 else 0.0


def _kl_log(u: np.ndarray, x: np.ndarray) -> np.ndarray:
    """K(u, e^x) for x = ln v < ln u < 0, from ln v (no underflow of v for very negative x)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        second = np.where(u < 1.0, (1.0 - u) * (np.log1p(-u) - np.log1p(-np.exp(x))), 0.0)
        return u * (np.log(u) - x) + second


def log_boundaries(s: float, n: int) -> np.ndarray:
    """ln a_i(s) [I]: the largest v < i/n with n K(i/n, v) >= s, rounded up (conservative).

    f(x) = K(u, e^x) - s/n decreases and is convex in x below ln u, so Newton's method from
    a point left of the root climbs to it without passing it (K is evaluated from x = ln v,
    so a far-left start does not underflow); the returned end is then nudged up and checked
    to satisfy n K(i/n, v) <= s (entries that fail the check are bisected instead), so it is
    >= the exact root and the crossing probability computed from it is >= the exact one."""
    count = order_count(n)
    u = np.arange(1, count + 1, dtype=np.float64) / n
    target = s / n
    top = np.log(u)  # K(u, u) = 0 <= target
    x = top - (target + 1.0) / u  # K(u, v) >= u ln(u/v) - 1/e > target here
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        # A nearer start where it is checked to lie left of the root (f >= 0): the Gaussian
        # approximation of the root, moved away from u by a factor 1.5 (or 4 where that is not
        # left of the root); Newton needs about half the iterations from there. Elsewhere the
        # far start above.
        for factor in (4.0, 1.5):
            near = np.log(u - factor * np.sqrt(2.0 * u * (1.0 - u) * target))
            x = np.where(_kl_log(u, near) >= target, near, x)
        # K(u, e^x) = u (ln u - x) + (1 - u) ln(1 - u) - (1 - u) ln(1 - e^x), its terms in x hoisted.
        fixed = np.where(u < 1.0, (1.0 - u) * np.log1p(-u), 0.0) + u * top - target
        rest = np.where(u < 1.0, 1.0 - u, 0.0)
        for _ in range(100):
            v = np.exp(x)
            slope = (v - u) / -np.expm1(x)  # f'(x) < 0 left of ln u
            step = -(fixed - u * x - rest * np.log1p(-v)) / slope
            step = np.where(np.isfinite(step) & (step > 0.0), step, 0.0)
            x = np.minimum(x + step, top)
            if float(step.max(initial=0.0)) <= 1e-13 * (1.0 + float(np.abs(x).max(initial=0.0))):
                break
    nudge = 1e-11 * (1.0 + np.abs(x))
    hi = np.minimum(x + nudge, top)
    bad = np.flatnonzero(~(_kl_log(u, hi) <= target))
    for _ in range(6):  # where f is flat (v near u) the root needs a wider margin
        if not len(bad):
            return hi
        nudge[bad] *= 4.0
        hi[bad] = np.minimum(x[bad] + nudge[bad], top[bad])
        bad = bad[~(_kl_log(u[bad], hi[bad]) <= target)]
    if len(bad):
        hi[bad] = _bisect(u[bad], target, top[bad])
    return hi


def _bisect(u: np.ndarray, target: float, hi: np.ndarray) -> np.ndarray:
    lo = hi - (target + 1.0) / u
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        above = _kl_log(u, mid) >= target
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    return hi


_KERNEL = 48
_BLOCK = 16
"""Steps per block of the recursion (see :func:`_crossing_exact`)."""
_NEGLIGIBLE = 1e-20
_LOG_NEGLIGIBLE = math.log(_NEGLIGIBLE)
"""Poisson increments kept per boundary step; dropping the rest only lowers the computed
non-crossing probability, so it can only raise the p-value (conservative)."""


def _block_kernels(lams: np.ndarray, log_scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per block b, lambda_b^r / r! / e^(log_scale_b) for r = 0, 1, ... [B, R] and each row's
    width [B]: terms past a row's width are below _NEGLIGIBLE of its largest and dropped,
    which only lowers `keep`."""
    r = np.arange(int(float(lams.max(initial=0.0)) + 15.0 * math.sqrt(float(lams.max(initial=0.0))) + 48.0),
                  dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_kernel = np.where(r[None, :] > 0, r[None, :] * np.log(lams)[:, None], 0.0) - _LOG_FACT[:len(r)][None, :]
    log_kernel[lams <= 0.0, 1:] = -math.inf
    kernels = np.exp(log_kernel - log_scales[:, None])
    keep = kernels > _NEGLIGIBLE * kernels.max(axis=1, keepdims=True)
    widths = len(r) - np.argmax(keep[:, ::-1], axis=1)
    return kernels, widths



def _log_kernels(lam: np.ndarray, columns: int) -> np.ndarray:
    """ln(lambda^r / r!) [len(lam), columns] for r < columns; a zero increment gives the
    identity kernel [0, -inf, ...]."""
    r = np.arange(columns, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_kernel = np.where(r[None, :] > 0, r[None, :] * np.log(lam)[:, None], 0.0) - _LOG_FACT[:columns][None, :]
    log_kernel[lam <= 0.0, 1:] = -math.inf
    return log_kernel


def _correlate():
    """numpy's correlate(x, v, mode) without np.convolve's argument handling (mode 2: full;
    for len(x) >= len(v) it is np.convolve(x, v[::-1]) bit for bit), or None where numpy does
    not expose it."""
    return getattr(getattr(getattr(np, "_core", None), "multiarray", None), "correlate", None)


def _convolver():
    """full(x, reversed_kernel) = np.convolve(x, reversed_kernel[::-1]) for 1-d float64
    arrays, bit for bit (np.convolve is numpy's correlate of x with the reversed kernel): the
    call without np.convolve's Python-level argument handling where numpy exposes it, which
    halves the cost of the recursion's small convolutions."""
    correlate = _correlate()
    if correlate is None:  # pragma: no cover - other numpy layouts
        return lambda x, reversed_kernel: np.convolve(x, reversed_kernel[::-1])

    def full(x: np.ndarray, reversed_kernel: np.ndarray) -> np.ndarray:
        if len(x) >= len(reversed_kernel):
            return correlate(x, reversed_kernel, 2)
        return np.convolve(x, reversed_kernel[::-1])  # numpy's correlate swaps shorter inputs

    return full


def _crossing_exact(log_a: np.ndarray, n: int, compiled: bool = True) -> float:
    """P(U_(i) <= a_i for some i <= I) for n iid uniforms; log_a [I] = ln a_i.

    Poissonised forward recursion over the boundaries (Noe 1972, one-sided): with a Poisson
    process of rate n on [0, 1], counts in disjoint intervals are independent Poisson, and
    conditioning on N(1) = n gives the uniform sample. h_i(m) = weight of the paths with
    N(a_i) = m that satisfied N(a_l) <= l - 1 for every l <= i; each step convolves with
    the Poisson kernel lambda^r / r! (lambda = n (a_i - a_{i-1})) and drops m > i - 1.
    Every term is positive (no cancellation); h is rescaled every block, and the final
    combination, where 1 - keep cancels, runs in extended precision: the float error stays
    near 1e-13 up to n = 5000 (tested against the recursion in 80-bit arithmetic).

    The kernels and the loop over the steps run compiled (:mod:`detector.trgof_compiled`)
    where numba is installed and ``compiled``; otherwise in numpy (:func:`_crossing_numpy`,
    the reference); the final combination is shared."""
    log_a = np.maximum.accumulate(log_a)
    a = np.exp(log_a)
    # Compiled where numba is loaded or this process keeps computing exact tails (one tail is
    # cheaper in numpy than loading numba: watermark.jit.worth_loading).
    run = trgof_compiled.crossing() if compiled and jit.worth_loading(EXACT_TAIL_WORK) else None
    if run is not None:
        h, low, peak, scales, alive = run(a, n, _BLOCK, _KERNEL, _NEGLIGIBLE, _LOG_FACT)
    else:
        h, low, peak, scales, alive = _crossing_numpy(a, n)
    if not alive:
        return 1.0
    # The last stretch (a_I, 1] takes the remaining n - m points. Its terms are tens of
    # thousands in size and cancel to about ln(1 - p): they are combined in extended
    # precision where the platform has it (x87 long double; elsewhere float64 as before).
    ld = np.longdouble
    m = low + np.arange(len(h))
    rest = ld(n) * (ld(1.0) - ld(a[-1]))
    with np.errstate(divide="ignore"):
        terms = np.log(h.astype(ld)) + (n - m).astype(ld) * (np.log(rest) if rest > 0.0 else ld(-np.inf)) - _LOG_FACT_EXTENDED[n - m]
    top = terms.max()
    if top == -np.inf:
        return 1.0
    log_scale = peak.astype(ld).sum() + np.asarray(scales, dtype=ld).sum()
    log_keep = float(_LOG_FACT_EXTENDED[n] - ld(n) * np.log(ld(n)) + log_scale + top + np.log(np.exp(terms - top).sum()))
    return min(1.0, max(0.0, -math.expm1(min(0.0, log_keep))))


def _crossing_numpy(a: np.ndarray, n: int) -> tuple[np.ndarray, int, np.ndarray, list[float], bool]:
    """The recursion in numpy (the reference of :mod:`detector.trgof_compiled`) on
    boundaries a [I] (ascending): (h, low, peak, scales, alive), h[j] the scaled weight of
    N(a_I) = low + j, peak [I] the steps' kernel log scales, scales the blocks' rescalings,
    alive False where every path crossed."""
    count = len(a)
    # Every step's kernel at once, each scaled to a maximum of 1 (the log scales are kept
    # in `peak`); a zero increment is the identity kernel [1, 0, ...].
    lam = n * np.diff(a, prepend=0.0)
    # Only the first `columns` terms can exceed _NEGLIGIBLE of their row's largest: the
    # right tail lambda^r / r! relative to the row's largest term grows with lambda, so the
    # row of the largest lambda is the widest (computing the rest would only compute terms
    # that are dropped below).
    widest = _log_kernels(lam[[int(np.argmax(lam))]], _KERNEL)[0]
    columns = _KERNEL - int(np.argmax((widest - widest.max() > _LOG_NEGLIGIBLE)[::-1]))
    log_kernel = _log_kernels(lam, columns)
    peak = log_kernel.max(axis=1)
    kernels = np.exp(log_kernel - peak[:, None])
    # Terms below _NEGLIGIBLE of their maximum are dropped, from the kernels and from h's
    # low end (m far below n a_i): like the _KERNEL truncation this only removes paths that
    # kept below the boundary, lowering `keep` by far less than 1e-13, so it can only raise
    # the p-value.
    widths = np.maximum(1, columns - np.argmax((kernels > _NEGLIGIBLE)[:, ::-1], axis=1))
    peak_sums = np.concatenate(([0.0], np.cumsum(peak)))
    starts = np.arange(0, count, _BLOCK)
    ends = np.minimum(starts + _BLOCK, count)
    block_lams = n * (a[ends - 1] - np.where(starts > 0, a[np.maximum(starts - 1, 0)], 0.0))
    block_kernels, block_widths = _block_kernels(block_lams, peak_sums[ends] - peak_sums[starts])
    # P(Poisson(lambda_block) > depth) < 1e-24 (see _forward_numpy's block comment).
    depths = (block_lams + 10.0 * np.sqrt(block_lams) + 16.0).astype(np.int64)
    h, low, scales, alive = _forward_numpy(kernels, widths, starts, ends, block_kernels, block_widths, depths)
    return h, low, peak, scales, alive


def _forward_numpy(kernels: np.ndarray, widths: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                   block_kernels: np.ndarray, block_widths: np.ndarray,
                   depths: np.ndarray) -> tuple[np.ndarray, int, list[float], bool]:
    """The recursion's loop in numpy (the reference of :mod:`detector.trgof_compiled`):
    kernels [I, C] scaled Poisson kernels with their widths [I]; blocks of steps
    starts[b] + 1 .. ends[b] [B] with their combined kernels [B, R], widths [B] and
    depths [B]. Returns (h, low, scales, alive) as the compiled loop does."""
    # Each step's kernel reversed, as contiguous rows: the recursion's ~I small
    # convolutions call numpy's correlate on them directly (see _convolver).
    width = int(widths.max())
    steps = list(np.ascontiguousarray(kernels[:, width - 1::-1]))  # row views; zero-weight tails cost little
    reversed_blocks = [k[:w][::-1].copy() for k, w in zip(block_kernels, block_widths.tolist())]
    depths = depths.tolist()
    full, correlate = _convolver(), _correlate()
    scales: list[float] = []  # h's rescalings (the kernels' own scales are `peak`)
    h = np.ones(1)
    low = 0  # h[j] is the weight of N(a_i) = low + j
    for block, (first_step, last) in enumerate(zip(starts.tolist(), ends.tolist())):  # steps first_step + 1 .. last
        # Blocks: the counts far below the boundary (m < cut) cannot reach it within the
        # block unless they jump by more than `depth`; they move in one step with the
        # block's combined kernel Lambda^r / r! (a sum of Poisson increments is Poisson), and
        # the few paths that end above the block's first boundary (m > first_step) are
        # dropped, which only lowers `keep` (by far less than 1e-20 a block). The counts near the
        # boundary take the steps one by one, each step dropping m > i - 1.
        split = min(len(h), first_step - depths[block] - low)
        far = None
        if split > 0 and last - first_step > 1:
            far, far_low = h[:split], low
            h, low = h[split:], low + split
        if correlate is not None and len(h) >= width:  # h only grows within a block
            for i in range(first_step + 1, last + 1):
                h = correlate(h, steps[i - 1], 2)[:i - low]
        else:
            for i in range(first_step + 1, last + 1):
                h = full(h, steps[i - 1])[:i - low]
        if far is not None:
            moved = full(far, reversed_blocks[block])[:first_step + 1 - far_low]
            offset = low - far_low
            merged = np.zeros(max(len(moved), offset + len(h)))
            merged[:len(moved)] = moved
            merged[offset:offset + len(h)] += h
            h, low = merged, far_low
        # A scaled kernel grows h by at most 48x a step: rescaling every block keeps it in range.
        top = h.max()
        if top <= 0.0:
            return h, low, scales, False
        h /= top
        scales.append(math.log(top))
        first = int((h > _NEGLIGIBLE).argmax())
        if first:
            h = h[first:]
            low += first
    return h, low, scales, True


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


def warm_up() -> None:
    """Load numba and compile the exact tail's loop now (about a second; loaded from
    numba's cache in later processes), so that no request pays for it. Nothing to do
    without numba."""
    jit.load()
    log_sf(20.0, 64)


def log10_sf(s: float, n: int) -> float:
    return log_sf(s, n) / LN10


def log10_union(s: float, n: int) -> float:
    """log10 of the union (Chernoff) bound min(1, I e^-s) on P(S >= s): valid at any depth."""
    if n == 0 or s <= 0.0:
        return 0.0
    return min(0.0, math.log(order_count(n)) - s) / LN10


def log10_pvalue(scores: np.ndarray) -> float:
    """log10 p of Tr-GoF over Exp(1)-null per-token scores [n]."""
    p = token_pvalues(scores)
    return log10_sf(statistic(p), len(p))
