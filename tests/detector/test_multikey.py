"""The batched many-key core gives detect's results: against main's recorded results on a
randomised corpus (tests/detector/multikey_corpus.py), and against ``detect`` in process
on fresh random cases every run."""

from __future__ import annotations

import math
import secrets
from pathlib import Path

import numpy as np
import pytest

from detector import trgof
from detector.detect import DetectorConfig, detect
from detector.forms import detect_forms
from detector.multikey import KeySet, detect_many
from detector.result import Candidate
from tests.detector import multikey_corpus
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

RECORD = Path(__file__).resolve().parents[1] / "data" / "multikey-main.json.gz"
TOLERANCE = 1e-9  # log10 p, two paths in one process
# Against the record, made on another machine: Tr-GoF's exact tail is accurate to about
# 1e-13 absolute and floored at its 1e-11 float allowance (detector.trgof.FLOAT_ALLOWANCE),
# so log10 p may move by up to log10(1 + 1e-13 / 1e-11) = 4.3e-3 between CPUs (numpy's SIMD
# exp/log differ between AVX-512 and AVX2) or between the numba loop and its numpy
# reference. Seen: up to 1.7e-4; verdicts, keys, spans and forms are compared exactly.
RECORD_TOLERANCE = 5e-3
FIELDS = multikey_corpus.PER_KEY


@pytest.fixture(scope="module")
def cases():
    return multikey_corpus.corpus()


@pytest.fixture(scope="module")
def recorded():
    return multikey_corpus.load(RECORD)


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= RECORD_TOLERANCE * max(1.0, abs(b) * 1e-3)


def _same_global(mine: dict, main: dict) -> list[str]:
    """Differences in what a detection decides and reports globally."""
    wrong = []
    for name in ("watermarked", "scored_tokens", "total_tokens", "keys_tested", "basis", "correction", "key",
                 "best_form", "threshold"):
        if mine[name] != main[name]:
            wrong.append(f"{name}: {mine[name]!r} != {main[name]!r}")
    if not _close(mine["log10_p_value"], main["log10_p_value"]):
        wrong.append(f"log10_p_value: {mine['log10_p_value']} != {main['log10_p_value']}")
    # The record predates ea0fd20, which refines span boundaries differently (a span starts at
    # its first scored token's context, its cut re-estimated from its own mean): against the
    # record, every recorded span keeps its key and p-value (a tighter span can leave room for
    # one more disjoint span, as in one case of the corpus); boundaries are compared with a
    # fresh per-key run instead (test_detect_many_gives_main_results).
    for old in main["spans"]:
        if not any(s["fingerprint"] == old["fingerprint"] and _close(s["log10_p_value"], old["log10_p_value"])
                   for s in mine["spans"]):
            wrong.append(f"spans: {mine['spans']} lack {old}")
    return wrong


def _same_key(mine: list, main: list, skip: tuple[str, ...] = ()) -> bool:
    return all(a == b if isinstance(b, (str, int)) or b is None else _close(a, b)
               for name, a, b in zip(FIELDS, mine, main) if name not in skip)


def test_the_record_is_main_results_on_this_corpus(cases, recorded):
    # A changed corpus (or record) would make the comparisons below vacuous.
    assert [c.name for c in cases] == list(recorded)
    assert len(cases) >= 250
    kinds = {c.name.split(":")[2] for c in cases}
    assert {"marked", "edited", "mixed", "null", "human"} <= kinds
    assert sum(r["watermarked"] for r in recorded.values()) >= 60
    assert sum(not r["watermarked"] for r in recorded.values()) >= 60


def test_detect_is_unchanged(cases, recorded):
    """Today's per-key path (``detect``) still gives main's numbers, every key included."""
    wrong = []
    for case in cases:
        result, best = detect_forms(case.forms, case.keys, case.config)
        mine = multikey_corpus.summary(result, best)
        main = recorded[case.name]
        wrong += [f"{case.name}: {w}" for w in _same_global(mine, main)]
        wrong += [f"{case.name}: key {i}" for i, (a, b) in enumerate(zip(mine["per_key"], main["per_key"]))
                  if not _same_key(a, b)]
    assert wrong == []


