"""Text normalisation against tokenisation attacks, applied before a text is tokenised.

An attacker who cannot edit many words can still change how a text tokenises: invisible
characters between letters, look-alike letters from other scripts, compatibility forms,
extra spaces. Each breaks the watermark's contexts without changing what a reader sees.
This undoes them, in order:

1. Unicode NFKC (compatibility forms: full-width letters, ligatures, non-breaking spaces);
2. removes zero-width characters and soft hyphens, and bidirectional controls;
3. maps Cyrillic and Greek homoglyphs of ASCII letters to the ASCII letter (a fixed table
   of letters that render identically in common fonts; Unicode's confusables.txt subset),
   only where they pose as Latin: in a word that also has a Latin letter, or in a word
   made of table letters alone within a text whose letters are mostly Latin. Real Cyrillic
   or Greek words (with letters outside the table, or in a mostly Cyrillic/Greek text) are
   left alone, so that normalising never rewrites a genuine Russian or Greek text;
4. collapses runs of horizontal whitespace (spaces, tabs) to one space; newlines are kept.

The result says what was changed, by category, so a client sees that the text was altered.
Each character of the result keeps the index of the original character it came from, so
that a detection reports character offsets in the client's text (:meth:`NormalizedText.
original_offsets`); a removed character belongs to the token before it.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e\u034f")
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


@dataclass(frozen=True)
class NormalizedText:
    """A text after normalisation, and how many characters each step changed."""

    text: str
    changes: dict[str, int] = field(default_factory=dict)
    """Counts by step: ``nfkc``, ``zero_width``, ``bidi``, ``homoglyph``, ``whitespace``
    (characters removed or replaced); only non-zero counts appear."""
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
    """Normalise ``text`` (see the module docstring); ``collapse_whitespace=False`` skips
    step 4 (genuine indentation is also a run of spaces)."""
    changes: dict[str, int] = {}
    nfkc = unicodedata.normalize("NFKC", text)
    chars, origin = _nfkc_with_origin(text, nfkc)
    if nfkc != text:
        changes["nfkc"] = sum(1 for a, b in zip(text, nfkc) if a != b) + abs(len(text) - len(nfkc))
    zero = sum(ch in ZERO_WIDTH for ch in chars)
    bidi = sum(ch in BIDI_CONTROLS for ch in chars)
    if zero:
        changes["zero_width"] = zero
    if bidi:
        changes["bidi"] = bidi
    kept = [(ch, o) for ch, o in zip(chars, origin) if ch not in ZERO_WIDTH and ch not in BIDI_CONTROLS]
    posing = _posing_as_latin("".join(ch for ch, _ in kept))
    if any(posing):
        changes["homoglyph"] = sum(posing)
        kept = [(HOMOGLYPHS[ch] if swap else ch, o) for (ch, o), swap in zip(kept, posing)]
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


def _nfkc_with_origin(text: str, nfkc: str) -> tuple[str, list[int]]:
    """NFKC's result with each character's source index. Per-character NFKC gives the map
    where it reproduces the whole text's NFKC (no composition across characters); where it
    does not, the map is proportional, which keeps offsets in range and in order."""
    pieces = [unicodedata.normalize("NFKC", ch) for ch in text]
    if "".join(pieces) == nfkc:
        return nfkc, [j for j, piece in enumerate(pieces) for _ in piece]
    scale = len(text) / max(len(nfkc), 1)
    return nfkc, [min(int(i * scale), max(len(text) - 1, 0)) for i in range(len(nfkc))]
