"""Detection over the text as sent and its normalised form: the verdict rests on the better
one with a Bonferroni factor of 2, so normalising never costs a genuine text its watermark
and never makes a null text look watermarked more often than the threshold allows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from detector.detect import DetectorConfig, detect
from detector.result import Candidate
from detector.forms import detect_forms, distinct_forms, merge_form_matches
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
    # Indentation is no widened space between words: its collapsed form is not scored (the
    # result still reports the full normalisation).
    assert by_name == {"as_sent": code, "normalized_spaces_kept": "def f(x):\n    return x + 1"}
    assert full.text == "def f(x):\n return x + 1" and full.changes == {"zero_width": 1, "whitespace": 3}
    attacked = "def f(x):\n    return  x\u200b + 1"  # a space widened between two words
    by_name = {f.name: f.text for f in text_forms(attacked)[0]}
    assert by_name["normalized"] == "def f(x):\n return x + 1"


def test_the_collapsed_form_is_scored_only_where_spaces_between_words_were_widened():
    from detector.forms import text_forms

    def names(text: str) -> list[str]:
        return [f.name for f in text_forms(text)[0]]

    for genuine in ("def f(x):\n    return x + 1", "     |  Method resolution order:\n     |      tuple",
                    "x    = 1\ny    = 2", "End.  Next sentence.", "\tindented\n\t\tmore"):
        assert names(genuine) == ["as_sent"], genuine
    for attacked in ("the  cat sat", "a\t\tb", "x = 1 and  y", "pi  3 14"):
        assert names(attacked) == ["as_sent", "normalized"], attacked


def test_the_text_as_sent_with_its_runs_merged_is_one_more_form_only_where_it_differs():
    from detector.forms import RUNS_MERGED, TextForm, text_forms, with_runs_merged
    from detector.segmentation import SegmentationTable

    pieces = {i: bytes([i]) for i in range(256)} | {256: b"\n   ", 257: b" def", 258: b"def"}
    table = SegmentationTable.of(pieces)
    by = {v: k for k, v in pieces.items()}

    def encode(word: str) -> list[int]:
        data = word.encode()
        return [by[data]] if data in by else list(data)

    text = "x\n   def"
    forms = text_forms(text)[0][:1]  # the text as sent (its collapsed form left out here)
    tokenised = [([by[b"x"], by[b"\n"], 32, 32, 257], [(0, 1), (1, 2), (2, 3), (3, 4), (4, 8)])]
    variants, out = with_runs_merged(forms, tokenised, table, encode)
    assert [v.name for v in variants] == ["as_sent", RUNS_MERGED] and variants[1].text == text
    assert out[0] == tokenised[0] and out[1] == ([by[b"x"], 256, 258], [(0, 1), (1, 5), (5, 8)])
    # The same ids as encode's (or no table, a tokenizer that is not byte-level): no new form.
    plain = [([by[b"x"], 256, 257], None)]
    assert with_runs_merged(forms, plain, table, encode) == (forms, plain)
    assert with_runs_merged(forms, tokenised, None, encode) == (forms, tokenised)
    # Only the text as sent is re-segmented.
    normalized = [TextForm("normalized", text, None)]
    assert with_runs_merged(normalized, tokenised, table, encode) == (normalized, tokenised)


def test_ledger_matches_of_every_form_merge_per_generation_at_m_times_their_bounds():
    from ledger.kgrams import KgramMatch

    def match(generation, bound, shared=None):
        return KgramMatch(generation_id=generation, key_id="k", matched=5, queried=100, stored=100,
                          log10_false_match_bound=bound, shared_tokens=None if shared is None else 10,
                          log10_shared_p=shared)

    as_sent = [match("g1", -50.0, -8.0), match("g2", -3.0)]
    collapsed = [match("g1", -60.0, -4.0), match("g3", -40.0, -9.0)]
    merged = merge_form_matches([as_sent, collapsed])
    by_id = {m.generation_id: m for m in merged}
    assert set(by_id) == {"g1", "g2", "g3"}  # a generation matched in any form is reported
    # g1: the tested match with the smaller shared p wins; both of its bounds carry the factor 2.
    assert by_id["g1"].log10_shared_p == pytest.approx(-8.0 + math.log10(2))
    assert by_id["g1"].log10_false_match_bound == pytest.approx(-50.0 + math.log10(2))
    assert by_id["g2"].log10_shared_p is None and by_id["g2"].log10_false_match_bound == pytest.approx(-3.0 + math.log10(2))
    assert [m.generation_id for m in merged] == ["g1", "g3", "g2"]  # best (smallest bound) first
    assert merge_form_matches([as_sent]) == sorted(as_sent, key=lambda m: m.log10_false_match_bound)  # one form: unchanged
    assert distinct_forms([[1, 2, 3], [1, 2, 3], [4, 5], [6]], min_length=2) == [[1, 2, 3], [4, 5]]


def test_span_p_values_carry_the_forms_correction_like_the_global_p():
    # A span's p is corrected for every window and key examined; with m forms scored, for
    # the forms too, or a span could show a smaller p than the procedure guarantees.
    marked, _ = generate(KEY, 200, seed=5)
    mixed = human_like(400, seed=6) + marked + human_like(400, seed=7)
    other = human_like(1000, seed=8)
    config = DetectorConfig()
    result, form = detect_forms([mixed, other], [Candidate.inline(KEY)], config)
    alone = detect(mixed, [Candidate.inline(KEY)], config.model_copy(update={"threshold": config.threshold / 2}))
    assert form == 0 and result.spans and len(result.spans) == len(alone.spans)
    for span, plain in zip(result.spans, alone.spans):
        assert (span.start, span.end) == (plain.start, plain.end)
        assert span.log10_p_value == pytest.approx(plain.log10_p_value + math.log10(2))


def test_forms_that_tokenise_alike_are_scored_once_with_the_same_result(monkeypatch):
    import detector.forms as forms_module

    marked, _ = generate(KEY, 150, seed=9)
    other = human_like(150, seed=10)
    config = DetectorConfig()
    share = config.model_copy(update={"threshold": config.threshold / 3})
    separately = [detect(tokens, [Candidate.inline(KEY)], share) for tokens in (other, marked, other)]
    calls = []

    def counting(tokens, candidates, cfg, **options):
        calls.append(list(tokens))
        return detect(tokens, candidates, cfg, **options)

    monkeypatch.setattr(forms_module, "detect", counting)
    result, form = detect_forms([other, list(marked), other], [Candidate.inline(KEY)], config)
    assert calls == [list(other), list(marked)]  # the repeated form is not scored again
    # As if each form had been scored: the m = 3 correction and the first best form.
    best = min(range(3), key=lambda i: separately[i].log10_p_value)
    assert form == best == 1
    assert result.log10_p_value == min(0.0, separately[1].log10_p_value + math.log10(3))
    assert [k.log10_p_adjusted for k in result.per_key] == [
        min(0.0, k.log10_p_adjusted + math.log10(3)) for k in separately[1].per_key]
    tied, form = detect_forms([other, other], [Candidate.inline(KEY)], config)
    assert form == 0 and len(calls) == 3


# --- the span search only for forms that can win ------------------------------------------

_DUAL = WatermarkKey(0xD0A1, WatermarkSpec(algorithm="dual_key_gumbel"))
_KEYED = WatermarkKey(0xC0FF, WatermarkSpec(algorithm="dual_key_gumbel", coin="keyed"))
_DIVERSE = WatermarkKey(0xD17E, WatermarkSpec(mode="diverse"))


def _variants(marked: list[int], seed: int) -> list[list[list[int]]]:
    """Form lists as normalisation makes them: the same text, a few tokens changed, a text
    cut or merged differently, an unrelated one; in several orders and with repeats."""
    rng = np.random.default_rng(seed)
    edited = list(marked)
    for i in rng.choice(len(edited), size=max(1, len(edited) // 12), replace=False):
        edited[int(i)] = int(rng.integers(1, 2000))
    shifted = marked[3:] + human_like(3, seed=seed)
    human = human_like(len(marked), seed=seed + 1)
    mixed = human_like(150, seed=seed + 2) + marked[:90] + human_like(150, seed=seed + 3)
    return [[marked, edited], [edited, marked], [marked, shifted, edited], [human, marked], [marked, human],
            [human, human_like(len(marked), seed=seed + 4)], [mixed, marked], [human, mixed, edited],
            [edited, edited], [shifted, marked, marked]]


def _candidates(key: WatermarkKey) -> list[Candidate]:
    from detector.result import salted_candidates

    return salted_candidates([Candidate.inline(key)]) if key.spec.mode == "diverse" else [Candidate.inline(key)]


@pytest.mark.parametrize("key", [KEY, _DUAL, _KEYED, _DIVERSE], ids=["gumbel", "dual", "keyed", "diverse"])
def test_spans_only_for_forms_that_can_win_give_the_exhaustive_result(key):
    from detector.forms import detect_forms_exhaustive
    from detector.multikey import KeySet, detect_many

    others = [Candidate.inline(WatermarkKey(0xB0B + i, key.spec)) for i in range(3)]
    configs = [DetectorConfig(), DetectorConfig(threshold=1e-3), DetectorConfig(test="sum"),
               DetectorConfig(spans=False), DetectorConfig(span_min_length=16)]
    if key.spec.algorithm == "dual_key_gumbel" and key.spec.coin == "ordinary":
        configs.append(DetectorConfig(dual_statistic="weighted"))
    cases = 0
    for seed in range(3):
        generating = key.with_salt(5) if key.spec.mode == "diverse" else key
        marked, _ = generate(generating, 180, seed=seed)
        for forms in _variants(marked, 100 + seed):
            for config in configs:
                for candidates, run in ((_candidates(key), None), (_candidates(key) + others, detect_many)):
                    keys = KeySet.of(candidates) if run is detect_many else candidates
                    got, got_form = detect_forms(forms, keys, config, run=run)
                    want, want_form = detect_forms_exhaustive(forms, keys, config, run=run)
                    assert got_form == want_form and got.to_dict() == want.to_dict(), (seed, forms, config)
                    cases += 1
    assert cases >= 200


def test_a_form_whose_span_beats_another_forms_whole_text_still_wins():
    # A short stretch inside a long text: its whole-text p (1e-7) loses to the other form's
    # (1e-38), its span (1e-43) wins; the screen must not drop it on its whole-text p.
    marked, _ = generate(KEY, 200, seed=21)
    stretch = human_like(2000, seed=22) + marked[:40] + human_like(2000, seed=23)
    short = marked[100:130]
    from detector.forms import detect_forms_exhaustive

    for forms, winner in (([short, stretch], 1), ([stretch, short], 0)):
        got, form = detect_forms(forms, [Candidate.inline(KEY)], DetectorConfig())
        want, _ = detect_forms_exhaustive(forms, [Candidate.inline(KEY)], DetectorConfig())
        assert form == winner and got.spans and got.to_dict() == want.to_dict()


def test_a_form_that_cannot_win_gets_no_span_search(monkeypatch):
    from detector import detect as detect_module

    marked, _ = generate(KEY, 200, seed=11)
    human = human_like(200, seed=12)
    searched = []
    original = detect_module.Pending.result

    def counting(self, **options):
        searched.append(self.whole_log10_p)
        return original(self, **options)

    monkeypatch.setattr(detect_module.Pending, "result", counting)
    result, form = detect_forms([human, marked, human_like(220, seed=13)], [Candidate.inline(KEY)], DetectorConfig())
    assert form == 1 and result.watermarked
    assert len(searched) == 1 and searched[0] < -6  # the watermarked form's only


# --- one request's work: per-key entries and scores ----------------------------------------

_FORM_KEYS = {"gumbel": KEY, "dual": _DUAL, "keyed": _KEYED, "diverse": _DIVERSE}


@pytest.mark.parametrize("name", list(_FORM_KEYS))
def test_forms_with_a_score_memo_give_the_exhaustive_result_and_record_the_detectors_scores(name, monkeypatch):
    # Random texts (watermarked, edited, human, mixed) and random form lists, one key or
    # several: detect_forms (spans and Holm's adjustment for the winner only, scores recorded
    # in a memo) reports what scoring every form in full reports, and the memo holds, for
    # each form and key computed in full, the very per-token scores the detector tests.
    from detector import scoring
    from detector.detect import statistic_for
    from detector.forms import detect_forms_exhaustive
    from detector.multikey import KeySet, detect_many

    computed = []  # PRF passes of the scoring module (the memo computes through these)
    for function in ("dual_scores", "token_scores"):
        def counting(*args, _original=getattr(scoring, function), **kwargs):
            computed.append(1)
            return _original(*args, **kwargs)

        monkeypatch.setattr(scoring, function, counting)
    tails = _counted_exact_tails(monkeypatch)
    key = _FORM_KEYS[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    cases = 0
    for trial in range(6):
        generating = key.with_salt(int(rng.integers(0, 16))) if key.spec.mode == "diverse" else key
        marked, _ = generate(generating, int(rng.integers(90, 260)), seed=1000 + trial)
        # Heavily edited forms too, where Tr-GoF's exact tail decides (and is deferred).
        heavy = [int(rng.integers(1, 2000)) if rng.random() < 0.5 else t for t in marked]
        half = len(heavy) // 2
        pool = _variants(marked, 200 + trial) + [
            [human_like(200, seed=300 + trial), human_like(180, seed=400 + trial)],
            [heavy[:half] + human_like(half, seed=500 + trial), heavy], [heavy, heavy[:half]],
            [heavy, [int(rng.integers(1, 2000)) if rng.random() < 0.3 else t for t in heavy]]]
        others = [Candidate.inline(WatermarkKey(int(rng.integers(1, 2**62)), key.spec)) for _ in range(2)]
        config = DetectorConfig(threshold=float(rng.choice([1e-6, 1e-3, 0.05])),
                                test=str(rng.choice(["auto", "auto", "sum", "trgof"])),
                                spans=bool(rng.random() < 0.8))
        for forms in [pool[int(i)] for i in rng.choice(len(pool), size=5, replace=False)] + pool[-3:]:
            for candidates, run in ((_candidates(key), None), (_candidates(key) + others, detect_many)):
                keys = KeySet.of(candidates) if run is detect_many else candidates
                memo = scoring.ScoreMemo()
                tails.clear()
                got, got_form = detect_forms(forms, keys, config, run=run, memo=memo)
                got_tails = len(tails)
                want, want_form = detect_forms_exhaustive(forms, keys, config, run=run)
                assert got_form == want_form and got.to_dict() == want.to_dict(), (trial, config)
                assert got_tails <= len(tails) - got_tails  # Tr-GoF's exact tails: never more
                # The memo holds the winning form's scores under its best key: read back without
                # running the PRF, they are the scores of a fresh computation, bit for bit.
                best = next(c for c in candidates if c.info == (got.key or candidates[0].info))
                if got.key is not None or run is None:
                    spec = best.key.spec
                    scored = memo.positions(np.asarray(forms[got_form]), spec.context_width, spec.dedup)
                    statistic = statistic_for(best, config)
                    before = len(computed)
                    recorded = (getattr(memo.dual(best.key, scored), statistic) if statistic in ("max", "weighted")
                                else memo.token_scores(best.key, scored, statistic))
                    assert len(computed) == before  # recorded by the detector, not computed now
                    fresh = scoring.token_scores(best.key, scoring.scored_positions(
                        np.asarray(forms[got_form]), spec.context_width, spec.dedup), statistic)
                    assert recorded.tolist() == fresh.tolist()
                cases += 1
    assert cases >= 90


def test_only_the_winning_form_gets_holms_adjustment(monkeypatch):
    from detector import detect as detect_module
    from detector.forms import detect_forms_exhaustive

    marked, _ = generate(KEY, 200, seed=31)
    forms = [human_like(200, seed=32), marked, marked[:120] + human_like(80, seed=33)]
    keys = [Candidate.inline(KEY)] + [Candidate.inline(WatermarkKey(0xB0B + i, KEY.spec)) for i in range(3)]
    adjusted = []
    original = detect_module.Pending.adjusted_per_key

    def counting(self, *args, **kwargs):
        adjusted.append(self.whole_log10_p)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(detect_module.Pending, "adjusted_per_key", counting)
    got, form = detect_forms(forms, keys, DetectorConfig())
    assert form == 1 and len(adjusted) == 1  # three forms scored, one set of per-key entries built
    want, _ = detect_forms_exhaustive(forms, keys, DetectorConfig())
    assert got.to_dict() == want.to_dict() and len(got.per_key) == 4


def test_trgofs_exact_tail_only_for_forms_that_can_win(monkeypatch):
    # A heavily edited text (Tr-GoF's exact tail runs: its bound is below the sum's p) and
    # a form of it whose second half is another text: the weaker form's exact tail would run
    # too if it were scored in full, but its lower bound already loses to the first's p.
    from detector.forms import detect_forms_exhaustive

    marked, _ = generate(KEY, 240, seed=1)
    rng = np.random.default_rng(1)
    edited = [int(rng.integers(1, 2000)) if rng.random() < 0.5 else t for t in marked]
    forms = [edited[:120] + human_like(120, seed=51), edited]
    tails = _counted_exact_tails(monkeypatch)
    got, form = detect_forms(forms, [Candidate.inline(KEY)], DetectorConfig())
    assert form == 1 and len(tails) == 1
    tails.clear()
    want, want_form = detect_forms_exhaustive(forms, [Candidate.inline(KEY)], DetectorConfig())
    assert len(tails) == 2  # scored in full, both forms need the exact tail
    assert want_form == form and got.to_dict() == want.to_dict()
    assert got.per_key[0].log10_p_trgof is not None and got.per_key[0].log10_p_trgof < -5


def _counted_exact_tails(monkeypatch) -> list[int]:
    """The list Tr-GoF's exact tails (the crossing probability's recursion) are counted into,
    one entry (the n) per tail computed from now on."""
    from detector import trgof

    tails: list[int] = []
    original = trgof._crossing_exact

    def counting(boundaries, n):
        tails.append(n)
        return original(boundaries, n)

    monkeypatch.setattr(trgof, "_crossing_exact", counting)
    return tails
