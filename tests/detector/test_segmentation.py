"""detector.segmentation: a generation's own token ids recovered from its text, proven by the
SHA-256 of the ids, guided by the 8-grams it recorded."""

from __future__ import annotations

import random

from detector.segmentation import (_RUN_BEFORE_WORD, _SPACE_BYTES, K, Recovered, SegmentationTable, _byte_class, _greedy,
                                   _is_space, hash_ids, merge_space_runs, recover)

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


# merge_space_runs as it was at main 004efbc (a loop over every token, offsets by a loop over
# every character), kept verbatim as the reference of the array version.
def _previous_char_offsets(text: str, data: bytes, bounds: Sequence[int], extra: int) -> tuple[tuple[int, int], ...]:
    """Character ranges of the tokens whose byte ranges are ``bounds`` [n + 1] (a token that
    splits a character is counted from that character), plus ``extra`` empty ones at the end."""
    char_at = [0] * (len(data) + 1)
    position = 0
    for index, character in enumerate(text):
        width = len(character.encode("utf-8"))
        for b in range(position, position + width):
            char_at[b] = index
        position += width
    char_at[len(data)] = len(text)
    out = [(char_at[bounds[i]], char_at[bounds[i + 1]]) for i in range(len(bounds) - 1)]
    out.extend([(len(text), len(text))] * extra)
    return tuple(out)


def _previous_merge_space_runs(text: str, canonical: Sequence[int], table: SegmentationTable,
                     encode: Callable[[str], Sequence[int]]) -> Recovered | None:
    """merge_space_runs at 004efbc, before its tokens were read through arrays (verbatim)."""
    if not _RUN_BEFORE_WORD.search(text):  # prose with single spaces: nothing to re-segment
        return None
    pieces = [table.pieces.get(int(t)) for t in canonical]
    if any(piece is None for piece in pieces):
        return None
    bounds = [0]
    for piece in pieces:
        bounds.append(bounds[-1] + len(piece))
    data = b"".join(pieces)
    if data != text.encode("utf-8"):
        return None
    at_boundary = {b: i for i, b in enumerate(bounds)}
    edits: list[tuple[int, int, list[int]]] = []  # (first, last) canonical tokens -> the run's and word's
    spaces = [_is_space(piece) for piece in pieces]
    i, n = 0, len(pieces)
    while i < n:
        if not spaces[i]:
            i += 1
            continue
        j = i
        while j < n and spaces[j]:
            j += 1
        if j < n and len(pieces[j]) > 1 and pieces[j][0] == 0x20 and pieces[j][1] not in _SPACE_BYTES:
            start = bounds[j] + 1
            kind, end = _byte_class(data[start]), start
            while end < len(data) and data[end] not in _SPACE_BYTES and _byte_class(data[end]) == kind:
                end += 1
            last = at_boundary.get(end)
            run = _greedy(data[bounds[i]:start], table) if last is not None else None
            line_break = b"\n" in data[bounds[i]:start]

            def shorter(words: int) -> bool:
                return (len(run) < j - i and words <= last - j) or (line_break and len(run) + words < last - i)

            if run is not None and shorter(1):  # the word takes a token at least: else no encode
                try:
                    word = [int(t) for t in encode(data[start:end].decode("utf-8"))]
                except UnicodeDecodeError:
                    word = []
                same_bytes = word and all(t in table.pieces for t in word) and \
                    b"".join(table.pieces[t] for t in word) == data[start:end]
                if same_bytes and shorter(len(word)):
                    edits.append((i, last, run + word))
                    i = last
                    continue
        i = j
    if not edits:
        return None
    out: list[int] = []
    at = 0
    for first, last, tokens in edits:
        out.extend(int(t) for t in canonical[at:first])
        out.extend(tokens)
        at = last
    out.extend(int(t) for t in canonical[at:])
    out_bounds = [0]
    for token in out:
        out_bounds.append(out_bounds[-1] + len(table.pieces[token]))
    return Recovered(tuple(out), _previous_char_offsets(text, data, out_bounds, 0))


def test_merge_space_runs_gives_what_the_token_loop_gave():
    rng = random.Random(7)
    words = [b"x", b"def", b"abc", b"12", b"3", b"+=", b"(", b"\xc3\xa9t\xc3\xa9", b"\xe6\x97\xa5", b"ss", b"display",
             b" def", b" display", b" displays", b" def", b" display"]
    spaces = [b" ", b"  ", b"   ", b"\n", b"\n   ", b"\n    ", b"\t", b"\n\t ", b" \n  "]
    differ = 0
    for _ in range(1000):
        parts = []
        for _ in range(rng.randrange(1, 30)):
            parts.append(rng.choice(spaces if rng.random() < 0.4 else words))
        text = b"".join(parts).decode()
        # Some segmentation of the text into the toy vocabulary (an encode's or another).
        data, canonical, at = text.encode(), [], 0
        while at < len(data):
            options = [p for p in (data[at:at + k] for k in range(1, 9)) if p in BY]
            piece = rng.choice(options)
            canonical.append(BY[piece])
            at += len(piece)
        expected = _previous_merge_space_runs(text, canonical, TABLE, _encode_word)
        assert merge_space_runs(text, canonical, TABLE, _encode_word) == expected, (text, canonical)
        differ += expected is not None
    assert differ > 30  # the property is tested where a run is re-segmented, not only where none is
