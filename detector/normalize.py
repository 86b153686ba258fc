"""Text normalisation against tokenisation attacks, applied before a text is tokenised.

An attacker who cannot edit many words can still change how a text tokenises: invisible
characters between letters, look-alike letters from other scripts, compatibility forms,
extra spaces. Each breaks the watermark's contexts without changing what a reader sees.
This undoes them, in order:

1. removes invisible characters, Unicode's default-ignorable code points (zero-width
   space and joiners, soft hyphen, word joiner, invisible operators, variation selectors,
   tag characters, Hangul fillers, ...; DerivedCoreProperties.txt), and bidirectional
   controls, where they sit in Latin text. Several of them carry meaning in other scripts:
   the zero-width joiner of an emoji sequence or of Persian or Indic words, a variation
   selector or tag after an emoji or an ideograph, a right-to-left mark between Hebrew
   words. So a joiner-like character is kept when the visible characters on both sides of
   it are neither ASCII nor Latin nor look-alikes of Latin letters (nor spaces or
   punctuation), and a selector (variation selectors, tags) when the character it
   modifies is such;
2. Unicode NFKC (compatibility forms: full-width letters, ligatures, non-breaking spaces);
3. maps Cyrillic and Greek homoglyphs of ASCII letters to the ASCII letter (a fixed table
   of letters that render identically in common fonts; Unicode's confusables.txt subset),
   only where they pose as Latin: in a word that also has a Latin letter, or in a word
   made of table letters alone within a text whose letters are mostly Latin. Real Cyrillic
   or Greek words (with letters outside the table, or in a mostly Cyrillic/Greek text) are
   left alone, so that normalising never rewrites a genuine Russian or Greek text;
4. makes every line break a \\n (CRLF, CR, U+2028, U+2029, NEL: a paste from Windows or an
   HTML form re-tokenises every line), and collapses runs of horizontal whitespace (spaces,
   tabs) to one space (``collapse_whitespace``); newlines are kept.

The result says what was changed, by category, so a client sees that the text was altered.
Each character of the result keeps the index of the original character it came from, so
that a detection reports character offsets in the client's text (:meth:`NormalizedText.
original_offsets`); a removed character belongs to the token before it.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Sequence

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


def _hidden_to_remove(text: str) -> list[int]:
    """Indices of ``text`` (ascending) holding an invisible character or bidi control placed in
    Latin text, to remove (module docstring, 1). Linear: each run of hidden characters has one
    visible neighbour on each side."""
    out: list[int] = []
    for run in _HIDDEN_RUN.finditer(text):
        before = text[run.start() - 1] if run.start() > 0 else None
        after = text[run.end()] if run.end() < len(text) else None
        latin_before, latin_either = _latin_like(before), _latin_like(before) or _latin_like(after)
        keycap = after == KEYCAP  # 1️⃣: an ASCII digit, VS16, the enclosing keycap
        for i in range(run.start(), run.end()):
            # A selector modifies the character before it; anything else sits between two.
            if (latin_before and not keycap) if _in(text[i], SELECTOR_RANGES) else latin_either:
                out.append(i)
    return out


def _foreign(ch: str) -> bool:
    """A Cyrillic or Greek letter (the scripts the homoglyph table borrows from)."""
    return "\u0370" <= ch <= "\u03ff" or "\u0400" <= ch <= "\u052f" or "\u1f00" <= ch <= "\u1fff"


def _posing_as_latin(text: str) -> list[int]:
    """Indices of ``text`` (ascending) holding a homoglyph posing as a Latin letter (module
    docstring, 3)."""
    if not _HOMOGLYPH.search(text):
        return []
    latin = len(_ASCII_LETTER.findall(text))
    # Every homoglyph lies in the Cyrillic and Greek blocks that _foreign tests.
    foreign = len(_FOREIGN_LETTER.findall(text)) - len(_HOMOGLYPH.findall(text))
    mostly_latin = latin > foreign
    out: list[int] = []
    for word in _WORD.finditer(text):
        chars = word.group()
        if not _HOMOGLYPH.search(chars):
            continue
        if any(_foreign(ch) and ch not in HOMOGLYPHS for ch in chars):
            continue  # a real Cyrillic/Greek word
        if mostly_latin or any(ch.isascii() for ch in chars):
            out.extend(word.start() + k for k, ch in enumerate(chars) if ch in HOMOGLYPHS)
    return out


_HSPACE_RUN = re.compile(r"[ \t][ \t]+")  # [ \t]{2,}, scanned faster
_HIDDEN_RUN = re.compile(_char_class(INVISIBLE_RANGES, "".join(BIDI_CONTROLS)).pattern + "+")
"""Runs of invisible characters and bidi controls (module docstring, 1)."""
_HOMOGLYPH = _char_class((), "".join(HOMOGLYPHS))
_ASCII_LETTER = re.compile(r"[A-Za-z]")
_FOREIGN_LETTER = _char_class(((0x0370, 0x03FF), (0x0400, 0x052F), (0x1F00, 0x1FFF)))
"""The code points :func:`_foreign` accepts, for counting them in one pass."""


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


@dataclass(frozen=True)
class NormalizedForms:
    """Both normalisations of one text, from one pass over it: they differ only in step 4's
    collapsing of space runs."""

    collapsed: NormalizedText
    """``normalize(text)``."""
    spaces_kept: NormalizedText
    """``normalize(text, collapse_whitespace=False)``."""


def normalize(text: str, *, collapse_whitespace: bool = True) -> NormalizedText:
    """Normalise ``text`` (see the module docstring); ``collapse_whitespace=False`` keeps
    runs of spaces (genuine indentation is also one)."""
    chars, origin, changes = _before_collapse(text)
    if collapse_whitespace:
        return _collapsed(chars, origin, changes, len(text))
    return NormalizedText(text=chars, changes=changes, origin=tuple(origin), original_length=len(text))


def normalize_forms(text: str) -> NormalizedForms:
    """``normalize(text)`` and ``normalize(text, collapse_whitespace=False)``, sharing every
    step but the last."""
    chars, origin, changes = _before_collapse(text)
    kept = NormalizedText(text=chars, changes=dict(changes), origin=tuple(origin), original_length=len(text))
    return NormalizedForms(collapsed=_collapsed(chars, origin, changes, len(text)), spaces_kept=kept)


def _before_collapse(text: str) -> tuple[str, Sequence[int], dict[str, int]]:
    """Steps 1 to 3 and step 4's line breaks: the text, each character's source index [n],
    and the change counts so far. Each step first checks, at C speed, whether the text holds
    any character it could change (most texts hold none), and is skipped if not."""
    changes: dict[str, int] = {}
    chars, origin = text, range(len(text))
    if text.isascii():
        # Steps 1 to 3 change only characters outside ASCII (invisible characters, bidi
        # controls, compatibility forms, homoglyphs), and of step 4's line breaks only CR is
        # ASCII: the common case skips their scans (each a pass over the text).
        if "\r" not in text:
            return chars, origin, changes
    elif _HIDDEN_RUN.search(text):
        remove = _hidden_to_remove(text)
        bidi = sum(text[i] in BIDI_CONTROLS for i in remove)
        if len(remove) - bidi:
            changes["zero_width"] = len(remove) - bidi
        if bidi:
            changes["bidi"] = bidi
        if remove:
            chars, origin = _deleted(text, origin, remove)
    if not chars.isascii() and not unicodedata.is_normalized("NFKC", chars):
        chars, origin, rewritten = _nfkc_with_origin(chars, origin)
        if rewritten:
            changes["nfkc"] = rewritten
    posing = _posing_as_latin(chars)
    if posing:  # one letter for one: the origins stand
        changes["homoglyph"] = len(posing)
        swapped = list(chars)
        for i in posing:
            swapped[i] = HOMOGLYPHS[swapped[i]]
        chars = "".join(swapped)
    if _LINE_BREAK.search(chars):
        crlf = [m.start() + 1 for m in _CRLF.finditer(chars)]  # the \n of each CRLF is dropped
        changes["line_endings"] = len(_LINE_BREAK.findall(chars))  # a CRLF counts once
        chars = _LINE_BREAK.sub("\n", chars)  # a CRLF's \r\n becomes one \n (the \r's origin)
        if crlf:
            origin = _deleted_origin(origin, crlf)
    return chars, origin, changes


def _collapsed(chars: str, origin: Sequence[int], changes: dict[str, int], length: int) -> NormalizedText:
    """Step 4's collapsing: a run of spaces and tabs becomes one space, at its first
    character's origin."""
    runs = [m.span() for m in _HSPACE_RUN.finditer(chars)]
    if runs:
        changes = {**changes, "whitespace": sum(end - start - 1 for start, end in runs)}
        text, kept = [], []  # each run's first character stays, as a space
        at = 0
        for start, end in runs:
            text.append(chars[at:start])
            kept.append(origin[at:start + 1])
            at = end
        text.append(chars[at:])
        kept.append(origin[at:])
        chars = " ".join(text)
        origin = tuple(itertools.chain.from_iterable(kept))
    return NormalizedText(text=chars, changes=changes, origin=tuple(origin), original_length=length)


