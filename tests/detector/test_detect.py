"""Detection end to end: vLLM's golden text, synthetic watermarked text, null calibration,
multi-key attribution and localisation."""

import math
import zlib

import numpy as np
import pytest

from detector import scoring, stats
from detector.detect import DetectorConfig, detect
from detector.result import Candidate, KeyInfo
from tests.stats_helpers import binomial_two_sided_p
from tests.synthetic import generate, generate_speculative, human_like
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

SCHEMA_KEYS = {"watermarked", "p_value", "log10_p_value", "threshold", "scored_tokens", "total_tokens",
               "key", "keys_tested", "tests", "per_key", "spans", "ledger_matches", "basis", "correction"}


def _golden_key(seq, **overrides):
    algorithm = "dual_key_gumbel" if seq["mode"] == "dual" else "gumbel"
    spec = WatermarkSpec(algorithm=algorithm, alpha=seq["alpha"] if seq["alpha"] is not None else 0.1,
                         context_width=seq["context_width"], dedup=seq["dedup"], **overrides)
    return WatermarkKey(int(seq["key"]), spec)


@pytest.mark.parametrize("statistic", ["max", "weighted"])
def test_vllm_text_detected_under_its_key_only(vllm_sequences, statistic):
    sequences = vllm_sequences["sequences"]
    config = DetectorConfig(dual_statistic=statistic)
    for seq in sequences:
        result = detect(seq["output_token_ids"], [Candidate.inline(_golden_key(seq))], config)
        assert set(result.to_dict()) == SCHEMA_KEYS
        if seq["mode"] == "none":
            assert not result.watermarked and result.log10_p_value > -4
        else:
            assert result.watermarked and result.log10_p_value < -50, seq["key"]
        others = [s for s in sequences if s["key"] != seq["key"]][:5]
        for other in others:
            wrong = detect(seq["output_token_ids"], [Candidate.inline(_golden_key(other))], config)
            assert not wrong.watermarked and wrong.log10_p_value > -4


def test_p_value_never_underflows_for_long_text():
    key = WatermarkKey(77, WatermarkSpec())
    tokens, _ = generate(key, 2500, scale=3.0, seed=1)
    result = detect(tokens, [Candidate.inline(key)], DetectorConfig(spans=False))
    assert result.p_value == 0.0 and result.log10_p_value < -400 and math.isfinite(result.log10_p_value)
    assert result.to_dict()["log10_p_value"] == result.log10_p_value


@pytest.mark.parametrize("spec_kwargs", [
    {}, {"context_width": 1}, {"context_width": 16}, {"dedup": "all"}, {"dedup": "none"},
    {"algorithm": "dual_key_gumbel"}, {"algorithm": "dual_key_gumbel", "alpha": 0.5, "dedup_max_history": None},
])
def test_synthetic_text_is_detected(spec_kwargs):
    key = WatermarkKey(2**64 - 99, WatermarkSpec(**spec_kwargs))
    tokens, _ = generate(key, 150, scale=2.0, seed=3)
    result = detect(tokens, [Candidate.inline(key)])
    assert result.watermarked and result.log10_p_value < -6
    other = detect(tokens, [Candidate.inline(WatermarkKey(12345, key.spec))])
    assert not other.watermarked


@pytest.mark.parametrize("coin,statistic", [("ordinary", "max"), ("ordinary", "weighted"), ("keyed", "routed"),
                                            ("keyed", "max")])
def test_speculative_text_is_detected(coin, statistic):
    key = WatermarkKey(424242, WatermarkSpec(algorithm="dual_key_gumbel", coin=coin))
    tokens, routes = generate_speculative(key, 200, seed=5)
    result = detect(tokens, [Candidate.inline(key)], DetectorConfig(dual_statistic=statistic))
    assert result.watermarked, result.log10_p_value


def test_auto_statistic_follows_the_coin():
    # Keyed coin: the detector can learn the routing, so auto scores with routed alone.
    keyed = WatermarkKey(424242, WatermarkSpec(algorithm="dual_key_gumbel", coin="keyed"))
    tokens, _ = generate_speculative(keyed, 200, seed=5)
    result = detect(tokens, [Candidate.inline(keyed)])
    assert result.watermarked and result.per_key[0].statistic == "routed"
    assert "weighted 0." not in result.correction and result.per_key[0].log10_p_weighted is None
    # Ordinary coin: the key-B share is unknown, so auto tests max and weighted.
    plain = WatermarkKey(424242, WatermarkSpec(algorithm="dual_key_gumbel"))
    tokens, _ = generate_speculative(plain, 200, seed=5)
    result = detect(tokens, [Candidate.inline(plain)])
    assert result.watermarked and result.per_key[0].statistic == "max"
    assert "max 0.19, weighted 0.57" in result.correction and "sum" not in result.correction
    # Each whole-text test's own p is reported; the key's p is the best of them over its weight.
    key = result.per_key[0]
    assert key.log10_p_weighted == pytest.approx(
        stats.weighted_gamma_log10_sf(float(scoring.dual_scores(plain, scoring.scored_positions(
            tokens, plain.spec.context_width, plain.spec.dedup)).weighted.sum()), key.scored_tokens, plain.spec.alpha))
    assert key.log10_p_value == pytest.approx(min(key.log10_p_sum - math.log10(0.19), key.log10_p_weighted - math.log10(0.57),
                                                  key.log10_p_trgof - math.log10(0.19)))


NULL_TEXTS = 3000


