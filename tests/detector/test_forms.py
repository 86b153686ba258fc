"""Detection over the text as sent and its normalised form: the verdict rests on the better
one with a Bonferroni factor of 2, so normalising never costs a genuine text its watermark
and never makes a null text look watermarked more often than the threshold allows."""

from __future__ import annotations

import math

import numpy as np

from detector.detect import DetectorConfig, detect
from detector.result import Candidate
from detector.forms import detect_forms
from tests.synthetic import generate, human_like
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

KEY = WatermarkKey(0xA11CE, WatermarkSpec())


def test_one_form_is_plain_detection():
    tokens, _ = generate(KEY, 120, seed=1)
    result, form = detect_forms([tokens], [Candidate.inline(KEY)], DetectorConfig())
    assert form == 0
    assert result.log10_p_value == detect(tokens, [Candidate.inline(KEY)]).log10_p_value


def test_the_better_form_carries_the_verdict_at_twice_its_p():
    watermarked, _ = generate(KEY, 120, seed=2)
    broken = human_like(120, seed=2)  # what a damaging normalisation would leave
    config = DetectorConfig()
    alone = detect(watermarked, [Candidate.inline(KEY)], config.model_copy(update={"threshold": 5e-7}))
    for forms, expected in (([watermarked, broken], 0), ([broken, watermarked], 1)):
        result, form = detect_forms(forms, [Candidate.inline(KEY)], config)
        assert form == expected
        assert result.watermarked and result.threshold == config.threshold
        assert math.isclose(result.log10_p_value, alone.log10_p_value + math.log10(2), abs_tol=1e-9)
        assert all(k.log10_p_adjusted <= 0 for k in result.per_key)
        assert "normalised forms" in result.correction


def test_null_texts_stay_calibrated_with_two_forms():
    # Two unrelated null forms per text: P(global p <= a) <= a (Bonferroni), here a = 0.01.
    rng = np.random.default_rng(7)
    config = DetectorConfig(threshold=0.01, spans=False)
    hits = 0
    trials = 1500
    for i in range(trials):
        key = WatermarkKey(int(rng.integers(1, 2**63)), WatermarkSpec())
        forms = [human_like(80, seed=2 * i + 1000), human_like(80, seed=2 * i + 1001)]
        result, _ = detect_forms(forms, [Candidate.inline(key)], config)
        hits += result.watermarked
    # Expected at most 15; a valid test stays below 15 + 3 sd (binomial sd ~3.9).
    assert hits <= 27, hits


def test_text_forms_are_distinct_and_keep_indentation_apart():
    from detector.forms import text_forms

    forms, full = text_forms("plain text, nothing to undo.")
    assert [f.name for f in forms] == ["as_sent"] and not full.changed
    forms, _ = text_forms("pa\u200bss w\u043erd")  # no space runs: one normalised form
    assert [f.name for f in forms] == ["as_sent", "normalized"] and forms[1].text == "pass word"
    code = "def f(x):\n    return x\u200b + 1"
    forms, full = text_forms(code)
    by_name = {f.name: f.text for f in forms}
    assert by_name["normalized"] == "def f(x):\n return x + 1"
    assert by_name["normalized_spaces_kept"] == "def f(x):\n    return x + 1"
    assert full.changes == {"zero_width": 1, "whitespace": 3}
