"""A `diverse` key under detection (detector.result.salted_candidates): text generated under
any of its 16 salts is found, with the salt named; the ledger's salt tests that salt alone;
the search over 16 salts stays calibrated (Šidák over the salts) far into the tail."""

from __future__ import annotations

import math

import numpy as np
import pytest

from detector.detect import DetectorConfig, detect
from detector.multikey import KeySet, detect_many
from detector.result import Candidate, KeyInfo, salted_candidates
from tests.stats_helpers import binomial_two_sided_p
from tests.synthetic import generate, human_like
from watermark.key import WatermarkKey
from watermark.salt import SALTS
from watermark.spec import WatermarkSpec

DIVERSE = {"gumbel": WatermarkSpec(mode="diverse"),
           "dual_key_gumbel": WatermarkSpec(algorithm="dual_key_gumbel", mode="diverse")}


def _stored(key: WatermarkKey, key_id: str = "k1") -> Candidate:
    return Candidate(key=key, info=KeyInfo("acme", key_id, 1, "active", key.fingerprint, key.spec.algorithm))


def test_a_diverse_key_is_tested_under_each_salt_and_a_deterministic_one_as_it_is():
    diverse = _stored(WatermarkKey(77, DIVERSE["gumbel"]))
    plain = _stored(WatermarkKey(78, WatermarkSpec()), "k2")
    out = salted_candidates([diverse, plain])
    assert len(out) == SALTS + 1 and out[-1] is plain
    assert [c.info.salt for c in out[:SALTS]] == list(range(SALTS))
    assert all(c.key.salt == c.info.salt and c.info.key_id == "k1" for c in out[:SALTS])
    assert out[3].info.to_dict()["salt"] == 3 and "salt" not in plain.info.to_dict()
    known = salted_candidates([diverse, plain], known_salt={"k1": 5})
    assert [c.info.salt for c in known] == [5, None]
    assert salted_candidates(out) == out  # already salted: unchanged


@pytest.mark.parametrize("algorithm", sorted(DIVERSE))
def test_salted_candidates_are_those_of_replacing_the_salt(algorithm):
    """The fast construction (WatermarkKey.salted_keys, KeyInfo without __init__) gives what
    dataclasses.replace gives: equal keys and infos, hashable, in salt order."""
    import dataclasses

    stored = _stored(WatermarkKey(2**63 + 5, DIVERSE[algorithm]))
    out = salted_candidates([stored])
    expected = [Candidate(key=stored.key.with_salt(s), info=dataclasses.replace(stored.info, salt=s))
                for s in range(SALTS)]
    assert out == expected
    assert [hash(c.info) for c in out] == [hash(c.info) for c in expected]
    assert [c.info.to_dict() for c in out] == [c.info.to_dict() for c in expected]
    assert stored.info.salt is None  # the stored candidate's own info is untouched
    keyset, reference = KeySet.of(out), KeySet.of(expected)
    for group, ref in zip(keyset.groups, reference.groups):
        assert np.array_equal(group.keys_a, ref.keys_a)
        assert (group.keys_b is None) == (ref.keys_b is None) and (group.keys_b is None
                                                                  or np.array_equal(group.keys_b, ref.keys_b))



@pytest.mark.parametrize("algorithm", ["gumbel", "dual_key_gumbel"])
@pytest.mark.parametrize("salt", [0, 11])
def test_text_under_any_salt_is_detected_and_names_it(algorithm, salt):
    key = WatermarkKey(0x5A17_0000_0000_0001, DIVERSE[algorithm])
    tokens, _ = generate(key.with_salt(salt), 150, seed=salt + 1)
    candidates = salted_candidates([_stored(key)])
    for run in (detect, detect_many):
        result = run(tokens, candidates)
        assert result.watermarked and result.key.salt == salt and result.keys_tested == SALTS
    # The ledger knows the salt: one key tested, a p-value at most log10(16) smaller in log10.
    known = detect(tokens, salted_candidates([_stored(key)], known_salt={"k1": salt}))
    searched = detect_many(tokens, candidates)
    assert known.keys_tested == 1 and known.key.salt == salt
    assert known.log10_p_value <= searched.log10_p_value <= known.log10_p_value + math.log10(SALTS) + 1e-9
    # Unsalted, the key itself (what a diverse key never generates under) finds nothing.
    assert not detect(tokens, [_stored(key)]).watermarked


def test_a_deterministic_key_still_detects_as_before():
    key = WatermarkKey(0x5A17_0000_0000_0002, WatermarkSpec(algorithm="dual_key_gumbel"))
    tokens, _ = generate(key, 150, seed=3)
    result = detect(tokens, salted_candidates([_stored(key)]))
    assert result.watermarked and result.keys_tested == 1 and result.key.salt is None


