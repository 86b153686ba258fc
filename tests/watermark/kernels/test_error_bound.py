"""The stage-1 approximation error, measured on the device over all 2^24 uniforms."""

from __future__ import annotations

import pytest


@pytest.mark.gpu
def test_approximation_error_is_within_the_bounds_the_window_assumes(cuda):
    from watermark.kernels import approximation, error_bound

    measured = error_bound.measure_approximation_error(cuda)
    # The candidate window is 4x the bound; the bound itself must hold with room to spare.
    assert measured["noise_max_abs_error"] <= approximation.NOISE_ERROR_BOUND, measured
    assert measured["ratio_max_rel_error"] <= approximation.RATIO_ERROR_BOUND, measured
