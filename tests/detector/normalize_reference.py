"""The normalisation of commit 5ca126c (detector/normalize.py before its fast paths), kept
verbatim as the reference that tests/detector/test_normalize_identity.py holds the current
implementation to: same texts, origins and change counts on every input. Do not edit it to
follow a change of behaviour; a deliberate change replaces the identity test instead."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

# Unicode 15.1 Default_Ignorable_Code_Point (DerivedCoreProperties.txt) less the bidi
# controls below, as inclusive ranges: drawn as nothing by every renderer.
INVISIBLE_RANGES: tuple[tuple[int, int], ...] = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F),
    (0x200B, 0x200D), (0x2060, 0x2065), (0x206A, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
# Selectors modify the character before them (variation selectors, Mongolian free variation
# selectors, tags and variation selectors 17-256).
SELECTOR_RANGES: tuple[tuple[int, int], ...] = (
    (0x180B, 0x180D), (0x180F, 0x180F), (0xFE00, 0xFE0F), (0xE0000, 0xE0FFF))
ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e\u034f")
"""The most common invisible characters (all inside :data:`INVISIBLE_RANGES`)."""
KEYCAP = "\u20e3"
"""Combining enclosing keycap: after a digit, # or * and a variation selector, an emoji."""
BIDI_CONTROLS = frozenset("\u200e\u200f\u061c\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")

# Cyrillic and Greek letters that look like ASCII letters.
HOMOGLYPHS: dict[str, str] = {
    # Cyrillic lower case
    "\u0430": "a", "\u0441": "c", "\u0435": "e", "\u043e": "o", "\u0440": "p", "\u0445": "x",
    "\u0443": "y", "\u0455": "s", "\u0456": "i", "\u0458": "j", "\u04bb": "h", "\u0501": "d",
    "\u051b": "q", "\u051d": "w",
    # Cyrillic upper case
    "\u0410": "A", "\u0412": "B", "\u0421": "C", "\u0415": "E", "\u041d": "H", "\u0406": "I",
    "\u0408": "J", "\u041a": "K", "\u041c": "M", "\u041e": "O", "\u0420": "P", "\u0405": "S",
    "\u0422": "T", "\u0425": "X", "\u0423": "Y", "\u04ae": "Y",
    # Greek
    "\u03bf": "o", "\u03bd": "v", "\u03b9": "i", "\u0391": "A", "\u0392": "B", "\u0395": "E",
    "\u0396": "Z", "\u0397": "H", "\u0399": "I", "\u039a": "K", "\u039c": "M", "\u039d": "N",
    "\u039f": "O", "\u03a1": "P", "\u03a4": "T", "\u03a5": "Y", "\u03a7": "X",
}
_WORD = re.compile(r"[^\W\d_]+")  # runs of letters


def _in(ch: str, ranges: tuple[tuple[int, int], ...]) -> bool:
    code = ord(ch)
    return any(lo <= code <= hi for lo, hi in ranges)


def _char_class(ranges: tuple[tuple[int, int], ...], extra: str = "") -> re.Pattern:
    return re.compile("[" + "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in ranges)
                      + "".join(f"\\U{ord(ch):08x}" for ch in sorted(extra)) + "]")


def _latin_like(ch: str | None) -> bool:
    """ASCII, a Latin letter of any block (accented, full-width), a look-alike of one, a
    space or punctuation (typographic quotes and dashes): where an invisible character has
    no business (None: the text's edge). Emoji are symbols, not punctuation."""
    return (ch is None or ch.isascii() or ch in HOMOGLYPHS or ch.isspace()
            or unicodedata.category(ch).startswith("P") or "LATIN" in unicodedata.name(ch, ""))


