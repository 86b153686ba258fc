"""Span search: the screen never drops a window that passes, and windows are fixed."""

import math

import numpy as np
import pytest

from detector import spans, stats



def _without(monkeypatch, name: str) -> None:
    """spans with its compiled ``name`` unavailable (the Python path), the others as they are."""
    kernel = spans._kernel
    monkeypatch.setattr(spans, "_kernel", lambda wanted: None if wanted == name else kernel(wanted))

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


def _all_exact_merged(positions, scores, total, log10_threshold, log10_sf, min_length=32):
    """The reference: every window's exact p, every passing one merged (spans.merge)."""
    family = spans.windows(total, min_length)
    log10_m = spans.log10_multiplicities(family)
    sums, counts = _window_sums(positions, scores, total)  # prefix sums, as locate adds them
    hits = []
    for w, m, s, n in zip(family, log10_m, sums, counts):
        if n:
            p = min(0.0, float(log10_sf(float(s), int(n))) + float(m))
            if p <= log10_threshold:
                hits.append(spans.SpanHit(w.start, w.end, int(n), p))
    return spans.merge(hits)


@pytest.mark.parametrize("seed", range(8))
def test_windows_without_a_vectorised_tail_are_evaluated_lazily_with_the_same_spans(seed):
    # The weighted statistic's exact tail has no vectorised form and costs ~0.3 ms a window:
    # on a watermarked 1,000-token text every window passes the screen, and evaluating all
    # of them took 20 ms of a 23 ms detection. A window overlapping a span already kept
    # cannot be reported, so its exact p is never needed; the spans must not change.
    rng = np.random.default_rng(seed)
    total = 1000
    positions = np.sort(rng.choice(total, 900, replace=False))
    scores = 0.9 * rng.exponential(size=len(positions)) + 0.1 * rng.exponential(size=len(positions))
    start = int(rng.integers(0, 700))
    marked = (positions >= start) & (positions < start + int(rng.integers(64, 300)))
    scores[marked] *= 1.5 + 0.5 * (seed % 4)
    if seed % 2:
        scores *= 2.0  # the whole text marked: every window passes
    calls = []

    def sf(s, n):
        calls.append(n)
        return stats.weighted_gamma_log10_sf(s, n, 0.1)

    lower = lambda s, n: stats.weighted_gamma_log10_sf_lower(s, n, 0.1)  # noqa: E731
    for log10_threshold in (-3.0, -6.0, -12.0):
        calls.clear()
        hits = spans.locate(positions, scores, total, min_length=32, family_size_factor=1,
                            log10_threshold=log10_threshold, log10_sf=sf, log10_sf_lower=lower)
        evaluated = len(calls)
        assert hits == _all_exact_merged(positions, scores, total, log10_threshold, sf)
        screened = int(np.sum(lower(*_window_sums(positions, scores, total)) + spans.log10_multiplicities(
            spans.windows(total, 32)) <= log10_threshold))
        if seed % 2 and log10_threshold == -3.0:
            assert evaluated < screened / 2, (evaluated, screened)


def _window_sums(positions, scores, total):
    family = spans.windows(total, 32)
    prefix = np.concatenate(([0.0], np.cumsum(scores)))
    lo = np.searchsorted(positions, [w.start for w in family])
    hi = np.searchsorted(positions, [w.end for w in family])
    return prefix[hi] - prefix[lo], hi - lo


