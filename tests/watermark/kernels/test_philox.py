"""Exhaustive checks of the arithmetic facts the kernels rely on (CPU, no Triton needed)."""

from __future__ import annotations

import numpy as np

from watermark import noise as gumbel_noise
from watermark.prf import philox

MANTISSAS = np.arange(2**24, dtype=np.int64)


def _reference_uniforms() -> np.ndarray:
    return philox.uniforms_from_words_numpy((MANTISSAS.astype(np.uint64) << np.uint64(8)))


def test_uniform_is_next_float_below_the_grid_point():
    """float32(((m + 1)) / (2^24 + 1)) == nextafter((m + 1) 2^-24, 0) for every m < 2^24:
    the kernels build the uniform from integers (bits of (m + 1) 2^-24, minus one)."""
    grid = (MANTISSAS + 1).astype(np.float32) * np.float32(2.0**-24)  # exact: m + 1 <= 2^24
    below = (grid.view(np.int32) - 1).view(np.float32)
    reference = _reference_uniforms()
    assert np.array_equal(below.view(np.int32), reference.view(np.int32))
    assert np.array_equal(below, np.nextafter(grid, np.float32(0)))


def test_one_minus_u_is_exact_near_one():
    """For u >= 1/2, d = 1 - u == (2^24 - m) 2^-24 exactly (the kernels' series branch)."""
    upper = MANTISSAS[MANTISSAS >= 2**23]
    u = _reference_uniforms()[upper].astype(np.float64)
    d = (2**24 - upper).astype(np.float64) * 2.0**-24
    assert np.array_equal(1.0 - u, d)


def test_pruning_bounds_hold_for_every_uniform():
    """Every exact noise is <= NOISE_MAX and every exponential >= EXPONENTIAL_MIN (the
    kernels' exact pruning), with room for a last-ulp float64 log difference."""
    u = _reference_uniforms()
    noise = gumbel_noise.noise_from_uniforms_numpy(u)
    expo = gumbel_noise.exponentials_from_uniforms_numpy(u)
    assert noise.max() <= np.float32(gumbel_noise.NOISE_MAX)
    assert expo.min() >= np.float32(gumbel_noise.EXPONENTIAL_MIN)
    assert noise.min() >= np.float32(gumbel_noise.NOISE_MIN)
