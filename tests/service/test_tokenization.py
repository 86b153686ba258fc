"""service.tokenization.encode_with_offsets: a byte-level BPE tokenizer's ids and character
offsets piece by piece (BytePieces, issue 30 item 5) are exactly the tokenizer's own, on the
text forms detection tokenises, on random strings of every character class the pattern
distinguishes, and where it falls back (non-ASCII text, added tokens' text)."""

from __future__ import annotations

import random

import pytest

from detector.forms import text_forms
from service.tokenization import BytePieces, encode_with_offsets, load_text_encoder, load_tokenizer
from tests.service.gateway import TEST_MODEL

TEXTS = [
    "",
    " Windowse and are considered.\n\n    For backwardsction, error swanner patch()\n\n    True_ gai",
    "def f(x):\n\treturn x  +  1\r\n\r\n# it's done, isn't it? We'll see; they're 'quoted' 42x 3.14\n",
    "Spaced  words   here\u00a0and “curly” quotes — dash, café\n    indented",
    "tokens <|eos|> inside <|bos|>text<|pad|>",
    "   leading and trailing   \n\n",
    "'s's 're've'm'll'd 'S 'x ''s  's\t's",
]


@pytest.fixture(scope="module", params=["tokenizer_json", "transformers"])
def backend(request):
    if request.param == "tokenizer_json":
        return load_text_encoder(TEST_MODEL)._backend
    return load_tokenizer(TEST_MODEL, local_only=True)._tokenizer


def _reference(backend, text):
    encoding = backend.encode(text, add_special_tokens=False)
    return encoding.ids, encoding.offsets


def test_the_bundled_tokenizer_is_encoded_piece_by_piece(backend):
    assert BytePieces.of(backend) is not None  # else the tests below only test the fallback


def test_the_ids_and_offsets_are_the_tokenizers_on_the_detected_forms(backend):
    for text in TEXTS:
        forms, _ = text_forms(text)
        for form in forms:
            assert encode_with_offsets(backend, form.text) == _reference(backend, form.text), form


def test_the_ids_and_offsets_are_the_tokenizers_on_random_strings(backend):
    rng = random.Random(30)
    # Every class of the pattern: letters, digits, white space of each kind, punctuation, the
    # contractions' quote and letters, and characters outside the accepted set (fallback).
    alphabet = (["a", "b", "Z", "s", "t", "re", "ve", "m", "ll", "d", "0", "7", " ", " ", "  ", "\t", "\n", "\r",
                 "'", "'", ".", ",", "_", "-", "(", "<|", "|>", "\x0b", "\x0c", "\x1f", "\x7f", "é", "\u00a0", "—",
                 "😀"] + ["<|bos|>", "<|eos|>"])
    accepted = [c for c in alphabet if BytePieces.ACCEPTED.fullmatch(c) and "|" not in c]
    for i in range(4_000):
        chars = accepted if i % 2 else alphabet  # half of them piece by piece, the others mostly not
        text = "".join(rng.choice(chars) for _ in range(rng.randint(0, 40)))
        assert encode_with_offsets(backend, text) == _reference(backend, text), repr(text)


def test_a_piece_met_again_gives_the_same_answer(backend):
    text = TEXTS[1]
    assert encode_with_offsets(backend, text) == encode_with_offsets(backend, text) == _reference(backend, text)