def test_refinement_leaves_out_unmarked_text_the_grid_window_straddles():
    """A 256-token grid window [128, 384) holds 64 human tokens, a 128-token generation and
    64 more human tokens; the 40 human tokens just before the generation happen to score 1.3
    on average. Cut halfway between the null mean and the window's mean (1.50: diluted by the
    human text), as refinement used to, they joined the span (start 152). Cut against the
    span's own mean they lower its significance and stay out."""
    scores = np.ones(512)
    scores[152:192] = 1.3
    scores[192:320] = np.tile([3.0, 0.8], 64)  # mean 1.9
    positions = np.arange(512)
    hit = spans.SpanHit(128, 384, 256, -10.0)
    assert float(scores[128:384].mean()) == pytest.approx(1.497, abs=1e-3)
    [refined] = spans.refine([hit], positions, scores, 512)
    assert (refined.start, refined.end) == (192, 319)  # the last 0.8 adds nothing
    assert refined.log10_p_value == hit.log10_p_value and refined.scored_tokens == 127
    # The first scored token's context (the w tokens it was sampled after) is part of it.
    [widened] = spans.refine([hit], positions, scores, 512, context_width=4)
    assert (widened.start, widened.end) == (188, 319)


def test_context_widening_never_reaches_into_the_previous_span():
    scores = np.ones(160)
    scores[8:44] = np.tile([3.0, 2.0], 18)
    scores[44:46] = 0.0  # two tokens between the spans: less than the context width
    scores[46:100] = np.tile([3.0, 2.0], 27)
    hits = [spans.SpanHit(0, 32, 32, -9.0), spans.SpanHit(56, 88, 32, -8.0)]
    refined = spans.refine(hits, np.arange(160), scores, 160, context_width=4)
    assert [(h.start, h.end) for h in refined] == [(4, 44), (44, 100)]


def test_compiled_scan_finds_the_same_stretch_as_the_reference():
    # refine's maximum-subarray scan, compiled where numba is loaded: the same sequential sums,
    # so the same stretch on every input, ties included (values on a 0.1 grid).
    pytest.importorskip("numba")
    from watermark import jit

    jit.load()
    kadane = spans._kernel("_kadane_loop")
    assert kadane is not None
    rng = np.random.default_rng(0)
    for trial in range(5000):
        n = int(rng.integers(0, 60))
        values = rng.exponential(1.0, n) if trial % 3 else np.round(rng.exponential(1.0, n), 1)
        cut = float(rng.uniform(0.5, 2.0)) if trial % 5 else 1.0
        first, last = kadane(values, cut)
        assert spans._max_subarray(values, cut, 0) == ((first, last) if last > 0 else None)


def test_compiled_window_sums_are_the_numpy_steps():
    # _screen's window sums and counts, compiled where numba is loaded: the same prefix sums.
    pytest.importorskip("numba")
    from watermark import jit

    jit.load()
    sums_of = spans._kernel("_window_sums")
    assert sums_of is not None
    rng = np.random.default_rng(5)
    for total in (16, 37, 200, 1000):
        positions = np.flatnonzero(rng.random(total) < 0.8)
        scores = rng.exponential(1.0, len(positions))
        starts, ends, _ = spans._grid(total, 8, 1)
        prefix = np.concatenate(([0.0], np.cumsum(scores)))
        lo, hi = np.searchsorted(positions, starts), np.searchsorted(positions, ends)
        sums, counts = sums_of(positions, scores, starts, ends)
        assert np.array_equal(counts, hi - lo) and np.array_equal(sums, prefix[hi] - prefix[lo])


@pytest.mark.parametrize("weighted", [False, True])
def test_compiled_screen_is_the_numpy_screen(weighted):
    # _screen in one compiled pass (lower_kind given): the same sums, counts and live windows,
    # the bounds within an ulp or so of numpy's (libm's log in place of numpy's).
    pytest.importorskip("numba")
    from watermark import jit

    jit.load()
    alpha = 0.1
    lower = ((lambda s, n: stats.weighted_gamma_log10_sf_lower(s, n, alpha)) if weighted
             else stats.gamma_log10_sf_lower)
    kind = spans.LowerKind(weighted, alpha)
    rng = np.random.default_rng(11)
    for total in (16, 64, 200, 1000):
        for boost in (1.0, 1.5, 3.0):
            positions = np.flatnonzero(rng.random(total) < 0.8)
            scores = rng.exponential(1.0, len(positions)) * boost
            for threshold in (-2.0, -6.0, -20.0):
                args = dict(min_length=8, family_size_factor=3, log10_threshold=threshold, log10_sf_lower=lower)
                ref = spans._screen(positions, scores, total, **args)
                got = spans._screen(positions, scores, total, lower_kind=kind, **args)
                for a, b in zip(ref[:6], got[:6]):
                    assert np.array_equal(a, b)
                assert np.allclose(ref[6], got[6], rtol=1e-13, atol=1e-13)
                assert spans.lower_bound(positions, scores, total, **args) == pytest.approx(
                    spans.lower_bound(positions, scores, total, lower_kind=kind, **args), rel=1e-13, abs=1e-13)


