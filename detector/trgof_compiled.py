"""Tr-GoF's exact-tail recursion, compiled (numba): :func:`detector.trgof._crossing_exact`'s
kernels and forward loop, whose numpy reference stays beside it in :mod:`detector.trgof`.

Same recursion, same blocks, same truncations as the reference (Noe 1972, Poissonised,
one-sided; see :mod:`detector.trgof`): per step, h is convolved with the step's Poisson
kernel and the counts above the boundary are dropped; per block, the counts far below the
boundary move with the block's combined kernel (ending at most at the block's first
boundary), h is rescaled to a maximum of 1 and its low end below _NEGLIGIBLE is dropped.
Two differences, neither a new truncation: each step's kernel stops at its own last term
above _NEGLIGIBLE of its maximum (the reference carries every row to the widest row's
width, tails it keeps only because numpy's call costs the same either way; dropping a term
of a positive sum only lowers the non-crossing probability, so the p-value can only rise),
and a kernel's terms come from its largest one by the ratios lambda / r (one exp a row
instead of one a term). The float error stays of the order of 1e-14 absolute, far inside
FLOAT_ALLOWANCE (tested against the reference and the 80-bit recursion).

Why compiled: the reference makes ~I/2 sequential small convolutions (~500 at n = 1,000),
each a numpy call with its fixed overhead, and builds its kernels in a dozen numpy calls;
in one compiled pass both cost ~0.2 ms at n = 1,000.

numba is imported on the first exact tail (:func:`crossing`), not with the detector, so
that the CLI does not pay for it; the service compiles it at start
(:func:`detector.trgof.warm_up`). Without numba the numpy reference runs.
"""

from __future__ import annotations

import functools
import math

import numpy as np


def _convolve_into(x, x_len, kernel, width, out, limit):  # pragma: no cover - compiled
    """out[:m] = the full convolution of x[:x_len] with kernel[:width], cut to its first
    `limit` entries; returns m (0 for an empty x)."""
    if x_len == 0:
        return 0
    m = min(x_len + width - 1, limit)
    for t in range(m):
        out[t] = 0.0
    # Kernel term by kernel term, so that the inner loop runs along x (tens of entries,
    # contiguous: it vectorises) rather than along the short kernel.
    for r in range(min(width, m)):
        k = kernel[r]
        for j in range(min(x_len, m - r)):
            out[j + r] += x[j] * k
    return m


def _poisson_row(lam, log_scale, columns, relative, log_fact, out):  # pragma: no cover - compiled
    """out[:columns] = lam^r / r! / e^log_scale for r < columns, from the largest term (at
    r = floor(lam), or the last column) by the ratios lambda / r; returns the row's width: 1 +
    the last r whose term exceeds `relative` times the largest (the rest are left 0)."""
    for r in range(columns):
        out[r] = 0.0
    if not lam > 0.0:
        out[0] = math.exp(-log_scale)  # Poisson(0): no increment
        return 1
    mode = min(int(lam), columns - 1)
    top = math.exp(mode * math.log(lam) - log_fact[mode] - log_scale)
    out[mode] = top
    for r in range(mode, 0, -1):
        out[r - 1] = out[r] * r / lam
    width = mode + 1
    for r in range(mode + 1, columns):
        term = out[r - 1] * lam / r
        if not term > relative * top:
            break
        out[r] = term
        width = r + 1
    return width


