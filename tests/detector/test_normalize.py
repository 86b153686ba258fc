"""Normalisation undoes tokenisation attacks and reports what it changed."""

from __future__ import annotations

from detector.normalize import normalize


def test_plain_text_is_unchanged():
    text = "The quick brown fox.\n\nIt jumps over the lazy dog."
    out = normalize(text)
    assert out.text == text and not out.changed and out.to_dict() == {"changed": False, "changes": {}}


def test_zero_width_bidi_homoglyph_and_spaces_are_undone():
    original = "The quick brown fox jumps over the lazy dog."
    attacked = ("T\u200bhe qu\u200dick br\u043ewn f\u043ex \u202ejumps\u202c ov\u0435r  the\t\tl\u0430zy "
                "d\ufeffog.")
    out = normalize(attacked)
    assert out.text == original
    assert out.changes == {"zero_width": 3, "bidi": 2, "homoglyph": 4, "whitespace": 2}


def test_nfkc_compatibility_forms():
    out = normalize("ｆｕｌｌ\u00a0width ﬁne")
    assert out.text == "full width fine" and out.changes["nfkc"] > 0
