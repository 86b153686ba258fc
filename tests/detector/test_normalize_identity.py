"""The fast normalisation (one pass for both forms, each step skipped when the text holds no
character it could change) is the reference implementation's output exactly: the same
texts, origins and change counts, in the same order, on every input. The reference is the
module as it was before (tests/detector/normalize_reference.py)."""

from __future__ import annotations

import pydoc
import random

import pytest

from detector.forms import SPACED_WORDS, text_forms
from detector.normalize import BIDI_CONTROLS, INVISIBLE_RANGES, KEYCAP, normalize, normalize_forms
from tests.detector import normalize_reference as reference

# Pieces a random text is made of: the characters each step acts on, their neighbours in
# real texts, and the ones that must be left alone.
ASCII = [*"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'\"()-_#*",
         " ", " ", " ", "  ", "    ", "\t", "\t\t", " \t", "\t ", "\n", "\n\n", "\r", "\r\n", "\r\r\n", "\n\r"]
LOOKALIKES = [*reference.HOMOGLYPHS, *"\u0431\u0434\u0436\u0436\u044f\u03b1\u03b2\u03bb\u03c9\u1f00\u1f71",
              "\u043f\u0440\u0438\u0432\u0435\u0442", "\u03ba\u03b1\u03bb\u03b7"]
HIDDEN = [*BIDI_CONTROLS, *(chr(c) for lo, hi in INVISIBLE_RANGES for c in {lo, hi, (lo + hi) // 2}),
          "\u200b", "\u200c", "\u200d", "\ufe0f", "\ufe0e", "\U000e0067", "\u180e"]
NFKC = [*"\uff21\uff41\uff11\ufb01\ufb02\u00a0\u2460\u3000\u00bd\u2126\u212b\u1e9b\u00b2\u2002\u2009\u3164\uffa0",
        "\u1100\u1161\u11a8", "\u1100\u1161", "\u0915\u093c", "\u0b47\u0b3e", "\u2026", "\u33a1", "\ufdfa"]
COMBINING = [*"\u0301\u0300\u0308\u0323\u0327\u030a\u0345\u0338\u20dd\u3099"]
EMOJI = ["\U0001f468\u200d\U0001f469\u200d\U0001f467", "1\ufe0f\u20e3", "#\ufe0f" + KEYCAP,
         "\U0001f3f3\ufe0f\u200d\U0001f308", "\U0001f1eb\U0001f1f7", "\u2764\ufe0f", "\U0001f44d\U0001f3fd",
         "\U0001f3f4\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f"]
OTHER = [*"\u2028\u2029\x85\u00e9\u00c5\u4e2d\u6587\u05e9\u05dc\u0627\u0644\u06cc\u0928\u0939\u00df\u0130\u2019\u201c\u2014",
         "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645", "\u05e9\u05dc\u05d5\u05dd\u200f \u05e2\u05d5\u05dc\u05dd"]
POOLS = [ASCII, ASCII, ASCII, LOOKALIKES, HIDDEN, NFKC, COMBINING, EMOJI, OTHER]


def random_text(rng: random.Random) -> str:
    pieces = []
    for _ in range(rng.randrange(0, 60)):
        roll = rng.random()
        if roll < 0.03:  # any code point, astral planes included, surrogates not
            code = rng.randrange(0x110000)
            pieces.append(chr(code) if not 0xD800 <= code <= 0xDFFF else "?")
        else:
            pieces.append(rng.choice(rng.choice(POOLS)))
    return "".join(pieces)


def pydoc_texts() -> list[str]:
    texts = []
    for module in ("json", "textwrap", "collections", "unicodedata", "re"):
        doc = pydoc.render_doc(module, renderer=pydoc.plaintext)
        texts += [doc[:1000], doc[:20000], doc.replace("\n", "\r\n")[:5000]]
    return texts


HAND_PICKED = [
    "", " ", "\t", "  \t ", "\r\n", "\r", "\n\r\n", "plain text, nothing to undo.",
    "The quick brown fox.\n\nIt jumps over the lazy dog.",
    "T\u200bhe qu\u200dick br\u043ewn f\u043ex \u202ejumps\u202c ov\u0435r  the\t\tl\u0430zy d\ufeffog.",
    "\uff46\uff55\uff4c\uff4c\u00a0width \ufb01ne", "Code:\n\n    if x:\u200b  y  =\tfull\uff41 \u0430b",
    "pa\u200bss w\u043erd", "def f(x):\n    return x + 1", "\u0420\u043e\u0441\u0441\u0438\u044f \u0441\u0438\u043b\u044c\u043d\u0430",
    "\u0430\u0441\u0435 \u043e\u0440 in a Latin text", "e\u0301\u0301 \u1100\u1161\u11a8 x\u0308\u200b\u0301",
    "line\u2028two\u2029three\x85four\r\nfive\rsix", "1\ufe0f\u20e3 \U0001f468\u200d\U0001f469 a\ufe0fb",
]


def fields(out) -> tuple | None:
    """Everything a normalisation says, the change counts in their order (a report lists them)."""
    return None if out is None else (out.text, list(out.changes.items()), out.origin, out.original_length)


def assert_same(text: str) -> None:
    old = {collapse: fields(reference.normalize(text, collapse_whitespace=collapse)) for collapse in (True, False)}
    for collapse in (True, False):
        assert fields(normalize(text, collapse_whitespace=collapse)) == old[collapse], (text, collapse)
    both = normalize_forms(text)
    assert (fields(both.collapsed), fields(both.spaces_kept)) == (old[True], old[False]), text
    forms, full = text_forms(text)
    assert fields(full) == old[True], text
    expected = [("as_sent", text, None)]
    for name, candidate in (("normalized", old[True]), ("normalized_spaces_kept", old[False])):
        if name == "normalized" and old[True][0] != old[False][0] and not SPACED_WORDS.search(old[False][0]):
            continue  # no widened space between words: the collapsed form is not scored
        if all(candidate[0] != other for _, other, _ in expected):
            expected.append((name, candidate[0], candidate))
    assert [(f.name, f.text, fields(f.normalized)) for f in forms] == expected, text


@pytest.mark.parametrize("text", HAND_PICKED)
def test_hand_picked_texts_normalise_as_the_reference_does(text):
    assert_same(text)


def test_pydoc_texts_normalise_as_the_reference_does():
    for text in pydoc_texts():
        assert_same(text)


def test_random_unicode_texts_normalise_as_the_reference_does():
    rng = random.Random(20261203)
    for _ in range(3000):
        assert_same(random_text(rng))


def test_the_identity_corpus_exercises_every_step():
    # Without this the random corpus could drift into texts no step changes.
    rng = random.Random(20261203)
    seen = set()
    for _ in range(3000):
        seen.update(normalize(random_text(rng)).changes)
    assert seen == {"zero_width", "bidi", "nfkc", "homoglyph", "line_endings", "whitespace"}
