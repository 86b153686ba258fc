"""detector.segmentation: a generation's own token ids recovered from its text, proven by the
SHA-256 of the ids, guided by the 8-grams it recorded."""

from __future__ import annotations

import random

from detector.segmentation import K, SegmentationTable, hash_ids, merge_space_runs, recover

# A toy vocabulary: every byte, plus merged pieces an encoder would not always choose.
PIECES = {i: bytes([i]) for i in range(256)}
for extra in (b"\n    ", b"\n   ", b"   ", b" display", b" displays", b"def", b" def", b"ss", b"ab", b"abc"):
    PIECES[len(PIECES)] = extra
EOS = 9999
TABLE = SegmentationTable.of(PIECES, end_ids=[EOS])
BY = {v: k for k, v in PIECES.items()}


def ids(*pieces: bytes) -> list[int]:
    return [BY[p] for p in pieces]


def text_of(token_ids) -> str:
    return b"".join(PIECES[t] for t in token_ids if t != EOS).decode()


def known_of(token_ids):
    grams = {tuple(token_ids[i:i + K]) for i in range(len(token_ids) - K + 1)}
    return lambda window: tuple(window) in grams


def test_the_models_merged_tokens_are_recovered_not_encodes():
    rng = random.Random(1)
    words = [b" display", b"s", b"\n    ", b"def", b" x", b"abc", b"ss", b"\n   ", b" def", b"   "]
    for _ in range(50):
        written = []
        for _ in range(40):
            piece = rng.choice(words)
            written += ids(piece) if piece in BY else [BY[bytes([b])] for b in piece]
        text = text_of(written)
        canonical = [BY[bytes([b])] for b in text.encode()]  # an "encode" that never merges
        found = recover(text, canonical, TABLE, hash_ids(written), known_of(written))
        assert found is not None and list(found.token_ids) == written
        # Offsets cover the text, token by token.
        assert "".join(text[a:b] for a, b in found.offsets) == text


def test_an_end_of_sequence_id_the_engine_recorded_is_recovered():
    written = ids(b" display", b"s", b"\n    ", b"def") + [BY[bytes([c])] for c in b" f(x): pass"] + [EOS]
    text = text_of(written)
    found = recover(text, [BY[bytes([b])] for b in text.encode()], TABLE, hash_ids(written), known_of(written))
    assert found is not None and list(found.token_ids) == written
    assert found.offsets[-1] == (len(text), len(text))


def test_encodes_ids_are_accepted_without_a_search():
    written = [BY[bytes([b])] for b in b"plain text here"]
    found = recover(text_of(written), written, TABLE, hash_ids(written), None, max_steps=0)
    assert found is not None and list(found.token_ids) == written


def test_nothing_is_accepted_without_the_recorded_hash():
    written = ids(b" display", b"s") + [BY[bytes([c])] for c in b" and more words to hash"]
    text = text_of(written)
    canonical = [BY[bytes([b])] for b in text.encode()]
    assert recover(text, canonical, TABLE, hash_ids(written[:-1]), known_of(written)) is None
    assert recover(text, canonical, TABLE, "0" * 64, None, max_steps=500) is None  # bounded without k-grams


def test_multibyte_characters_map_to_character_offsets():
    written = [BY[bytes([b])] for b in "naïve café déjà".encode()]
    text = text_of(written)
    found = recover(text, written[::-1][::-1], TABLE, hash_ids(written), known_of(written))
    assert found is not None
    starts = [a for a, _ in found.offsets]
    assert starts == sorted(starts) and found.offsets[-1][1] == len(text)


# --- whitespace runs as the model writes them (no ledger) -----------------------------------


def _encode_word(word: str) -> list[int]:
    """The toy vocabulary's encode of a word without its space (``def`` is one token)."""
    data = word.encode()
    return [BY[data]] if data in BY else [BY[bytes([b])] for b in data]


def test_a_run_encode_splits_is_written_whole_and_the_word_without_its_space():
    # encode leaves the run's last space to the word: "\n" " " " " " def" (4 tokens); the
    # model writes "\n   " then "def" (the vocabulary has both), 2 tokens.
    text = "x\n   def"
    canonical = ids(b"x", b"\n", b" ", b" ", b" def")
    merged = merge_space_runs(text, canonical, TABLE, _encode_word)
    assert merged is not None and list(merged.token_ids) == ids(b"x", b"\n   ", b"def")
    assert [text[a:b] for a, b in merged.offsets] == ["x", "\n   ", "def"]


def test_a_run_encode_already_writes_whole_is_no_second_form():
    # "\n    def": encode's "\n   " + " def" is as short as any other split: left alone.
    assert merge_space_runs("x\n    def", ids(b"x", b"\n   ", b" def"), TABLE, _encode_word) is None
    # No run at all, and a run at the end of the text.
    assert merge_space_runs("abc def", ids(b"abc", b" def"), TABLE, _encode_word) is None
    assert merge_space_runs("abc   ", ids(b"abc", b"   "), TABLE, _encode_word) is None


def test_only_runs_re_segmented_where_that_takes_fewer_tokens_the_rest_kept():
    text = "def\n   def x\n    def"
    canonical = ids(b"def", b"\n", b" ", b" ", b" def") + [BY[b" "], BY[b"x"]] + ids(b"\n   ", b" def")
    merged = merge_space_runs(text, canonical, TABLE, _encode_word)
    assert merged is not None
    assert list(merged.token_ids) == ids(b"def", b"\n   ", b"def", b" ", b"x", b"\n   ", b" def")
    assert "".join(text[a:b] for a, b in merged.offsets) == text


def test_a_word_that_does_not_re_encode_to_its_bytes_or_ids_outside_the_table_leave_the_text_alone():
    canonical = ids(b"x", b"\n", b" ", b" ", b" def")
    assert merge_space_runs("x\n   def", canonical, TABLE, lambda word: [BY[b"x"]]) is None
    assert merge_space_runs("x\n   def", canonical, TABLE, lambda word: [123456]) is None
    assert merge_space_runs("x\n   def", canonical + [EOS], TABLE, _encode_word) is None  # a special id
    assert merge_space_runs("not the text", canonical, TABLE, _encode_word) is None