def _hidden_to_remove(text: str) -> list[bool]:
    """Per character of ``text``: an invisible character or bidi control placed in Latin
    text, to remove (module docstring, 1). Linear: each run of hidden characters has one
    visible neighbour on each side."""
    out = [False] * len(text)
    for run in _HIDDEN_RUN.finditer(text):
        before = text[run.start() - 1] if run.start() > 0 else None
        after = text[run.end()] if run.end() < len(text) else None
        latin_before, latin_either = _latin_like(before), _latin_like(before) or _latin_like(after)
        keycap = after == KEYCAP  # 1️⃣: an ASCII digit, VS16, the enclosing keycap
        for i in range(run.start(), run.end()):
            # A selector modifies the character before it; anything else sits between two.
            out[i] = (latin_before and not keycap) if _in(text[i], SELECTOR_RANGES) else latin_either
    return out


def _foreign(ch: str) -> bool:
    """A Cyrillic or Greek letter (the scripts the homoglyph table borrows from)."""
    return "\u0370" <= ch <= "\u03ff" or "\u0400" <= ch <= "\u052f" or "\u1f00" <= ch <= "\u1fff"


def _posing_as_latin(text: str) -> list[bool]:
    """Per character of ``text``: a homoglyph posing as a Latin letter (module docstring, 3)."""
    latin = sum(ch.isascii() and ch.isalpha() for ch in text)
    foreign = sum(_foreign(ch) and ch not in HOMOGLYPHS for ch in text)
    mostly_latin = latin > foreign
    out = [False] * len(text)
    for word in _WORD.finditer(text):
        chars = word.group()
        if not any(ch in HOMOGLYPHS for ch in chars):
            continue
        if any(_foreign(ch) and ch not in HOMOGLYPHS for ch in chars):
            continue  # a real Cyrillic/Greek word
        if mostly_latin or any(ch.isascii() for ch in chars):
            for i in range(word.start(), word.end()):
                out[i] = text[i] in HOMOGLYPHS
    return out
_HSPACE_RUN = re.compile(r"[ \t]{2,}")
_HIDDEN_RUN = re.compile(_char_class(INVISIBLE_RANGES, "".join(BIDI_CONTROLS)).pattern + "+")
"""Runs of invisible characters and bidi controls (module docstring, 1)."""


