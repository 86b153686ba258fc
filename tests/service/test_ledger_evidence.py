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
