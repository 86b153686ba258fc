"""Tr-GoF's exact-tail recursion, compiled (numba): the forward loop of
:func:`detector.trgof._crossing_exact`, which keeps its numpy reference beside it.

Same recursion, same blocks, same truncations as the reference (Noe 1972, Poissonised,
one-sided; see :mod:`detector.trgof`): per step, h is convolved with the step's Poisson
kernel and the counts above the boundary are dropped; per block, the counts far below the
boundary move with the block's combined kernel (ending at most at the block's first
boundary), h is rescaled to a maximum of 1 and its low end below _NEGLIGIBLE is dropped.
One difference, conservative: each step's kernel stops at its own last term above
_NEGLIGIBLE of its maximum (the reference carries every row to the widest row's width,
tails that it keeps only because numpy's call costs the same either way). Dropping a
term of a positive sum only lowers the non-crossing probability, so the p-value can only
rise; the float error (summation order) is of the order of 1e-16 relative, far inside
FLOAT_ALLOWANCE (tested against the reference and the 80-bit recursion).

Why compiled: the reference makes ~I/2 sequential small convolutions (~500 at n = 1,000),
each a numpy call with its fixed overhead; in one compiled loop they cost ~0.1 ms.

numba is imported on the first exact tail (:func:`forward`), not with the detector, so
that the CLI does not pay for it; the service compiles it at start
(:func:`detector.trgof.warm_up`).
Without numba the numpy reference runs.
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
def forward():
    """The compiled :func:`_forward`, or None where numba is not installed (the caller then
    runs the numpy reference). Compiles on the first call of the result (about a second;
    numba's on-disk cache makes later processes load it in milliseconds)."""
    global _convolve_into  # _forward calls it by this name: the compiled helper replaces it
    try:
        import numba
    except ImportError:  # pragma: no cover - exercised where numba is missing
        return None
    jit = functools.partial(numba.njit, nogil=True)
    try:
        convolve = jit(cache=True)(_convolve_into)
        compiled = jit(cache=True)(_forward)
    except RuntimeError:  # no writable cache directory: compile per process instead
        convolve = jit()(_convolve_into)
        compiled = jit()(_forward)
    _convolve_into = convolve
    return compiled


def available() -> bool:
    return forward() is not None
