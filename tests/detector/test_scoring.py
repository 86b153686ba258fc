"""Per-token scores: the weighted Šidák score's exact null (body and far tail, by importance
sampling), the routed weights' predictability, and routed's power on speculative text."""

import math

import numpy as np
import pytest

from detector import scoring, stats
from detector.detect import DetectorConfig, detect
from detector.result import Candidate
from tests.stats_helpers import binomial_two_sided_p
from tests.synthetic import generate_speculative
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec


def _routed(u_a, u_b, coin):
    return scoring.weighted_max_scores(u_a, u_b, scoring.routed_weights(u_a, u_b, coin))


def test_weight_one_half_is_the_max_statistic():
    rng = np.random.default_rng(1)
    u_a, u_b = rng.random(10_000).astype(np.float32), rng.random(10_000).astype(np.float32)
    np.testing.assert_allclose(scoring.weighted_max_scores(u_a, u_b, 0.5), scoring.max_scores(u_a, u_b),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("w", [0.05, 0.3, 0.5, 0.8, 0.95])
@pytest.mark.parametrize("s", [0.5, 3.0, 10.0, 16.0])  # 16.6: the largest score on the 24-bit grid
def test_weighted_score_tail_is_exactly_exponential(w, s):
    # {score > s} must be {p_A < x_A} U {p_B < x_B} (checked on random points), whose area
    # x_A + x_B - x_A x_B must be e^-s: found by bisection on the production function alone.
    def score(p_a, p_b):
        return float(scoring.weighted_max_scores(np.array([1.0 - p_a]), np.array([1.0 - p_b]), w)[0])

    def edge(f):  # the largest p with f(p) > s (f decreases in p)
        lo, hi = 0.0, 1.0
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) > s else (lo, mid)
        return lo

    x_a, x_b = edge(lambda p: score(p, 1.0)), edge(lambda p: score(1.0, p))
    area = x_a + x_b - x_a * x_b
    # 4e-16: p enters as u = 1 - p in float64, which rounds p by up to 1.1e-16 per edge.
    assert abs(area - math.exp(-s)) <= 1e-9 * math.exp(-s) + 4e-16
    rng = np.random.default_rng(int(s * 100 + w * 1000))
    for p_a, p_b in zip(rng.random(300) * 3 * x_a, rng.random(300) * 3 * x_b):
        assert (score(p_a, p_b) > s) == (p_a < x_a or p_b < x_b)


def test_routed_weights_use_earlier_tokens_only():
    rng = np.random.default_rng(2)
    u_a, u_b, coin = (rng.random(300) for _ in range(3))
    u_a[:150] = 1 - 1e-4 * rng.random(150)  # strong key-A signal: the weights move
    base = scoring.routed_weights(u_a, u_b, coin)
    assert base[0] == 0.5 and base[-1] > 0.8
    for i in (0, 10, 149, 299):
        # w_i may use its own coin c_i (independent of u_A, u_B under the null), nothing later.
        changed = [v.copy() for v in (u_a, u_b, coin)]
        changed[0][i:], changed[1][i:] = rng.random(300 - i), rng.random(300 - i)
        changed[2][i + 1:] = rng.random(299 - i)
        after = scoring.routed_weights(*changed)
        np.testing.assert_array_equal(after[: i + 1], base[: i + 1])


@pytest.mark.statistical
def test_routed_sum_null_is_gamma_in_the_body():
    rng = np.random.default_rng(3)
    texts, n = 4000, 200
    log_p = np.array([stats.log_gamma_sf(float(_routed(*(rng.random(n) for _ in range(3))).sum()), n)
                      for _ in range(texts)])
    for level in (0.01, 0.05, 0.5):
        hits = int(np.sum(log_p <= math.log(level)))
        assert binomial_two_sided_p(hits, texts, level) > 1e-3, (level, hits)


@pytest.mark.statistical
@pytest.mark.parametrize("target_log10", [-8.0, -12.0])
def test_routed_sum_far_tail_matches_gamma_by_importance_sampling(target_log10):
    # P(S >= q) for the routed sum of n tokens, q the Gamma(n, 1) quantile at 1e-8 / 1e-12.
    # Proposal per token: one key's p (A or B, each half the time) ~ Beta(beta, 1), density
    # beta p^(beta - 1), the other uniform; each text weighs prod 1 / density. The routed
    # weights see the proposal's strong tokens and move, so this also checks that adapting
    # keeps the null exact. (p below 1e-15 is clipped: u = 1 - p must stay below 1; that
    # region's null mass, under 1e-13 per text, is far below the tolerance.)
    n, samples, beta = 24, 50_000, 0.3
    lo, hi = float(n), 20.0 * n
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if stats.gamma_log10_sf(mid, n) > target_log10 else (lo, mid)
    q = hi
    rng = np.random.default_rng(4 + int(-target_log10))
    tilted = np.maximum(rng.random((samples, n)) ** (1 / beta), 1e-15)
    plain = rng.random((samples, n))
    which = rng.random((samples, n)) < 0.5
    p_a, p_b = np.where(which, tilted, plain), np.where(which, plain, tilted)
    coin = rng.random((samples, n))
    log_w = -np.log(0.5 * beta * (p_a ** (beta - 1) + p_b ** (beta - 1))).sum(axis=1)
    totals = np.array([_routed(1 - p_a[i], 1 - p_b[i], coin[i]).sum() for i in range(samples)])
    terms = np.where(totals >= q, np.exp(log_w - target_log10 * math.log(10)), 0.0)  # in units of 10^target
    estimate, se = terms.mean(), terms.std() / math.sqrt(samples)
    assert se < 0.05 * estimate  # the proposal reaches the tail (about 2 % here)
    assert abs(estimate - 10 ** (stats.gamma_log10_sf(q, n) - target_log10)) < 4 * se


