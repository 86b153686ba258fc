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


def test_offsets_map_back_to_the_original_text():
    original = "Code:\n\n    if x:\u200b  y  =\tfull\uff41 \u0430b"
    out = normalize(original)
    assert out.changed and len(out.origin) == len(out.text)
    # Ranges that tile the normalised text tile the original, each on its source characters.
    cuts = list(range(0, len(out.text) + 1, 3))
    if cuts[-1] != len(out.text):
        cuts.append(len(out.text))
    ranges = out.original_offsets(list(zip(cuts, cuts[1:])))
    assert "".join(original[s:e] for s, e in ranges) == original
    for (s, e), (ns, ne) in zip(ranges, zip(cuts, cuts[1:])):
        assert out.text[ns:ne].strip() == "" or original[s:e].strip() != ""


def test_unchanged_text_keeps_its_offsets():
    text = "plain text, one space each."
    out = normalize(text)
    assert not out.changed and out.text == text
    assert out.original_offsets([(0, 5), (5, 10)]) == [(0, 5), (5, 10)]


def test_genuine_cyrillic_and_greek_text_is_left_alone():
    for text in ("Привет, как дела? Это обычный текст о погоде.", "Καλημέρα, ο καιρός είναι καλός σήμερα."):
        out = normalize(text)
        assert out.text == text and "homoglyph" not in out.changes


def test_lone_homoglyph_words_are_mapped_only_in_mostly_latin_text():
    # "a" and "I" typed in Cyrillic inside English: mapped; the same letters as words of a
    # Russian sentence ("а" = "and", "о" = "about"): kept.
    assert normalize("This is \u0430 test and \u0406 know it").text == "This is a test and I know it"
    russian = "Он говорил о погоде, а она молчала."
    assert normalize(russian).text == russian


def test_mixed_script_word_in_russian_text_is_still_mapped():
    out = normalize("Слово p\u0430ssword выглядит латинским.")
    assert "password" in out.text and out.changes["homoglyph"] == 1 and "Слово" in out.text
