"""The probe guard's bar (issue 31, fifth round): two queries are one text's family when they
share half the smaller one's 5-token windows, at most 100, however much padding either holds;
a distinct text quoting fewer windows than that of an earlier one is not."""

from __future__ import annotations

import random

from service.access import probe

KEY = bytes(range(64))


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1_000, 50_000) for _ in range(n)]


def _sketch(ids: list[int]) -> probe.Sketch:
    return probe.sketch_of_forms(KEY, [ids])


def _edited(rng: random.Random, ids: list[int], share: float) -> list[int]:
    out = list(ids)
    for p in rng.sample(range(len(out)), round(share * len(out))):
        out[p] = rng.randrange(1_000, 50_000)
    return out


def test_a_text_quoting_80_tokens_of_an_earlier_one_is_another_family_at_half_not_at_a_quarter():
    rng = random.Random(1)
    hub = _ids(rng, 300)
    quote = _ids(rng, 100) + hub[100:180] + _ids(rng, 120)  # 76 of its 296 windows are the hub's
    assert not probe.related(_sketch(quote), _sketch(hub), 0.5)
    # The round-four bar (a quarter of at most 400) merged them: bench.legit_use's licence clauses.
    assert probe.related(_sketch(quote), _sketch(hub), 0.5, density=0.25, cap=400)


def test_an_edit_round_joins_its_text_padded_or_not():
    rng = random.Random(2)
    text = _ids(rng, 200)
    edit = _edited(rng, text, 0.05)  # about 150 of its 196 windows kept
    for a, b in ((text, edit), (text + _ids(rng, 400), edit), (text + _ids(rng, 400), edit + _ids(rng, 400)),
                 (_ids(rng, 300) + text, edit + _ids(rng, 300))):
        assert probe.related(_sketch(b), _sketch(a), 0.5)


def test_padding_raises_the_bar_to_the_cap_at_most():
    """What an attacker who pads meets: 100 windows whatever either query holds besides (the
    quarter bar met the same cap once padded: bench.guard_replay)."""
    rng = random.Random(3)
    text = _ids(rng, 110)  # 106 windows
    assert probe.related(_sketch(text + _ids(rng, 800)), _sketch(text + _ids(rng, 800)), 0.5)
    piece = text[:98]  # 94 windows: under the cap once both are padded past 200 windows
    assert not probe.related(_sketch(piece + _ids(rng, 400)), _sketch(piece + _ids(rng, 400)), 0.5)


def test_a_short_query_joins_at_half_its_windows():
    rng = random.Random(4)
    piece = _ids(rng, 60)
    assert probe.related(_sketch(_edited(rng, piece, 0.05)), _sketch(piece), 0.5)
    assert not probe.related(_sketch(_ids(rng, 60)), _sketch(piece), 0.5)
