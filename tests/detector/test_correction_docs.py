"""The correction shares a result states are the ones the documentation gives (issue 25, item 11;
docs/concepts/detection.md since issue 34 moved it out of README): for a text too short for a span
search as well as for a longer one, single and dual key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from detector.detect import DetectorConfig, detect
from detector.result import Candidate
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

DOC = re.sub(r"\s+", " ", (Path(__file__).resolve().parents[2] / "docs" / "concepts" / "detection.md")
             .read_text(encoding="utf-8"))


@pytest.mark.parametrize("algorithm", ["gumbel", "dual_key_gumbel"])
@pytest.mark.parametrize("length", [10, 2 * DetectorConfig().span_min_length - 1, 2 * DetectorConfig().span_min_length,
                                    200])
def test_the_stated_shares_are_the_documented_ones(algorithm, length):
    result = detect(list(range(1, length + 1)), [Candidate.inline(WatermarkKey(5, WatermarkSpec(algorithm=algorithm)))])
    shares = re.match(r"weighted Bonferroni: ([^;]+);", result.correction).group(1)
    assert f"`{shares}`" in DOC, shares
    short = length < 2 * DetectorConfig().span_min_length
    assert ("spans" in shares) is not short