def test_compiled_numpy_sum_is_numpys_sum_bit_for_bit():
    pytest.importorskip("numba")
    from watermark import jit

    jit.load()
    spans._kernel("_refine_hits")
    numpy_sum = spans._compiled()["_numpy_sum"]
    rng = np.random.default_rng(14)
    for trial in range(3000):
        n = int(rng.integers(1, 400)) if trial % 10 else int(rng.integers(1, 20000))
        values = rng.exponential(1.0, n + 10) * 10.0 ** int(rng.integers(-3, 4))
        start = int(rng.integers(0, 10))
        assert 0.0 + numpy_sum(values, start, n) == np.add.reduce(values[start:start + n])


@pytest.mark.parametrize("seed", range(4))
def test_compiled_refine_is_the_python_loop(seed, monkeypatch):
    pytest.importorskip("numba")
    from watermark import jit

    jit.load()
    rng = np.random.default_rng(seed)
    total = 600
    positions = np.sort(rng.choice(total, 500, replace=False))
    scores = rng.exponential(1.0, len(positions))
    scores[100:260] *= 1.0 + seed
    hits = [spans.SpanHit(s, s + length, 0, -3.0) for length in (32, 64, 128)
            for s in range(0, total - length + 1, length // 2)]
    hits.append(spans.SpanHit(598, 600, 0, -3.0))  # no scored token inside: kept as it is
    assert spans._kernel("_refine_hits") is not None

    def every():
        return ([spans.refine([h], positions, scores, total, context_width=w) for h in hits for w in (0, 4)],
                spans.refine(hits, positions, scores, total, context_width=4))

    compiled = every()
    _without(monkeypatch, "_refine_hits")
    assert compiled == every()


@pytest.mark.parametrize("seed", range(6))
def test_compiled_merge_is_the_python_merge(seed, monkeypatch):
    # locate with a vectorised tail: its hits and their merge in one compiled pass where numba
    # is loaded, the same spans and p-values as the Python loop and merge.
    pytest.importorskip("numba")
    from watermark import jit

    jit.load()
    assert spans._kernel("_merge_windows") is not None
    rng = np.random.default_rng(100 + seed)
    total = int(rng.integers(64, 1500))
    positions = np.sort(rng.choice(total, int(total * 0.9), replace=False))
    scores = rng.exponential(1.0, len(positions))
    for _ in range(3):
        start = int(rng.integers(0, len(positions) - 20))
        scores[start:start + int(rng.integers(10, 200))] *= float(rng.uniform(1.2, 4.0))
    scores[:8] = np.round(scores[:8])  # equal windows: ties keep the window order

    def found():
        return [spans.locate(positions, scores, total, min_length=m, family_size_factor=f, log10_threshold=t,
                             log10_sf=stats.gamma_log10_sf, log10_sf_lower=stats.gamma_log10_sf_lower,
                             log10_sf_many=stats.gamma_log10_sf_many, lower_kind=spans.LowerKind(False))
                for m in (8, 32) for f in (1, 7) for t in (-1.0, -4.0, -12.0)]

    compiled = found()
    _without(monkeypatch, "_merge_windows")
    assert compiled == found()
