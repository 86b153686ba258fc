"""Per-token evidence: it sums to the detector's own statistic and names every skip."""

import math

import pytest

from detector import stats
from detector.detect import DetectorConfig, detect, statistic_for
from detector.evidence import REPEATED_CONTEXT, TOO_CLOSE_TO_START, token_evidence
from detector.result import Candidate
from tests.synthetic import generate
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec


@pytest.mark.parametrize("algorithm", ["gumbel", "dual_key_gumbel"])
def test_scores_sum_to_the_detectors_statistic(algorithm):
    key = WatermarkKey(0x1234_5678_9ABC, WatermarkSpec(algorithm=algorithm))
    tokens, _ = generate(key, 120, seed=3)
    tokens = tokens + tokens[:40]  # a repeated stretch: skipped as repeated contexts
    candidate = Candidate.inline(key)
    config = DetectorConfig()
    result = detect(tokens, [candidate], config)
    evidence = token_evidence(tokens, candidate, statistic_for(candidate, config))
    scored = [t for t in evidence.tokens if t.scored]
    assert len(evidence.tokens) == len(tokens) and len(scored) == result.scored_tokens
    assert math.isclose(sum(t.score for t in scored), result.per_key[0].score, rel_tol=1e-12)
    n = len(scored)
    assert math.isclose(stats.gamma_log10_sf(sum(t.score for t in scored), n), result.per_key[0].log10_p_sum,
                        rel_tol=1e-9)
    skipped = [t for t in evidence.tokens if not t.scored]
    assert skipped and all(t.reason == REPEATED_CONTEXT and t.score is None for t in skipped)
    # The repeated copy is skipped from its (w+1)-th token on: its contexts all occurred before.
    assert all(not t.scored for t in evidence.tokens[120 + key.spec.context_width:])
    assert evidence.to_dict()["tokens"][0].keys() >= {"index", "token_id", "scored", "reason", "score"}


def test_scope_all_names_the_padded_start():
    key = WatermarkKey(99, WatermarkSpec(algorithm="gumbel", dedup="all", context_width=3))
    tokens, _ = generate(key, 30, seed=1)
    evidence = token_evidence(tokens, Candidate.inline(key), "single", offsets=[(i, i + 1) for i in range(30)])
    assert [t.reason for t in evidence.tokens[:3]] == [TOO_CLOSE_TO_START] * 3
    assert evidence.tokens[3].scored and evidence.tokens[5].char_start == 5 and evidence.tokens[5].char_end == 6