def _crossing(a, n, block, columns, negligible, log_fact):  # pragma: no cover - compiled
    """The recursion on boundaries a [I] (ascending) for n uniforms: each step's kernel
    (lambda_i = n (a_i - a_{i-1})) scaled to a largest term of 1, its log scale in peak [I];
    blocks of `block` steps with their combined kernels and depths, as the reference builds
    them; then :func:`_forward`. Returns (h, low, peak, scales, alive)."""
    count = a.shape[0]
    kernels = np.empty((count, columns))
    widths = np.empty(count, dtype=np.int64)
    peak = np.zeros(count)
    previous = 0.0
    for i in range(count):
        lam = n * (a[i] - previous)
        previous = a[i]
        if lam > 0.0:
            mode = min(int(lam), columns - 1)
            peak[i] = mode * math.log(lam) - log_fact[mode]
        widths[i] = _poisson_row(lam, peak[i], columns, negligible, log_fact, kernels[i])
    blocks = (count + block - 1) // block
    starts = np.empty(blocks, dtype=np.int64)
    ends = np.empty(blocks, dtype=np.int64)
    block_lams = np.empty(blocks)
    log_scales = np.zeros(blocks)
    depths = np.empty(blocks, dtype=np.int64)
    largest = 0.0
    for b in range(blocks):
        starts[b] = b * block
        ends[b] = min(starts[b] + block, count)
        before = a[starts[b] - 1] if starts[b] > 0 else 0.0
        block_lams[b] = n * (a[ends[b] - 1] - before)
        for i in range(starts[b], ends[b]):
            log_scales[b] += peak[i]
        # P(Poisson(lambda_block) > depth) < 1e-24, as in the reference.
        depths[b] = int(block_lams[b] + 10.0 * math.sqrt(block_lams[b]) + 16.0)
        largest = max(largest, block_lams[b])
    block_columns = int(largest + 15.0 * math.sqrt(largest) + 48.0)
    block_kernels = np.empty((blocks, block_columns))
    block_widths = np.empty(blocks, dtype=np.int64)
    for b in range(blocks):
        block_widths[b] = _poisson_row(block_lams[b], log_scales[b], block_columns, negligible, log_fact,
                                       block_kernels[b])
    h, low, scales, alive = _forward(kernels, widths, starts, ends, block_kernels, block_widths, depths,
                                     negligible)
    return h, low, peak, scales, alive


def _forward(kernels, widths, starts, ends, block_kernels, block_widths, depths,
             negligible):  # pragma: no cover - compiled
    """The reference's loop over blocks (:func:`detector.trgof._forward_numpy`).

    kernels [I, C] and widths [I]: step i's scaled Poisson kernel (unreversed) and its
    length; starts, ends, depths [B]: each block's steps (starts[b] + 1 .. ends[b]) and
    the depth below the first boundary from which counts move as one; block_kernels
    [B, W] and block_widths [B]: the blocks' combined kernels. Returns (h, low, scales
    [B], alive): h[j] the scaled weight of N(a_I) = low + j, scales the log of each
    block's rescaling; alive False where every path crossed (h became 0)."""
    count = kernels.shape[0]
    blocks = starts.shape[0]
    cap = count + 1
    h = np.empty(cap)
    spare = np.empty(cap)
    far = np.empty(cap)
    moved = np.empty(cap)
    scales = np.zeros(blocks)
    h[0] = 1.0
    length = 1
    low = 0
    for b in range(blocks):
        first_step = starts[b]
        last = ends[b]
        split = min(length, first_step - depths[b] - low)
        far_len = 0
        far_low = low
        if split > 0 and last - first_step > 1:
            for j in range(split):
                far[j] = h[j]
            for j in range(length - split):  # ascending: the copy moves entries down
                h[j] = h[split + j]
            far_len = split
            length -= split
            low += split
        for i in range(first_step + 1, last + 1):
            length = _convolve_into(h, length, kernels[i - 1], widths[i - 1], spare, i - low)
            h, spare = spare, h
        if far_len > 0:
            moved_len = _convolve_into(far, far_len, block_kernels[b], block_widths[b], moved,
                                       first_step + 1 - far_low)
            offset = low - far_low
            total = max(moved_len, offset + length)
            for j in range(total):
                spare[j] = 0.0
            for j in range(moved_len):
                spare[j] = moved[j]
            for j in range(length):
                spare[offset + j] += h[j]
            h, spare = spare, h
            length = total
            low = far_low
        top = 0.0
        for j in range(length):
            if h[j] > top:
                top = h[j]
        if not top > 0.0:
            return h[:0].copy(), low, scales, False
        for j in range(length):
            h[j] /= top
        scales[b] = math.log(top)
        first = 0
        while first < length and not h[first] > negligible:
            first += 1
        if first:
            for j in range(length - first):
                h[j] = h[first + j]
            length -= first
            low += first
    return h[:length].copy(), low, scales, True