@pytest.mark.statistical
def test_routed_is_stronger_than_max_on_speculative_text():
    # A poor draft (acceptance well below 1/2): the acceptance coin tells key A from key B
    # only partly, which the old coin < 1/2 rule got wrong; the learnt weights may not lose.
    config = {s: DetectorConfig(dual_statistic=s, spans=False, test="sum") for s in ("max", "routed")}
    gains = []
    for i in range(8):
        key = WatermarkKey(9000 + i, WatermarkSpec(algorithm="dual_key_gumbel", coin="keyed"))
        tokens, _ = generate_speculative(key, 150, seed=i, draft_noise=2.0, scale=3.0)
        p = {s: detect(tokens, [Candidate.inline(key)], c).log10_p_value for s, c in config.items()}
        gains.append(p["max"] - p["routed"])
    assert np.mean(gains) > 0 and np.median(gains) > 0, gains


def test_dual_scores_match_the_single_statistics():
    from detector.scoring import dual_scores, scored_positions, token_scores, uniforms_many, weighted_max_scores
    key = WatermarkKey(5150, WatermarkSpec(algorithm="dual_key_gumbel", alpha=0.2))
    tokens = np.random.default_rng(2).integers(0, 5000, 300)
    scored = scored_positions(tokens, key.spec.context_width, key.spec.dedup)
    parts = dual_scores(key, scored)
    assert np.array_equal(parts.max, token_scores(key, scored, "max"))
    assert np.array_equal(parts.weighted, token_scores(key, scored, "weighted"))
    u_a, u_b = uniforms_many([(key.key_a, None), (key.key_b, None)], scored)
    assert np.array_equal(parts.weighted_sidak, weighted_max_scores(u_a, u_b, 0.8))


def test_compiled_sidak_terms_give_the_same_scores_bit_for_bit():
    # weighted_max_scores at a scalar w runs one compiled pass where numba is loaded; the
    # scores must be the numpy steps' own bits (no transcendental in the pass).
    pytest.importorskip("numba")
    from watermark import jit

    rng = np.random.default_rng(11)
    u_a = (rng.integers(0, 1 << 24, 5000) / float(1 << 24)).astype(np.float32)
    u_b = (rng.integers(0, 1 << 24, 5000) / float(1 << 24)).astype(np.float32)
    u_a[:3], u_b[:3] = 0.0, np.float32(1.0 - 2.0 ** -24)  # the grid's ends
    jit.load()
    assert scoring._sidak_terms_kernel() is not None
    for w in (0.05, 0.5, 0.8, 0.9, 0.999):
        # w per position (the routed statistic's form) takes the numpy steps.
        numpy_steps = scoring.weighted_max_scores(u_a, u_b, np.full(len(u_a), w))
        assert np.array_equal(scoring.weighted_max_scores(u_a, u_b, w), numpy_steps)


def test_fused_dual_scores_are_the_numpy_steps_bit_for_bit():
    # dual_scores where numba is loaded: one compiled layout, numpy's log1p and log, one
    # compiled combination; the three arrays must be the unfused numpy expressions' bits.
    pytest.importorskip("numba")
    from watermark import jit

    jit.load()
    kernels = scoring._dual_kernels()
    assert kernels is not None
    rng = np.random.default_rng(12)
    for n in (1, 7, 200, 5000):
        u_a = (rng.integers(0, 1 << 24, n) / float(1 << 24)).astype(np.float32)
        u_b = (rng.integers(0, 1 << 24, n) / float(1 << 24)).astype(np.float32)
        u_a[:1], u_b[:1] = 0.0, np.float32(1.0 - 2.0 ** -24)  # the grid's ends
        for alpha in (0.0, 0.1, 0.5, 0.9, 1.0):
            w = min(max(1.0 - alpha, 1e-3), 1.0 - 1e-3)
            fused = scoring._dual_scores_fused(u_a, u_b, alpha, w, kernels)
            assert np.array_equal(fused.max, scoring.max_scores(u_a, u_b))
            assert np.array_equal(fused.weighted, (1.0 - alpha) * scoring.exp_scores(u_a)
                                  + alpha * scoring.exp_scores(u_b))
            assert np.array_equal(fused.weighted_sidak,
                                  scoring.weighted_max_scores(u_a, u_b, np.full(n, w)))
