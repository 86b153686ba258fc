"""detector.resegment (issue 30, item 1's key-aware re-segmentation prototype): the family of
one-word forms is a function of the ids alone, its weighted Bonferroni is exactly what it
says (which carries the detector's own tail accuracy into the far tail), the combined p is
valid on null text at 0.05, 0.01 and 1e-3, and a word the model split as encode would not is
found under its key; the incremental sum-only variant equals the sum test of each form
wherever no context repeats, and is valid on null text too."""

from __future__ import annotations

import math

import numpy as np
import pytest

from detector.detect import DetectorConfig, detect
from detector.resegment import (combined_log10_p, repair_class, repair_log10_p, repair_sum_log10_p, sum_repairs,
                                word_repairs)
from detector.result import Candidate
from detector.segmentation import SegmentationTable
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

# A byte-level vocabulary in miniature: single letters, space-led words and their pieces.
PIECES = [b" ", b"  ", b"   ", b"a", b"b", b"c", b"s", b"re", b"ad", b"read", b"reads", b" read", b" reads",
          b" re", b" a", b" b", b" ab", b"ab", b"(", b")", b"()", b" (", b"ca", b"cab", b" cab", b"bs",
          b" c", b"\n", b"\n ", b"\n  "]
TABLE = SegmentationTable.of({i: p for i, p in enumerate(PIECES)})
ID = {p: i for i, p in enumerate(PIECES)}


def _key(secret: int, algorithm: str = "gumbel") -> WatermarkKey:
    coin = "keyed" if algorithm == "dual_key_gumbel" else "ordinary"
    return WatermarkKey(secret | (1 << 40), WatermarkSpec(algorithm=algorithm, coin=coin))


def test_the_family_is_one_word_rewritten_and_depends_on_the_ids_alone():
    canonical = [ID[b" reads"], ID[b"()"], ID[b"  "], ID[b" cab"]]
    repairs = word_repairs(canonical, TABLE)
    forms = {tuple(canonical[:s]) + t + tuple(canonical[e:]) for s, e, t in repairs}
    assert len(forms) == len(repairs) and tuple(canonical) not in forms
    assert (0, 1, (ID[b" read"], ID[b"s"])) in repairs  # stem + suffix
    assert (0, 1, (ID[b" "], ID[b"reads"])) in repairs  # the word's space alone
    assert (1, 2, (ID[b"("], ID[b")"])) in repairs  # punctuation split
    assert (2, 4, (ID[b"   "], ID[b"cab"])) in repairs  # a run written whole before a bare word
    assert {repair_class(canonical, r, TABLE) for r in repairs} >= {"suffix", "space", "punct", "run"}
    for s, e, t in repairs:  # every form spells the same bytes
        assert b"".join(TABLE.pieces[x] for x in t) == b"".join(TABLE.pieces[x] for x in canonical[s:e])


def test_the_repair_p_is_the_weighted_bonferroni_it_states():
    rng = np.random.default_rng(30)
    canonical = [int(x) for x in rng.integers(0, len(PIECES), 60)]
    candidates = [Candidate.inline(_key(7))]
    config = DetectorConfig()
    repairs = word_repairs(canonical, TABLE)
    got, n, best = repair_log10_p(canonical, candidates, config, TABLE)
    each = [detect(canonical[:s] + list(t) + canonical[e:], candidates, config).log10_p_value for s, e, t in repairs]
    assert n == len(repairs) and best == repairs[int(np.argmin(each))]
    assert got == pytest.approx(min(0.0, min(each) + math.log10(n)), abs=1e-12)
    rates = {"space": 1.0, "suffix": 2.0, "punct": 8.0, "run": 2.0, "merge": 2.0, "other": 2.0}
    weighted, _, _ = repair_log10_p(canonical, candidates, config, TABLE, rates)
    raw = [rates[repair_class(canonical, r, TABLE)] for r in repairs]
    expected = min(p - math.log10(w / sum(raw)) for p, w in zip(each, raw))
    assert weighted == pytest.approx(min(0.0, expected), abs=1e-12)
    assert combined_log10_p(-7.0, -9.0, 0.05) == pytest.approx(min(-7.0 - math.log10(0.95), -9.0 - math.log10(0.05)))


def test_the_level_dependent_split_is_the_smallest_level_that_rejects():
    """combined_log10_p with ``up_to``: p = inf{t: p_f <= t - b(t) or p_r <= b(t)}, b(t) =
    eps * min(t, up_to), checked against a direct search over a fine grid of levels."""
    eps, up_to = 0.05, 1e-5
    levels = np.logspace(-12, 0, 24001)
    b = eps * np.minimum(levels, up_to)
    for p_f, p_r in ((1e-8, 1.0), (3e-4, 1.0), (3e-4, 1e-9), (2e-6, 4e-7), (0.5, 1e-6), (1e-3, 1e-3), (1.0, 1.0)):
        rejects = (p_f <= levels - b) | (p_r <= b)
        smallest = levels[np.argmax(rejects)] if rejects.any() else 1.0
        got = 10 ** combined_log10_p(math.log10(p_f), math.log10(p_r), eps, up_to)
        assert got == pytest.approx(smallest, rel=2e-3), (p_f, p_r)
    # Above up_to the forms lose eps * up_to in p and nothing more; at and below, the plain split.
    assert 10 ** combined_log10_p(math.log10(1e-3), 0.0, eps, up_to) == pytest.approx(1e-3 + eps * up_to)
    assert combined_log10_p(-7.0, -9.0, eps, up_to) == pytest.approx(combined_log10_p(-7.0, -9.0, eps))


