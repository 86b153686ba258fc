"""A generation's own token ids, recovered from its text.

A model writes token sequences that its tokenizer's ``encode`` never produces: merged
newline+indent tokens, ``Ġdisplay`` + ``s`` where ``encode`` says ``Ġdisplays``. Scored as
``encode`` re-tokenises it, such a text loses the watermark of every token whose context
changed (issue 30: 18 of 30 generations of the bundled model re-tokenise differently). The
ledger does not store token ids, but it records the SHA-256 of a generation's ids and keyed
digests of their 8-grams (ledger.kgrams): enough to find the very sequence and prove it.

:func:`recover` searches the segmentations of the text's bytes into vocabulary tokens
(:class:`SegmentationTable`) depth first, the ``encode`` token first at each boundary it
shares, then longer tokens before shorter (the model's merged tokens); every path of 8 or
more tokens must end in an 8-gram the generation recorded (``known``), which prunes almost
every wrong turn after the first 8 tokens; a complete path is accepted only when the SHA-256
of its ids (optionally followed by an end-of-sequence id, which an engine may record and the
text never shows) is the recorded one. A wrong sequence is never accepted: a match is a
SHA-256 preimage of the recorded hash.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

K = 8
"""The k-gram width the ledger records (ledger.kgram_digests.K)."""
MAX_STEPS = 20_000
"""Tokens tried before the search gives up (the text is then scored as ``encode`` makes it)."""


def hash_ids(token_ids: Sequence[int]) -> str:
    """hex SHA-256 of the ids as 4-byte big-endian (ledger.chain.hash_token_ids)."""
    return hashlib.sha256(b"".join(int(t).to_bytes(4, "big") for t in token_ids)).hexdigest()


@dataclass(frozen=True)
class SegmentationTable:
    """Every ordinary token of a vocabulary by its bytes (special tokens are left out: a
    text's decode skips them), and the end-of-sequence ids an engine may record after the
    text's last token."""

    by_bytes: dict[bytes, int] = field(repr=False)
    pieces: dict[int, bytes] = field(repr=False)
    longest: int
    end_ids: tuple[int, ...] = ()

    @classmethod
    def of(cls, pieces: dict[int, bytes], end_ids: Sequence[int] = ()) -> "SegmentationTable":
        """From token id -> its bytes (the first id wins where two tokens share bytes)."""
        by_bytes: dict[bytes, int] = {}
        for token_id in sorted(pieces):
            if pieces[token_id]:
                by_bytes.setdefault(pieces[token_id], token_id)
        kept = {token_id: piece for piece, token_id in by_bytes.items()}
        return cls(by_bytes, kept, max(map(len, by_bytes), default=0), tuple(int(e) for e in end_ids))

    @functools.cached_property
    def by_id(self) -> "TokenArrays":
        """The pieces' lengths and classes as arrays by token id (built on first use, then
        kept: :func:`merge_space_runs` reads a text's tokens through them without a Python
        loop over the tokens)."""
        size = max(self.pieces, default=-1) + 1
        length = np.zeros(size, dtype=np.int64)
        space = np.zeros(size, dtype=bool)
        space_led = np.zeros(size, dtype=bool)
        for token_id, piece in self.pieces.items():
            length[token_id] = len(piece)
            space[token_id] = _is_space(piece)
            space_led[token_id] = len(piece) > 1 and piece[0] == 0x20 and piece[1] not in _SPACE_BYTES
        for array in (length, space, space_led):
            array.setflags(write=False)
        return TokenArrays(length, space, space_led)


@dataclass(frozen=True)
class TokenArrays:
    """A :class:`SegmentationTable`'s pieces by token id [V]: their byte lengths (0: no piece,
    a special token), whether each is all whitespace, and whether each is a space followed by
    a non-space (a space-led word: ``Ġname``)."""

    length: np.ndarray
    space: np.ndarray
    space_led: np.ndarray


@dataclass(frozen=True)
class Recovered:
    """The generation's ids and each one's character range in the text [(start, end)]
    (an end-of-sequence id: an empty range at the end)."""

    token_ids: tuple[int, ...]
    offsets: tuple[tuple[int, int], ...]


def _char_offsets(text: str, data: bytes, bounds: Sequence[int], extra: int) -> tuple[tuple[int, int], ...]:
    """Character ranges of the tokens whose byte ranges are ``bounds`` [n + 1] (a token that
    splits a character is counted from that character), plus ``extra`` empty ones at the end."""
    # A byte's character is the number of characters started up to it, less one: UTF-8
    # continuation bytes are 0b10xxxxxx.
    raw = np.frombuffer(data, dtype=np.uint8)
    char_at = np.empty(len(data) + 1, dtype=np.int64)
    np.cumsum((raw & 0xC0) != 0x80, out=char_at[:-1])
    char_at[:-1] -= 1
    char_at[-1] = len(text)
    at = char_at[np.asarray(bounds, dtype=np.int64)].tolist()
    out = list(zip(at[:-1], at[1:]))
    out.extend([(len(text), len(text))] * extra)
    return tuple(out)


def recover(text: str, canonical: Sequence[int], table: SegmentationTable, target_sha256: str,
            known: Callable[[Sequence[int]], bool] | None, *, max_steps: int = MAX_STEPS) -> Recovered | None:
    """The token ids [n] whose SHA-256 is ``target_sha256`` and whose bytes are ``text``'s,
    or None. ``canonical``: ``encode``'s ids of the text (tried first, and preferred at each
    boundary). ``known(window)``: whether the generation recorded this 8-gram (None: no
    k-grams to check; then only ``max_steps`` bounds the search)."""
    data = text.encode("utf-8")
    ends = ((), *((e,) for e in table.end_ids))
    for extra in ends:  # encode's own ids first: most generations write them (no search)
        ids = (*canonical, *extra)
        if hash_ids(ids) == target_sha256:
            return _recovered(text, data, table, ids, len(extra))
    preferred: dict[int, int] = {}  # byte position -> encode's token starting there
    position = 0
    for token in canonical:
        piece = table.pieces.get(token)
        if piece is None:
            break
        preferred[position] = token
        position += len(piece)
    by_bytes, longest, n = table.by_bytes, table.longest, len(data)
    pieces, listed = table.pieces, {}

    def first(at: int) -> list[tuple[int, int]]:
        """encode's token at ``at`` where it has one there (the option tried first)."""
        token = preferred.get(at)
        return [] if token is None else [(token, len(pieces[token]))]

    def rest(at: int) -> list[tuple[int, int]]:
        """(token, its length) of every other token the bytes at ``at`` start with, longer
        before shorter (the model's merged tokens); listed only when the first fails."""
        found = listed.get(at)
        if found is not None:
            return found
        skip = preferred.get(at)
        found = listed[at] = []
        for length in range(min(longest, n - at), 0, -1):
            token = by_bytes.get(data[at:at + length])
            if token is not None and token != skip:
                found.append((token, length))
        return found

    def finish(path: list[int]) -> tuple[int, ...] | None:
        for extra in ends:
            ids = (*path, *extra)
            if extra and known is not None and len(ids) >= K and not known(ids[-K:]):
                continue
            if hash_ids(ids) == target_sha256:
                return ids
        return None

    # Depth first, iteratively (a path is as long as the text's tokens): one frame per token
    # of ``path`` and one for the position being extended: [byte position, its options, the
    # option tried next, whether any path below reached the end, discrepancies so far,
    # whether its options are all listed]. A
    # state (position, last K-1 ids) none of whose paths reaches the end is dead for every
    # prefix (the k-gram check looks back K-1 ids only); one that reached the end and failed
    # the hash is not. The first K-1 tokens have no k-gram to check, and a depth-first search
    # would try every segmentation of them before it revisits an early wrong turn: there,
    # taking any but a position's first option is a discrepancy, and the search runs again
    # with 0, 1, 2, ... of them allowed (limited discrepancy search, Harvey & Ginsberg 1995).
    dead: set[tuple[int, tuple[int, ...]]] = set()
    steps = 0
    for allowed in range(K):
        path: list[int] = []
        frames: list[list] = [[0, first(0), 0, False, 0, False]]
        limited = False  # whether the budget left out a path (else a larger one finds nothing more)
        while frames:
            frame = frames[-1]
            at, choices = frame[0], frame[1]
            if at == n:
                found = finish(path)
                if found is not None:
                    return _recovered(text, data, table, found, len(found) - len(path))
                frame[3] = True
            elif (at, tuple(path[-(K - 1):])) in dead:
                pass
            elif frame[2] < len(choices) or not frame[5]:
                if frame[2] == len(choices):  # the first option failed: the others, once
                    frame[1] = choices = choices + rest(at)
                    frame[5] = True
                    continue
                index = frame[2]
                token, length = choices[index]
                frame[2] += 1
                discrepancies = frame[4] + (1 if index and len(path) < K - 1 else 0)
                if discrepancies > allowed:
                    limited = True
                    continue
                steps += 1
                if steps > max_steps:
                    return None
                path.append(token)
                if known is None or len(path) < K or known(path[-K:]):
                    frames.append([at + length, first(at + length), 0, False, discrepancies, False])
                else:
                    path.pop()
                continue
            if at != n and not frame[3] and len(path) >= K - 1:
                dead.add((at, tuple(path[-(K - 1):])))
            frames.pop()
            if frames:
                frames[-1][3] = frames[-1][3] or frame[3]
                path.pop()
        if not limited:
            return None
    return None


def _recovered(text: str, data: bytes, table: SegmentationTable, ids: Sequence[int], extra: int) -> Recovered | None:
    bounds = [0]
    for token in ids[:len(ids) - extra]:
        piece = table.pieces.get(token)
        if piece is None:
            return None
        bounds.append(bounds[-1] + len(piece))
    if bounds[-1] != len(data):
        return None
    return Recovered(tuple(int(t) for t in ids), _char_offsets(text, data, bounds, extra))


# --- whitespace runs as the model writes them (no ledger) -----------------------------------

_SPACE_BYTES = frozenset(b" \t\n\r\x0b\x0c")
_RUN_BEFORE_WORD = re.compile(r"[ \t\n\r\x0b\x0c] [^ \t\n\r\x0b\x0c]")
"""What :func:`merge_space_runs` can change: a whitespace token before a space-led word
token, i.e. a whitespace character, a space, then a non-space (a text without one, such as
prose with single spaces, is left as it is without a pass over its tokens)."""


def _is_space(piece: bytes) -> bool:
    return bool(piece) and all(b in _SPACE_BYTES for b in piece)


def _byte_class(b: int) -> str:
    """GPT-2's pre-tokenizer classes (letters, digits, other), by byte: a non-ASCII byte
    counts as a letter (a wrong guess only makes :func:`merge_space_runs` leave a run alone,
    as the word's end must fall on a token boundary and re-encode to the same bytes)."""
    if b >= 0x80 or chr(b).isalpha():
        return "L"
    return "N" if chr(b).isdigit() else "P"


_WORD_OF_CLASS = {"L": re.compile(rb"[A-Za-z\x80-\xff]+"), "N": re.compile(rb"[0-9]+"),
                  "P": re.compile(rb"[^A-Za-z0-9\x80-\xff \t\n\r\x0b\x0c]+")}
"""A run of bytes of one :func:`_byte_class` class (L, N, P) that holds no whitespace byte."""
_WORD_AT = tuple(_WORD_OF_CLASS[_byte_class(b)] for b in range(256))
""":data:`_WORD_OF_CLASS`'s pattern by the word's first byte."""


def _greedy(data: bytes, table: SegmentationTable) -> list[int] | None:
    """``data`` segmented left to right, longest vocabulary token first (None if some byte
    has no token)."""
    out, at = [], 0
    while at < len(data):
        for length in range(min(table.longest, len(data) - at), 0, -1):
            token = table.by_bytes.get(data[at:at + length])
            if token is not None:
                out.append(token)
                at += length
                break
        else:
            return None
    return out


def merge_space_runs(text: str, canonical: Sequence[int], table: SegmentationTable,
                     encode: Callable[[str], Sequence[int]]) -> Recovered | None:
    """``text`` segmented as a model tends to write it where ``encode`` splits a whitespace run
    (issue 30): or None where that is ``canonical`` itself (then it is no second test).

    A byte-level BPE's pre-tokenizer leaves a run's last space to the next word, so ``encode``
    of ``"\\n   Name"`` is ``Ċ`` ``ĠĠ`` ``ĠName``, while a model that has just written the
    single token ``ĊĠĠĠ`` (newline and three spaces: the vocabulary has it, as the indentation
    before ``ĠName`` in ``"\\n    Name"``) goes on with ``Name``. Over the vLLM bench's 128
    generations, the model wrote a whitespace run as one token followed by a bare word 68
    times, and the split that ``encode`` makes 1,487 times. So a run is re-segmented only
    where writing it whole (longest vocabulary tokens first, the word re-encoded without its
    space) takes fewer tokens for the run and no more for the word, or, for a run holding a
    line break (indentation), fewer tokens in all: on the vLLM bench's texts this form
    differs from ``encode`` for 20 of 128 and is closer to the model's ids for 19 (one
    worse); on 96 of the bundled model's, 5 and 5 (a mid-line ``"  BU"``, which the model
    wrote ``Ġ`` ``ĠB`` ``U``, is why a run without a line break must itself get shorter).
    bench/results/retokenisation-*.json measure what it recovers. A pure function of the
    text (never of a key): scored as one more form, it costs a Bonferroni factor only where
    it differs."""
    if not _RUN_BEFORE_WORD.search(text):  # prose with single spaces: nothing to re-segment
        return None
    arrays = table.by_id
    ids = np.asarray(canonical, dtype=np.int64).reshape(-1)
    if len(ids) and (ids.min() < 0 or ids.max() >= len(arrays.length)):
        return None
    lengths = arrays.length[ids]
    if not lengths.all():  # a token without a piece (a special token)
        return None
    pieces = table.pieces
    listed = ids.tolist()
    data = b"".join(map(pieces.__getitem__, listed))
    if data != text.encode("utf-8"):
        return None
    # Where a run of whitespace tokens [i, j) ends at a space-led word token j: the only places
    # an edit can start (every other token is passed over, as the token loop did).
    spaces = arrays.space[ids]
    ends = np.flatnonzero(arrays.space_led[ids][1:] & spaces[:-1]) + 1
    if not len(ends):
        return None
    bounds = [0, *itertools.accumulate(lengths.tolist())]
    space = spaces.tolist()
    edits: list[tuple[int, int, list[int]]] = []  # (first, last) canonical tokens -> the run's and word's
    done = 0  # tokens before this are inside an edit already
    greedy: dict[bytes, list[int] | None] = {}  # a text repeats its indentation runs
    for j in ends.tolist():
        i = j - 1
        while i > 0 and space[i - 1]:  # the run's first token
            i -= 1
        if i < done:
            continue
        start = bounds[j] + 1
        # The word: the bytes of the class of its first one, up to a whitespace byte.
        end = _WORD_AT[data[start]].match(data, start).end()
        last = bisect.bisect_left(bounds, end)
        if last == len(bounds) or bounds[last] != end:
            continue  # the word ends inside a token
        spaced = data[bounds[i]:start]
        run = greedy[spaced] if spaced in greedy else greedy.setdefault(spaced, _greedy(spaced, table))
        if run is None:
            continue
        line_break = b"\n" in spaced
        # Shorter with a word of one token at least (else no encode): writing the run whole
        # takes fewer tokens for it and no more for the word, or, across a line break, fewer in all.
        if not ((len(run) < j - i and 1 <= last - j) or (line_break and len(run) + 1 < last - i)):
            continue
        try:
            word = [int(t) for t in encode(data[start:end].decode("utf-8"))]
        except UnicodeDecodeError:
            word = []
        words = len(word)
        same_bytes = word and all(t in pieces for t in word) and \
            b"".join(pieces[t] for t in word) == data[start:end]
        if same_bytes and ((len(run) < j - i and words <= last - j) or (line_break and len(run) + words < last - i)):
            edits.append((i, last, run + word))
            done = last
    if not edits:
        return None
    out: list[int] = []
    at = 0
    for first, last, tokens in edits:
        out.extend(listed[at:first])
        out.extend(tokens)
        at = last
    out.extend(listed[at:])
    out_bounds = [0, *itertools.accumulate(map(len, map(pieces.__getitem__, out)))]
    if len(data) == len(text):  # ASCII: a byte is a character
        return Recovered(tuple(out), tuple(zip(out_bounds[:-1], out_bounds[1:])))
    return Recovered(tuple(out), _char_offsets(text, data, out_bounds, 0))