def test_detect_many_gives_main_results(cases, recorded):
    """Same verdicts, global p, winning key, spans and forms; every key computed in full
    carries main's numbers, every key screened out valid bounds on them; Holm's adjustment
    (over the reported values) is main's for the best key and never below it elsewhere."""
    wrong = []
    screened = 0
    adjusted = FIELDS.index("log10_p_adjusted")
    for case in cases:
        result, best = detect_forms(case.forms, KeySet.of(case.keys), case.config, run=detect_many)
        mine = multikey_corpus.summary(result, best)
        main = recorded[case.name]
        wrong += [f"{case.name}: {w}" for w in _same_global(mine, main)]
        if result.spans != detect_forms(case.forms, case.keys, case.config)[0].spans:
            wrong.append(f"{case.name}: spans differ from the per-key path's")
        top = min(range(len(main["per_key"])), key=lambda i: main["per_key"][i][FIELDS.index("log10_p_value")])
        if not _close(mine["per_key"][top][adjusted], main["per_key"][top][adjusted]):
            wrong.append(f"{case.name}: the best key's Holm adjustment differs")
        for i, (entry, a, b) in enumerate(zip(result.per_key, mine["per_key"], main["per_key"])):
            row_a, row_b = dict(zip(FIELDS, a)), dict(zip(FIELDS, b))
            if not row_a["log10_p_adjusted"] >= row_b["log10_p_adjusted"] - RECORD_TOLERANCE:
                wrong.append(f"{case.name}: key {i} Holm adjustment below main's")
            if not entry.screened:
                if not _same_key(a, b, skip=("log10_p_adjusted",)):
                    wrong.append(f"{case.name}: key {i} {a} != {b}")
                continue
            screened += 1
            for name in ("log10_p_value", "log10_p_sum", "log10_p_trgof", "log10_p_weighted", "log10_p_adjusted"):
                if row_b[name] is not None and not row_a[name] >= row_b[name] - RECORD_TOLERANCE:
                    wrong.append(f"{case.name}: key {i} {name} {row_a[name]} below the exact {row_b[name]}")
            if (row_b["log10_p_trgof"] is None) != (row_a["log10_p_trgof"] is None):
                wrong.append(f"{case.name}: key {i} log10_p_trgof presence differs")
            if row_a["statistic"] != row_b["statistic"] or row_a["scored_tokens"] != row_b["scored_tokens"]:
                wrong.append(f"{case.name}: key {i} statistic or scored tokens differ")
    assert wrong == []
    assert screened > 0.8 * sum(len(c.keys) for c in cases)  # the screen does the work


def test_a_thousand_keys_leave_few_to_compute(cases):
    for case in cases:
        if len(case.keys) == 1000 and "keyed" not in case.name:
            result = detect_many(case.forms[0], KeySet.of(case.keys), case.config)
            assert sum(not r.screened for r in result.per_key) <= 60, case.name


def _fresh_cases(seed: int, count: int):
    rng = np.random.default_rng(seed)
    specs = list(multikey_corpus._specs().values())
    configs = multikey_corpus._configs()
    for number in range(count):
        mix = [specs[i] for i in rng.choice(len(specs), size=int(rng.integers(1, 4)), replace=False)]
        keys = [Candidate.inline(WatermarkKey(multikey_corpus._secret(rng), mix[i % len(mix)]), f"k{i}")
                for i in range(int(rng.choice([1, 3, 17, 120])))]
        kind = ("marked", "edited", "null", "human", "mixed")[number % 5]
        owner = keys[int(rng.integers(0, len(keys)))].key
        n = int(rng.choice([8, 40, 150, 300]))
        yield keys, multikey_corpus._text(rng, kind, owner, n, seed=seed % 1000 + number), configs[number % len(configs)]


@pytest.mark.parametrize("_", range(2))
def test_detect_many_equals_detect_on_fresh_random_cases(_):
    # Both paths in one process on the same tail loop: numba's loop and its numpy reference
    # differ within the float allowance (RECORD_TOLERANCE), and a process switches to numba
    # after enough exact tails, which could fall between the two calls below.
    trgof.warm_up()
    seed = secrets.randbits(32)
    for keys, tokens, config in _fresh_cases(seed, 24):
        main = detect(tokens, keys, config)
        mine = detect_many(tokens, keys, config)
        assert mine.watermarked == main.watermarked, seed
        assert math.isclose(mine.log10_p_value, main.log10_p_value, rel_tol=1e-12, abs_tol=TOLERANCE), seed
        assert (mine.key, mine.spans, mine.correction) == (main.key, main.spans, main.correction), seed
        for a, b in zip(mine.per_key, main.per_key):
            if a.screened:
                assert a.log10_p_value >= b.log10_p_value - TOLERANCE, seed
            else:
                assert (a.log10_p_value, a.log10_p_sum, a.log10_p_trgof, a.score) == (
                    b.log10_p_value, b.log10_p_sum, b.log10_p_trgof, b.score), seed


def test_detect_many_refuses_what_detect_refuses():
    key = Candidate.inline(WatermarkKey(5))
    with pytest.raises(ValueError, match="no keys"):
        detect_many([1, 2, 3], [])
    with pytest.raises(ValueError, match="token ids"):
        detect_many([1, -2, 3], [key])
    routed = DetectorConfig(dual_statistic="routed")
    with pytest.raises(ValueError, match="keyed acceptance coin"):
        detect_many([1, 2, 3], [Candidate.inline(WatermarkKey(5, WatermarkSpec(algorithm="dual_key_gumbel")))],
                    routed)


def test_empty_and_tiny_texts():
    keys = [Candidate.inline(WatermarkKey(k), f"k{k}") for k in range(40)]
    # Every key ties at p = 1 on an empty text: all are kept, and the result is detect's.
    assert detect_many([], keys) == detect([], keys)
    for tokens in ([7], [1, 1, 1, 1, 1, 1]):
        mine, main = detect_many(tokens, keys), detect(tokens, keys)
        assert (mine.log10_p_value, mine.watermarked, mine.key, mine.scored_tokens) == (
            main.log10_p_value, main.watermarked, main.key, main.scored_tokens)