@pytest.mark.statistical
@pytest.mark.parametrize("algorithm,statistic,coin", [
    ("gumbel", "auto", "ordinary"), ("dual_key_gumbel", "max", "ordinary"),
    ("dual_key_gumbel", "weighted", "ordinary"), ("dual_key_gumbel", "routed", "keyed"),
])
@pytest.mark.parametrize("source", ["uniform", "human_like"])
def test_null_calibration(algorithm, statistic, coin, source):
    # A fixed seed per case (str hashes vary per process: PYTHONHASHSEED).
    rng = np.random.default_rng(zlib.crc32(f"{algorithm}/{statistic}/{source}".encode()))
    # The sum test alone: its p is exactly uniform. (The default combination is checked for
    # validity, P(p <= t) <= t, in test_trgof.py.)
    config = DetectorConfig(dual_statistic=statistic, spans=False, test="sum")
    small = 0
    p_values = []
    for i in range(NULL_TEXTS):
        key = WatermarkKey(int(rng.integers(0, 2**63)), WatermarkSpec(algorithm=algorithm, coin=coin))
        length = int(rng.integers(20, 300))
        if source == "uniform":
            tokens = rng.integers(0, 5000, length)
        else:
            tokens = human_like(length, seed=int(rng.integers(0, 2**31)))
        p = detect(tokens, [Candidate.inline(key)], config).p_value
        p_values.append(p)
        small += p < 0.01
    assert binomial_two_sided_p(small, NULL_TEXTS, 0.01) > 1e-3
    assert binomial_two_sided_p(int(np.sum(np.array(p_values) < 0.2)), NULL_TEXTS, 0.2) > 1e-3


def test_many_keys_report_the_source_with_error_control():
    history = [WatermarkKey(1000 + i, WatermarkSpec()) for i in range(3)]
    candidates = [Candidate(k, KeyInfo("acme", f"key-{i}", i + 1, state, k.fingerprint, "gumbel"))
                  for i, (k, state) in enumerate(zip(history, ["verify-only", "revoked", "active"]))]
    tokens, _ = generate(history[1], 120, seed=9)
    result = detect(tokens, candidates)
    assert result.watermarked and result.keys_tested == 3
    assert result.key.key_id == "key-1" and result.key.state == "revoked"
    best = min(result.per_key, key=lambda r: r.log10_p_value)
    # Šidák for the global p: slightly above the best single p, at most 3x it (the spans,
    # the verdict's other component, can only lower it).
    assert result.log10_p_value <= best.log10_p_value + math.log10(3) + 1e-12
    assert all(r.log10_p_adjusted >= r.log10_p_value for r in result.per_key)
    null = detect(human_like(300, seed=3), candidates)
    assert not null.watermarked and null.key is None


def test_localisation_finds_the_watermarked_stretch():
    key = WatermarkKey(31337, WatermarkSpec())
    marked, _ = generate(key, 160, scale=2.5, seed=11)
    before, after = human_like(700, seed=1), human_like(500, seed=2)
    text = before + marked + after
    result = detect(text, [Candidate.inline(key)])
    assert result.spans, "no span found"
    span = min(result.spans, key=lambda s: s.log10_p_value)
    assert span.start < 700 + 40 and span.end > 700 + 120
    assert span.start >= 700 - 256 and span.end <= 860 + 256


@pytest.mark.statistical
def test_localisation_reports_nothing_on_null_text():
    rng = np.random.default_rng(5)
    config = DetectorConfig(threshold=0.05)
    with_spans = 0
    trials = 300
    for i in range(trials):
        key = WatermarkKey(int(rng.integers(0, 2**63)), WatermarkSpec())
        with_spans += bool(detect(rng.integers(0, 3000, 600), [Candidate.inline(key)], config).spans)
    # The union bound keeps the family-wise rate at or below the threshold.
    assert with_spans / trials <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)


def test_bad_input():
    key = Candidate.inline(WatermarkKey(1))
    with pytest.raises(ValueError, match="no keys"):
        detect([1, 2, 3], [])
    with pytest.raises(ValueError, match="token ids"):
        detect([1, -2, 3], [key])
    empty = detect([], [key])
    assert not empty.watermarked and empty.p_value == 1.0 and empty.scored_tokens == 0


@pytest.mark.parametrize("test", ["auto", "sum", "trgof"])
@pytest.mark.parametrize("with_spans", [True, False])
@pytest.mark.parametrize("dual_auto", [True, False])
def test_bonferroni_weights_sum_to_one(test, with_spans, dual_auto):
    from detector.detect import weights
    share = weights(DetectorConfig(test=test), with_spans, dual_auto=dual_auto)
    assert math.isclose(sum(share.values()), 1.0, rel_tol=1e-12)
    if dual_auto and test == "auto" and with_spans:
        assert share == pytest.approx({"sum": 0.19, "weighted": 0.57, "trgof": 0.19, "spans": 0.05})


def test_a_per_key_entry_with_its_adjusted_p_is_dataclasses_replace():
    import dataclasses

    from detector.detect import with_adjusted

    key = WatermarkKey(0xA11CE, WatermarkSpec(algorithm="dual_key_gumbel"))
    tokens, _ = generate(key, 120, seed=3)
    keys = [Candidate.inline(key)] + [Candidate.inline(WatermarkKey(0xB0B + i, key.spec)) for i in range(3)]
    for entry in detect(tokens, keys).per_key:
        made = with_adjusted(entry, -3.25)
        assert made == dataclasses.replace(entry, log10_p_adjusted=-3.25) and made.to_dict() == {
            **entry.to_dict(), "log10_p_adjusted": -3.25}
        assert entry.log10_p_adjusted != -3.25 or made is not entry  # a copy, the entry unchanged
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.log10_p_adjusted = 0.0