@functools.cache
def crossing():
    """The compiled :func:`_crossing`, or None where numba is not installed (the caller then
    runs the numpy reference). Compiles on the first call of the result (seconds; numba's
    on-disk cache makes later processes load it in milliseconds)."""
    global _convolve_into, _poisson_row, _forward  # _crossing calls them by these names
    try:
        import numba
    except ImportError:  # pragma: no cover - exercised where numba is missing
        return None
    try:
        numba.njit(cache=True)(_poisson_row)  # a probe: raises where no cache directory is writable
        cache = True
    except RuntimeError:  # then compile once per process instead
        cache = False
    jit = functools.partial(numba.njit, nogil=True, cache=cache)
    # Plain calls, not inline="always": inlined into the loop, the convolution ran 3x slower.
    _convolve_into = jit(_convolve_into)
    _poisson_row = jit(_poisson_row)
    _forward = jit(_forward)
    return jit(_crossing)


def available() -> bool:
    return crossing() is not None


def _below(e, slack):  # pragma: no cover - compiled
    """:func:`detector.trgof.statistic_at`'s selection on p = min(1, e + slack) [n] (e the
    per-token exp(-score), numpy's): of the I = ceil(n/2) smallest p, ascending, those with
    p_(i) < u_i = i/n. Returns (the log arguments [u..., p...] of those orders, the log1p
    arguments [-u..., -p...] (0 in place of -u at u = 1, whose term is 0), their orders i - 1)."""
    n = e.shape[0]
    count = (n + 1) // 2
    p = np.empty(n)
    for i in range(n):
        p[i] = min(1.0, e[i] + slack)
    p = np.sort(p)
    index = np.empty(count, dtype=np.int64)
    found = 0
    for i in range(count):
        if p[i] < (i + 1.0) / n:
            index[found] = i
            found += 1
    args = np.empty(2 * found)
    negated = np.empty(2 * found)
    for j in range(found):
        u = (index[j] + 1.0) / n
        args[j] = u
        args[found + j] = p[index[j]]
        negated[j] = -u if u < 1.0 else 0.0  # (unused at u = 1, n = 1: no ln 0 to warn of)
        negated[found + j] = -p[index[j]]
    return args, negated, index[:found]


def _best(args, logs, log1ps, index, n):  # pragma: no cover - compiled
    """(S, i, p_(i)) from :func:`_below`'s orders and numpy's logs of its arguments: n K(u, p)
    as :func:`detector.trgof._kl` computes it (u (ln u - ln p) + (1 - u) (ln(1 - u) -
    ln(1 - p)), the second term 0 at u = 1), its first largest value (np.argmax's)."""
    found = index.shape[0]
    best = -1
    top = 0.0
    for j in range(found):
        u = args[j]
        first = u * (logs[j] - logs[found + j])
        second = (1.0 - u) * (log1ps[j] - log1ps[found + j]) if u < 1.0 else 0.0
        value = n * (first + second)
        if best < 0 or value > top:
            best = j
            top = value
    if best < 0 or not top > 0.0:
        return 0.0, 0, 1.0
    return top, index[best] + 1, args[found + best]


@functools.cache
def _statistic_compiled():
    from watermark import jit

    return jit.compile_all({"_below": _below, "_best": _best})


def statistic_kernels():
    """The compiled :func:`_below` and :func:`_best` where this process has loaded numba
    (watermark.jit), else None."""
    from watermark import jit

    return _statistic_compiled() if jit.loaded() else None
