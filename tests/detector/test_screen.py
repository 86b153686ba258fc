"""The screen's bounds hold: chord sums bracket the detector's float score sums, the Tr-GoF
bound is at least the detector's statistic, the lower bound on Tr-GoF's tail is at most the
tail the detector reports, and the per-key bounds of screened keys are upper bounds."""

from __future__ import annotations

import math
import secrets

import numpy as np
import pytest

from detector import screen, scoring, stats, trgof
from tests import synthetic
from watermark import keyscan, keyscan_cpu
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec


@pytest.fixture
def seed(request) -> int:
    value = secrets.randbits(31)
    request.node.user_properties.append(("seed", value))
    return value


def test_chords_bound_every_score_from_above_within_their_gap():
    r = np.unique(np.concatenate([np.arange(1, 5000), np.arange(2**23 - 3000, 2**23 + 3000), 2**24 - np.arange(3000),
                                  np.random.default_rng(0).integers(1, 2**24 + 1, 200_000)])).astype(np.int64)
    # The uniform each r stands for (r = 2^24 - mantissa) and the detector's own scores of it.
    u = ((2**24 - r + 1) / (2**24 + 1)).astype(np.float32).astype(np.float64)
    single = -np.log1p(-u)
    maximum = -np.log1p(-u) - np.log1p(u)
    chords = screen.chords()
    for form, score in enumerate((single, maximum)):
        bound = keyscan.chord_bound(chords.table[form], r) / screen.ONE
        assert (bound >= score).all()
        assert (bound - score).max() <= chords.gap[form]
    assert max(chords.gap) < 5e-5


def _keys(rng, count, spec):
    return [WatermarkKey(int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2)), spec) for _ in range(count)]


@pytest.mark.parametrize("spec", [WatermarkSpec(), WatermarkSpec(algorithm="dual_key_gumbel", alpha=0.3),
                                  WatermarkSpec(algorithm="dual_key_gumbel", context_width=6, dedup="all")])
def test_scan_statistics_bound_the_detectors_statistics(spec, seed):
    rng = np.random.default_rng(seed)
    dual = spec.algorithm == "dual_key_gumbel"
    keys = _keys(rng, 6, spec)
    texts = [synthetic.generate(keys[0], 300, seed=seed % 1000, scale=2.0)[0], rng.integers(0, 4, 200),
             rng.integers(0, 50000, 700), synthetic.human_like(400, seed=seed % 997)]
    for text in texts:
        scored = scoring.scored_positions(np.asarray(text), spec.context_width, spec.dedup)
        n = len(scored.tokens)
        for form in (["single"] if not dual else ["max", "sidak"]):
            tables = screen.scan_tables(form, spec.alpha, n)
            keys_a = np.array([k.key_a if dual else k.secret for k in keys], dtype=np.uint64)
            keys_b = np.array([k.key_b for k in keys], dtype=np.uint64) if dual else None
            stat = keyscan_cpu.scan_stats(keys_a, keys_b, scored.contexts, scored.tokens, np.array([0, n]), tables)[0]
            for k, key in enumerate(keys):
                if dual:
                    parts = scoring.dual_scores(key, scored)
                    u_a, u_b = scoring.uniforms_many([(key.key_a, None), (key.key_b, None)], scored)
                    sums = {keyscan.SUM_A: (scoring.exp_scores(u_a).sum(), 0),
                            keyscan.SUM_B: (scoring.exp_scores(u_b).sum(), 0), keyscan.SUM_MAX: (parts.max.sum(), 1)}
                    gof_scores = parts.max if form == "max" else parts.weighted_sidak
                    weighted_lo, weighted_hi = screen.score_bounds(stat[k:k + 1, keyscan.SUM_A], n, screen.chords().gap[0])
                else:
                    per_token = scoring.token_scores(key, scored, "single")
                    sums = {keyscan.SUM_A: (per_token.sum(), 0)}
                    gof_scores = per_token
                for column, (exact, gap) in sums.items():
                    lo, hi = screen.score_bounds(stat[k:k + 1, column], n, screen.chords().gap[gap])
                    assert lo[0] <= exact <= hi[0], (seed, form, column)
                statistic = trgof.statistic(trgof.token_pvalues(gof_scores))
                assert screen.gof_upper(stat[k:k + 1, keyscan.GOF])[0] >= statistic, (seed, form)


def test_the_tr_gof_lower_bound_is_below_the_tail_the_detector_reports():
    for n in (1, 2, 7, 50, 300, 1000, 4000):
        for s in (0.5, 2.0, 5.0, 12.0, 30.0, 80.0, 300.0):
            lower = screen.log10_trgof_lower(s, n)
            assert lower <= trgof.log10_sf(s, n) + 1e-12, (n, s)
            # ... and at least the binomial bound the detector screens with, where both apply
            threshold = screen.trgof_statistic_at_most(lower, n)
            assert threshold <= s * (1 + 1e-5) + 1e-5, (n, s, threshold)


@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_chernoff_bounds_are_upper_bounds(alpha):
    for n in (1, 10, 200, 2000):
        scores = np.array([0.1, n * 0.5, n * 1.0, n * 1.2, n * 2.0 + 5, n * 4.0 + 30])
        gamma = screen.log10_gamma_upper_chernoff(scores, n)
        weighted = screen.log10_weighted_upper_chernoff(scores, n, alpha)
        for score, g, w in zip(scores, gamma, weighted):
            assert g >= stats.gamma_log10_sf(float(score), n) - 1e-9
            assert w >= stats.weighted_gamma_log10_sf(float(score), n, alpha) - 1e-9
        assert gamma[-1] < 0 and (alpha in (0.0, 1.0) or weighted[-1] < 0)  # they are not vacuous


def test_levels_count_the_thresholds_a_p_value_can_reach():
    taus = screen.thresholds()
    assert (np.diff(taus) < 0).all() and taus[0] == 0.5 and taus[-1] > screen.P_FLOOR
    assert len(taus) <= keyscan.LEVELS - 2
    levels = screen.level_tables("single")[0]
    exponent, start, _ = screen._bucket_edges(keyscan.LEVEL_BITS)
    # A bucket of r whose smallest p-value lies at or below tau_j counts at least j levels.
    d = screen._d_lower(start, exponent)
    p = np.minimum(1.0, d + screen.P_FLOOR)
    reach = np.searchsorted(-taus, -p, side="right")
    assert (levels >= reach).all()
    assert math.isclose(float((levels == 0).mean()), 0.5, abs_tol=0.02) or levels.min() == 0