@dataclass(frozen=True)
class NormalizedText:
    """A text after normalisation, and how many characters each step changed."""

    text: str
    changes: dict[str, int] = field(default_factory=dict)
    """Counts by step: ``zero_width`` (invisible characters), ``bidi``, ``nfkc``,
    ``homoglyph``, ``line_endings``, ``whitespace`` (characters removed or replaced; a CRLF
    counts once); only non-zero counts appear."""
    origin: tuple[int, ...] = ()
    """For each character of ``text``, the index in the original text it came from."""
    original_length: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    def to_dict(self) -> dict[str, object]:
        return {"changed": self.changed, "changes": dict(self.changes)}

    def original_offsets(self, offsets: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Character ranges in ``text`` mapped to ranges in the original text. Ranges that
        tile ``text`` tile the original: a range ends where the next character's source
        begins, so removed characters join the range before them."""
        bound = (*self.origin, self.original_length)

        def at(i: int) -> int:
            return 0 if i == 0 else bound[min(i, len(bound) - 1)]

        return [(at(start), at(end)) for start, end in offsets]


def normalize(text: str, *, collapse_whitespace: bool = True) -> NormalizedText:
    """Normalise ``text`` (see the module docstring); ``collapse_whitespace=False`` keeps
    runs of spaces (genuine indentation is also one)."""
    changes: dict[str, int] = {}
    remove = _hidden_to_remove(text)
    zero = sum(r and ch not in BIDI_CONTROLS for ch, r in zip(text, remove))
    bidi = sum(r and ch in BIDI_CONTROLS for ch, r in zip(text, remove))
    if zero:
        changes["zero_width"] = zero
    if bidi:
        changes["bidi"] = bidi
    visible = [(ch, o) for o, (ch, r) in enumerate(zip(text, remove)) if not r]
    chars, origin, rewritten = _nfkc_with_origin("".join(ch for ch, _ in visible), [o for _, o in visible])
    if rewritten:
        changes["nfkc"] = rewritten
    kept = list(zip(chars, origin))
    posing = _posing_as_latin(chars)
    if any(posing):
        changes["homoglyph"] = sum(posing)
        kept = [(HOMOGLYPHS[ch] if swap else ch, o) for (ch, o), swap in zip(kept, posing)]
    kept, line_endings = _newlines(kept)
    if line_endings:
        changes["line_endings"] = line_endings
    out: list[tuple[str, int]] = []
    removed = 0
    for ch, o in kept:  # a run of spaces and tabs becomes its first character, as one space
        if collapse_whitespace and ch in " \t" and out and out[-1][0] in " \t":
            removed += 1
            continue
        out.append((ch, o))
    collapsed = "".join(ch for ch, _ in out)
    if removed:
        changes["whitespace"] = removed
        # A run's first character stays as a space (a tab in a run becomes a space).
        collapsed = _HSPACE_RUN.sub(" ", "".join(ch for ch, _ in kept))
    return NormalizedText(text=collapsed, changes=changes, origin=tuple(o for _, o in out),
                          original_length=len(text))


LINE_BREAKS = frozenset("\r\u2028\u2029\x85")
"""Line breaks other than \\n (CR, as in CRLF, and Unicode's line and paragraph separators
and NEL), each made a \\n."""


def _newlines(chars: list[tuple[str, int]]) -> tuple[list[tuple[str, int]], int]:
    """``chars`` (character, source index) with every line break a single \\n (a CRLF's \\n
    is dropped, so it joins the \\r's range), and how many line breaks were rewritten."""
    out: list[tuple[str, int]] = []
    rewritten = 0
    after_cr = False
    for ch, o in chars:
        if ch == "\n" and after_cr:
            after_cr = False
            continue  # the \n of a CRLF
        after_cr = ch == "\r"
        if ch in LINE_BREAKS:
            rewritten += 1
            ch = "\n"
        out.append((ch, o))
    return out, rewritten


MAX_MERGED_SEGMENTS = 8
"""Segments (a starter and its combining marks) NFKC may compose together: Hangul jamo, and
a few scripts' two-part vowels; beyond this the map falls back to proportional."""


def _nfkc_with_origin(text: str, origin: list[int]) -> tuple[str, list[int], int]:
    """NFKC of ``text`` [n], each of its characters' source index (through ``origin`` [n]),
    and how many characters of ``text`` NFKC rewrote.

    NFKC acts within a character and its combining marks (a segment), and across segments
    only where scripts compose two starters (Hangul jamo, a few vowel signs). So the text is
    walked segment by segment, each normalised alone and checked against the whole text's
    NFKC at that point; where it differs, the next segments are joined to it until they
    agree. Inside a run, characters that normalise alone keep their own index, and a
    composition (e + U+0301 -> é) maps to the run's first character."""
    nfkc = unicodedata.normalize("NFKC", text)
    if nfkc == text:
        return text, list(origin), 0
    starts = [i for i, ch in enumerate(text) if i == 0 or not unicodedata.combining(ch)] + [len(text)]
    mapped: list[int] = []
    rewritten = 0
    at, s = 0, 0
    while s < len(starts) - 1:
        a = starts[s]
        for t in range(s + 1, min(s + 1 + MAX_MERGED_SEGMENTS, len(starts))):
            piece = unicodedata.normalize("NFKC", text[a:starts[t]])
            if nfkc.startswith(piece, at):
                break
        else:  # no run agrees: proportional for the rest, in range and in order
            rest = len(nfkc) - at
            span = len(text) - a
            mapped.extend(origin[a + min(int(k * span / max(rest, 1)), span - 1)] for k in range(rest))
            rewritten += span
            break
        b = starts[t]
        alone = [unicodedata.normalize("NFKC", ch) for ch in text[a:b]]
        if "".join(alone) == piece:
            mapped.extend(origin[a + k] for k, part in enumerate(alone) for _ in part)
            rewritten += sum(part != ch for part, ch in zip(alone, text[a:b]))
        else:
            mapped.extend([origin[a]] * len(piece))
            rewritten += b - a
        at += len(piece)
        s = t
    return nfkc, mapped, rewritten