@pytest.mark.slow
def test_the_combined_p_is_valid_on_null_text():
    """Texts drawn independently of the keys (uniform ids of the miniature vocabulary, 40
    tokens): the combined p (text as one form, eps = 0.05) at most t in at most a binomial
    upper bound of t's share, at 0.05, 0.01 and 1e-3 (the far tail: the identity above and
    the detector's own tail tests)."""
    rng = np.random.default_rng(3030)
    config = DetectorConfig()
    count = 1500
    combined = []
    for i in range(count):
        canonical = [int(x) for x in rng.integers(0, len(PIECES), 40)]
        candidates = [Candidate.inline(_key(1000 + i, "gumbel" if i % 2 == 0 else "dual_key_gumbel"))]
        forms = detect(canonical, candidates, config).log10_p_value
        repair, _, _ = repair_log10_p(canonical, candidates, config, TABLE)
        combined.append([combined_log10_p(forms, repair, 0.05), combined_log10_p(forms, repair, 0.05, 1e-5)])
    combined = np.array(combined)
    for level, allowed in ((0.05, 102), (0.01, 28), (1e-3, 6)):  # binomial 99.9 % quantiles at 1,500
        assert np.all(np.sum(combined <= math.log10(level), axis=0) <= allowed), level


def test_a_word_split_as_encode_would_not_is_found_under_its_key():
    """A synthetic watermarked text (every token the argmax of its key's uniforms among the
    words that spell it, i.e. the maximal-signal text) whose one word is written ``(``+``)``
    where encode writes ``()``: scored as encoded it loses that word and the w tokens after it,
    and the repair finds the split."""
    from detector import scoring

    key = _key(99)
    alphabet = [ID[p] for p in (b" a", b" b", b" c", b" ab", b" cab", b" read")]
    tokens: list[int] = []
    for position in range(40):
        if position == 20:
            tokens += [ID[b"("], ID[b")"]]
            continue
        width = key.spec.context_width
        ctx = ([-1] * width + tokens)[-width:]
        scored = scoring.ScoredPositions(np.zeros(len(alphabet), dtype=np.int64),
                                         np.array([ctx] * len(alphabet), dtype=np.int64),
                                         np.array(alphabet, dtype=np.int64))
        u = scoring.uniforms(key.prf_secret, scored)
        tokens.append(alphabet[int(np.argmax(u))])
    encoded = tokens[:20] + [ID[b"()"]] + tokens[22:]
    candidates = [Candidate.inline(key)]
    config = DetectorConfig()
    as_encoded = detect(encoded, candidates, config).log10_p_value
    repair, _, best = repair_log10_p(encoded, candidates, config, TABLE)
    assert best == (20, 21, (ID[b"("], ID[b")"]))
    assert repair < as_encoded


def test_the_incremental_sum_is_each_forms_sum_test_where_no_context_repeats():
    from watermark.dedup import context_matrix

    config = DetectorConfig(test="sum", spans=False, dual_statistic="max")
    compared = 0
    for trial in range(12):
        key = _key(900 + trial, "gumbel" if trial % 2 else "dual_key_gumbel")
        canonical = [int(x) for x in np.random.default_rng(trial).integers(0, len(PIECES), 60)]
        repairs, log10_p = sum_repairs(canonical, key, TABLE)
        for (s, e, t), p in zip(repairs, log10_p):
            form = canonical[:s] + list(t) + canonical[e:]
            contexts = [tuple(r) for r in context_matrix(np.array(form), 4).tolist()]
            if len(set(contexts)) < len(contexts):
                continue  # a repeated context: a different (equally valid) choice of which to skip
            compared += 1
            assert p == pytest.approx(detect(form, [Candidate.inline(key)], config).log10_p_value, abs=1e-9)
        got, n, best = repair_sum_log10_p(canonical, key, TABLE)
        i = int(np.argmin(log10_p))
        assert n == len(repairs) and got == pytest.approx(min(0.0, log10_p[i] + math.log10(n)), abs=1e-12)
        assert log10_p[repairs.index(best)] == log10_p[i]
    assert compared > 300


def test_the_incremental_combined_p_is_valid_on_null_text():
    rng = np.random.default_rng(3031)
    config = DetectorConfig()
    combined = []
    for i in range(3000):
        canonical = [int(x) for x in rng.integers(0, len(PIECES), 40)]
        key = _key(5000 + i, "gumbel" if i % 2 == 0 else "dual_key_gumbel")
        forms = detect(canonical, [Candidate.inline(key)], config).log10_p_value
        repair = repair_sum_log10_p(canonical, key, TABLE)[0]
        combined.append([combined_log10_p(forms, repair, 0.05), combined_log10_p(forms, repair, 0.05, 1e-5)])
    combined = np.array(combined)
    for level, allowed in ((0.05, 188), (0.01, 48), (1e-3, 10)):  # binomial 99.9 % quantiles at 3,000
        assert np.all(np.sum(combined <= math.log10(level), axis=0) <= allowed), level
