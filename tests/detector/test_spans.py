"""Span search: the screen never drops a window that passes, and windows are fixed."""

import math

import numpy as np
import pytest

from detector import spans, stats


def _brute_force(positions, scores, total, log10_threshold, log10_sf, min_length=32):
    family = spans.windows(total, min_length)
    lengths = [w.end - w.start for w in family]
    out = []
    for w in family:
        inside = (positions >= w.start) & (positions < w.end)
        n = int(inside.sum())
        log10_m = math.log10(len(set(lengths)) * lengths.count(w.end - w.start))
        if n and min(0.0, log10_sf(float(scores[inside].sum()), n) + log10_m) <= log10_threshold:
            out.append(w)
    return out


@pytest.mark.parametrize("statistic", ["gamma", "weighted"])
@pytest.mark.parametrize("seed", range(6))
def test_screen_keeps_every_passing_window(statistic, seed):
    rng = np.random.default_rng(seed)
    total = 700
    positions = np.sort(rng.choice(total, 640, replace=False))
    if statistic == "gamma":
        scores = rng.exponential(size=len(positions))
        sf, lower = stats.gamma_log10_sf, stats.gamma_log10_sf_lower
    else:
        scores = 0.9 * rng.exponential(size=len(positions)) + 0.1 * rng.exponential(size=len(positions))
        sf = lambda s, n: stats.weighted_gamma_log10_sf(s, n, 0.1)  # noqa: E731
        lower = lambda s, n: stats.weighted_gamma_log10_sf_lower(s, n, 0.1)  # noqa: E731
    start = int(rng.integers(0, 500))
    boost = (positions >= start) & (positions < start + 150)
    scores[boost] *= 1.0 + 0.2 * seed  # a stretch from barely to clearly significant
    for log10_threshold in (-3.0, -6.0, -9.0):
        expected = _brute_force(positions, scores, total, log10_threshold, sf)
        hits = spans.locate(positions, scores, total, min_length=32, family_size_factor=1,
                            log10_threshold=log10_threshold, log10_sf=sf, log10_sf_lower=lower)
        # locate merges to disjoint spans: every passing window overlaps a reported one.
        assert bool(hits) == bool(expected)
        for w in expected:
            assert any(h.start < w.end and w.start < h.end for h in hits)


@pytest.mark.parametrize("total", [64, 100, 1000, 5000])
def test_window_weights_sum_to_one(total):
    family = spans.windows(total, 32)
    weights = 10.0 ** -spans.log10_multiplicities(family)
    assert math.isclose(float(weights.sum()), 1.0, rel_tol=1e-12)
    assert math.isclose(float((10.0 ** -spans.log10_multiplicities(family, 3)).sum()), 1 / 3, rel_tol=1e-12)


def test_windows_depend_on_length_only():
    family = spans.windows(1000, 32)
    assert family == spans.windows(1000, 32)
    assert all(0 <= w.start < w.end <= 1000 for w in family)
    assert {w.end - w.start for w in family} == {32, 64, 128, 256, 512}
