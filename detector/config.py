"""The detector's config and the Bonferroni weights it fixes before any data is seen
(detector.detect's module docstring says how the verdict combines them)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from detector.defaults import DEFAULT_THRESHOLD

DualStatistic = Literal["auto", "max", "weighted", "routed"]
Test = Literal["auto", "sum", "trgof"]
TESTS: tuple[str, ...] = ("auto", "sum", "trgof")


class DetectorConfig(BaseModel):
    """How a detection is scored and decided."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    threshold: float = Field(default=DEFAULT_THRESHOLD, gt=0.0, lt=1.0)
    """The text is reported watermarked when its global p-value is at most this."""

    dual_statistic: DualStatistic = "auto"
    """Statistic for dual-key keys. `auto` adapts to what the key lets the detector know.
    With a keyed acceptance coin it is `routed`: the two keys weighted per token by a
    routing share learnt from the earlier tokens of the text (:mod:`detector.scoring`),
    which starts as `max` and moves only on evidence (measured never below `max` + `weighted`
    on the bundled pair's speculative text: bench/results/robustness.md). With an ordinary
    coin the share of key-B tokens is unknown (alpha without speculation, the draft
    rejection rate with it), so `auto` tests both `max` (Šidák per token, no knowledge of
    the share) and `weighted` (strongest when the share is alpha), under one correction
    (:func:`weights`). `routed` needs a keyed coin; `max`, `weighted` force one statistic."""

    spans: bool = True
    """Localise watermarked spans (windows of ``span_min_length`` tokens and up)."""

    span_min_length: int = Field(default=32, ge=4)

    test: Test = "auto"
    """Whole-text test. `auto`: the sum and Tr-GoF under one weighted Bonferroni correction
    (see the module docstring); `sum` or `trgof` alone."""


TRGOF_EXACT_BELOW = 0.01
"""Global p-values up to this (or up to the threshold, if larger) are as if Tr-GoF's exact
tail were always computed (see the module docstring)."""
SPANS_SHARE = 0.05
"""The spans' share of the threshold when spans are on. Small because a span reported at the
threshold is rare on null text: at 0.25 the whole-text tests' 0.75 left the null's 1e-3 rate
at 78 in 100,000 (below its binomial interval 81-120), at 0.05 it is 97 and the spans' power
is unchanged within noise (bench/results/detect-core-issue30-stats.md, diversity-head-*)."""


DUAL_AUTO_RAW = {"sum": 1.0, "weighted": 3.0, "trgof": 1.0}
"""Relative whole-text weights of an ordinary-coin dual key under ``auto`` (``sum`` is the
``max`` statistic's sum): 0.19 / 0.57 / 0.19 of the threshold with spans on."""
SINGLE_RAW = {"sum": 2.0, "trgof": 1.0}
DUAL_AUTO_SPAN_FRACTIONS = {"max": 0.25, "weighted": 0.75}
"""How an ordinary-coin dual key under ``auto`` splits the spans' share between its two
span searches."""


def weights(config: "DetectorConfig", with_spans: bool, dual_auto: bool = False) -> dict[str, float]:
    """Bonferroni weights of the verdict's components (sum to 1): fixed by the config, the
    key's kind and the text length only, never by the data. Spans get SPANS_SHARE; the
    whole text the rest, split sum 2 : Tr-GoF 1, or for a dual key under ``auto``
    ``max`` sum 1 : ``weighted`` sum 3 : Tr-GoF 1 (``weighted`` is the stronger statistic when
    the key-B share is alpha, as in non-speculative text, by far at low entropy:
    bench/results/robustness.md; ``max`` keeps the power when the share is not alpha)."""
    table = DUAL_AUTO_RAW if dual_auto else SINGLE_RAW
    raw = {}
    if config.test in ("auto", "sum"):
        raw["sum"] = table["sum"]
        if dual_auto:
            raw["weighted"] = table["weighted"]
    if config.test in ("auto", "trgof"):
        raw["trgof"] = table["trgof"]
    whole = 1.0 - (SPANS_SHARE if with_spans else 0.0)
    total = sum(raw.values())
    out = {name: whole * value / total for name, value in raw.items()}
    if with_spans:
        out["spans"] = SPANS_SHARE
    return out
