"""The shared-token test of a k-gram match (service.ledger_evidence) scores tokens exactly as
the detector's per-token evidence does, for every statistic it tests."""

from __future__ import annotations

import random

import pytest

from detector.detect import DetectorConfig
from detector.evidence import token_evidence
from detector.result import Candidate
from service.ledger_evidence import _statistics, _token_scores
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec


@pytest.mark.parametrize("spec, config, want", [
    (WatermarkSpec(), DetectorConfig(), ["single"]),
    (WatermarkSpec(algorithm="dual_key_gumbel", alpha=0.2), DetectorConfig(), ["max", "weighted"]),
    (WatermarkSpec(algorithm="dual_key_gumbel", alpha=0.2), DetectorConfig(dual_statistic="weighted"), ["weighted"]),
    (WatermarkSpec(algorithm="dual_key_gumbel", coin="keyed"), DetectorConfig(), ["routed"]),
    (WatermarkSpec(context_width=2, deduplicate_contexts="all"), DetectorConfig(), ["single"]),
])
def test_shared_token_scores_are_the_evidence_scores(spec, config, want):
    rng = random.Random(9)
    tokens = [rng.randrange(300) for _ in range(150)] + [5, 6, 7, 8] * 10  # repeated contexts: skipped
    candidate = Candidate.inline(WatermarkKey(secret=0x1234_5678_9ABC, spec=spec))
    statistics = _statistics(candidate, config)
    assert statistics == want
    positions, per_statistic = _token_scores(tokens, candidate, statistics)
    assert list(per_statistic) == want
    for statistic, scores in per_statistic.items():
        evidence = [t for t in token_evidence(tokens, candidate, statistic).tokens if t.scored]
        assert positions.tolist() == [t.index for t in evidence]
        assert scores.tolist() == [t.score for t in evidence]  # bit for bit


@pytest.mark.parametrize("spec, config", [
    (WatermarkSpec(), DetectorConfig()),
    (WatermarkSpec(algorithm="dual_key_gumbel", alpha=0.2), DetectorConfig()),
    (WatermarkSpec(algorithm="dual_key_gumbel", alpha=0.2), DetectorConfig(dual_statistic="weighted")),
    (WatermarkSpec(algorithm="dual_key_gumbel", alpha=0.2), DetectorConfig(test="trgof", spans=False)),
    (WatermarkSpec(algorithm="dual_key_gumbel", coin="keyed"), DetectorConfig()),
    (WatermarkSpec(mode="diverse"), DetectorConfig()),
])
def test_shared_token_scores_reuse_the_detectors_without_running_the_prf(spec, config, monkeypatch):
    # The detector records each token list's per-token scores (detector.scoring.ScoreMemo);
    # the shared-token test reads those arrays (so its one-by-one sums are the same floats)
    # and runs the PRF only for a statistic the detector did not compute.
    from detector import scoring
    from detector.forms import detect_forms
    from detector.multikey import KeySet, detect_many
    from detector.result import salted_candidates

    rng = random.Random(11)
    forms = [[rng.randrange(300) for _ in range(150)] + [5, 6, 7, 8] * 10]
    forms.append(forms[0][:40] + forms[0][41:])
    key = WatermarkKey(secret=0x1234_5678_9ABC, spec=spec)
    # A diverse key's generation names its salt in the ledger, which narrows detection to
    # that salted key (service.ledger_salts): the shared-token test then scores the same key.
    candidate = salted_candidates([Candidate.inline(key)])[3] if spec.mode == "diverse" else Candidate.inline(key)
    memo = scoring.ScoreMemo()
    detect_forms(forms, KeySet.of([candidate]), config, run=detect_many, memo=memo)
    statistics = _statistics(candidate, config)
    computed = {"n": 0}
    for name in ("dual_scores", "token_scores"):
        original = getattr(scoring, name)

        def counting(*args, _original=original, **kwargs):
            computed["n"] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(scoring, name, counting)
    for tokens in forms:
        fresh_positions, fresh = _token_scores(tokens, candidate, statistics)
        before = computed["n"]
        positions, reused = _token_scores(tokens, candidate, statistics, memo)
        assert positions.tolist() == fresh_positions.tolist() and list(reused) == list(fresh)
        for statistic in fresh:
            assert reused[statistic].dtype == fresh[statistic].dtype
            assert reused[statistic].tolist() == fresh[statistic].tolist()  # bit for bit
        # Both statistics of an ordinary-coin dual key come from the detector's one PRF pass
        # (its DualScores), whichever tests the config runs.
        assert computed["n"] == before, (statistics, config)