def _deleted(text: str, origin: Sequence[int], remove: list[int]) -> tuple[str, list[int]]:
    """``text`` and ``origin`` without the characters at ``remove`` (ascending indices)."""
    gone = set(remove)
    return "".join(ch for i, ch in enumerate(text) if i not in gone), _deleted_origin(origin, remove)


def _deleted_origin(origin: Sequence[int], remove: list[int]) -> list[int]:
    """``origin`` without the entries at ``remove`` (ascending indices)."""
    kept: list[int] = []
    at = 0
    for i in remove:
        kept.extend(origin[at:i])
        at = i + 1
    kept.extend(origin[at:])
    return kept


LINE_BREAKS = frozenset("\r\u2028\u2029\x85")
"""Line breaks other than \\n (CR, as in CRLF, and Unicode's line and paragraph separators
and NEL), each made a \\n."""
_LINE_BREAK = re.compile("\r\n|[\r\u2028\u2029\x85]")
_ASCII_RUN = re.compile(r"[\x00-\x7f]+")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_CRLF = re.compile("\r\n")


MAX_MERGED_SEGMENTS = 8
"""Segments (a starter and its combining marks) NFKC may compose together: Hangul jamo, and
a few scripts' two-part vowels; beyond this the map falls back to proportional."""


def _nfkc_with_origin(text: str, origin: Sequence[int]) -> tuple[str, Sequence[int], int]:
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
        return text, origin, 0
    marks = {m.start() for m in _NON_ASCII.finditer(text, 1) if unicodedata.combining(m.group())}
    starts = [i for i in range(len(text)) if i not in marks] if marks else list(range(len(text)))
    starts.append(len(text))
    mapped: list[int] = []
    rewritten = 0
    at, s = 0, 0
    retry_ascii = 0  # a run of ASCII that disagreed with nfkc is walked one segment at a time
    while s < len(starts) - 1:
        a = starts[s]
        if a >= retry_ascii and text[a].isascii():
            # Each ASCII character is a segment that NFKC leaves alone, so the walk below
            # would take it as it is wherever nfkc agrees: take the whole run at once.
            end = _ASCII_RUN.match(text, a).end()
            if end < len(text) and unicodedata.combining(text[end]):
                end -= 1  # the last one's segment holds the mark after it
            if end > a and nfkc.startswith(text[a:end], at):
                mapped.extend(origin[a:end])
                at += end - a
                s += end - a
                continue
            retry_ascii = end
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
