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


def test_nfkc_counts_each_rewritten_character_once():
    # A ligature lengthens the text: counting mismatches position by position after it
    # reported every later character as rewritten.
    assert normalize("\ufb01nal \ufb02ow and more text after it " * 10).changes == {"nfkc": 20}
    assert normalize("ｆｕｌｌ width").changes == {"nfkc": 4}
    # A decomposed accent (NFD, as macOS file names and some PDFs give it) composes: the
    # letter and its mark, two characters of the original, per composed letter.
    assert normalize("cafe\u0301 and more words after it " * 10).changes == {"nfkc": 20}


def test_offsets_map_back_through_composed_accents():
    # NFKC composes e + U+0301 into one character, so per-character NFKC differs from the
    # whole text's; the offsets of everything after must still land on its own characters.
    text = "re\u0301sume\u0301 cafe\u0301 " * 40 + "the watermark is here"
    out = normalize(text)
    start = out.text.index("watermark")
    assert out.original_offsets([(start, start + len("watermark"))]) == [
        (text.index("watermark"), text.index("watermark") + len("watermark"))]
    cuts = list(range(0, len(out.text) + 1, 7)) + [len(out.text)]
    ranges = out.original_offsets(list(zip(cuts, cuts[1:])))
    assert "".join(text[s:e] for s, e in ranges) == text


INVISIBLE = {"variation selector 16": "\ufe0f", "variation selector 1": "\ufe00", "tag": "\U000e0041",
             "variation selector 17": "\U000e0100", "invisible times": "\u2062", "hangul filler": "\u3164",
             "halfwidth hangul filler": "\uffa0", "hangul choseong filler": "\u115f", "khmer vowel inherent": "\u17b4",
             "mongolian free variation selector": "\u180b", "invisible separator": "\u2063"}


def test_every_invisible_character_between_latin_letters_is_removed():
    # Each is a Unicode default-ignorable code point: drawn as nothing, but it splits the
    # tokens around it (each hid a watermarked text from the detector before).
    for name, ch in INVISIBLE.items():
        out = normalize(f"Hel{ch}lo wor{ch}ld, t{ch}his is text “{ch}quoted” —{ch}–")
        assert out.text == "Hello world, this is text “quoted” —–", name
        assert out.changes == {"zero_width": 5}, name


def test_joiners_selectors_and_marks_of_genuine_text_are_kept():
    genuine = [
        "Family \U0001f468\u200d\U0001f469\u200d\U0001f467 and love \u2764\ufe0f, flag \U0001f3f4\U000e0067\U000e0062"
        "\U000e0073\U000e0063\U000e0074\U000e007f.",   # emoji ZWJ sequence, VS16, tag sequence
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645 \u0628\u0631\u0648\u0645",  # Persian: ZWNJ inside a word
        "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u200b\u0e04\u0e23\u0e31\u0e1a",  # Thai: ZWSP between words
        "\u05e9\u05dc\u05d5\u05dd\u200f\u05e2\u05d5\u05dc\u05dd",  # Hebrew with a right-to-left mark
        "\u845b\U000e0100\u57ce\u5e02",  # an ideographic variation sequence
        "Press 1\ufe0f\u20e3 or #\ufe0f\u20e3 now",  # keycap emoji: ASCII, VS16, enclosing keycap
    ]
    for text in genuine:
        out = normalize(text)
        assert out.text == text and not out.changed, (text, out.changes)


def test_line_endings_become_newlines_in_every_normalised_form():
    # Windows line endings (a paste from a Windows clipboard, an HTML form post) re-tokenise
    # every line break: through the API they took a watermarked text from log10 p -154 to -90.
    text = "def f(x):\r\n    return x\rnext line\u2028and\u2029last\x85end"
    for collapse in (True, False):
        out = normalize(text, collapse_whitespace=collapse)
        assert out.changes.get("line_endings") == 5
    out = normalize(text, collapse_whitespace=False)
    assert out.text == "def f(x):\n    return x\nnext line\nand\nlast\nend"
    cuts = list(range(len(out.text) + 1))
    ranges = out.original_offsets(list(zip(cuts, cuts[1:])))
    assert "".join(text[s:e] for s, e in ranges) == text
    assert ranges[out.text.index("\n")] == (9, 11)  # the newline stands for the whole CRLF