NULL_TEXTS = 20_000


@pytest.mark.statistical
@pytest.mark.slow
def test_the_16_salt_search_is_calibrated_on_null_text_into_the_far_tail():
    """P(p <= t) <= t for the search over 16 salts, on null text (half uniform tokens, half
    human-like), checked at 0.1, 0.01 and 1e-3 against the binomial; and in the far tail,
    where counting cannot reach, the reported p is exactly Šidák's transform of the best
    salt's p, 1 - (1 - p_min)^16 (each salt's p is the single-key detector's, whose tail is
    tested against high-precision values in test_stats.py), never below p_min and never
    above 16 p_min. The bench (bench/diversity.py null) counts 0 in 100,000 at 1e-6."""
    rng = np.random.default_rng(2424)
    config = DetectorConfig(spans=False)
    p_values = np.empty(NULL_TEXTS)
    for i in range(NULL_TEXTS):
        algorithm = "gumbel" if i % 2 else "dual_key_gumbel"
        keyset = KeySet.of(salted_candidates([_stored(WatermarkKey(int(rng.integers(0, 2**63)), DIVERSE[algorithm]))]))
        length = int(rng.integers(30, 300))
        tokens = rng.integers(0, 5000, length) if i % 4 < 2 else human_like(length, seed=int(rng.integers(0, 2**31)))
        result = detect_many(tokens, keyset, config)
        p_values[i] = result.p_value
        if i % 500 == 0:  # Šidák over the salts, exactly, wherever the tail is
            best = min(r.log10_p_value for r in result.per_key)
            p_min = 10.0 ** best
            sidak = -math.expm1(SALTS * math.log1p(-p_min)) if p_min < 1 else 1.0
            assert result.log10_p_value == pytest.approx(math.log10(sidak), abs=1e-9)
            assert best - 1e-12 <= result.log10_p_value <= best + math.log10(SALTS) + 1e-12
    for level in (0.1, 0.01, 1e-3):
        hits = int(np.sum(p_values <= level))
        # Valid (not anti-conservative): no significant excess over the level.
        assert hits <= NULL_TEXTS * level or binomial_two_sided_p(hits, NULL_TEXTS, level) > 1e-3, (level, hits)
    assert int(np.sum(p_values <= 1e-4)) <= 8  # expected <= 2; 8 or more has probability < 1e-3


@pytest.mark.statistical
@pytest.mark.slow
def test_a_head_diverse_key_is_one_test_valid_on_null_text_into_the_far_tail():
    """A `head`-diverse key (the default for new keys) is one candidate: no salt search, so
    its null is the single-key detector's, default config (spans on). Valid at 0.1, 0.01 and
    1e-3 (no significant excess over the level), and in the far tail its whole-text p is the
    components' weighted Bonferroni of exact tails (checked: min over the sum, weighted and
    Tr-GoF p's of p / share). It is conservative by construction, as the bench measured (78
    of 100,000 at 1e-3, bench/results/diversity-head-null.json): the spans' share (1/4 of
    the threshold) is spent only on spans reported at the threshold, which no null text here
    reaches, so P(p <= t) is about 3/4 t at most for t above the threshold."""
    from detector.config import weights

    rng = np.random.default_rng(3030)
    config = DetectorConfig()
    texts = 4000
    p_values = np.empty(texts)
    for i in range(texts):
        algorithm = "gumbel" if i % 2 else "dual_key_gumbel"
        spec = DIVERSE[algorithm].model_copy(update={"diversity": "head", "dedup": "all"})
        candidates = salted_candidates([_stored(WatermarkKey(int(rng.integers(1, 2**63)), spec))])
        assert len(candidates) == 1
        tokens = rng.integers(0, 5000, 200) if i % 4 < 2 else human_like(200, seed=int(rng.integers(0, 2**31)))
        result = detect(tokens, candidates, config)
        p_values[i] = result.p_value
        assert result.spans == ()
        entry = result.per_key[0]
        share = weights(config, True, dual_auto=algorithm == "dual_key_gumbel")
        parts = {"sum": entry.log10_p_sum, "trgof": entry.log10_p_trgof, "weighted": entry.log10_p_weighted}
        bonferroni = min(0.0, min(parts[name] - math.log10(w) for name, w in share.items() if name != "spans"))
        assert result.log10_p_value == pytest.approx(bonferroni, abs=1e-9)
    for level in (0.1, 0.01, 1e-3):
        hits = int(np.sum(p_values <= level))
        assert hits <= texts * level or binomial_two_sided_p(hits, texts, level) > 1e-3, (level, hits)
