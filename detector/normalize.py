"""Text normalisation against tokenisation attacks, applied before a text is tokenised.

An attacker who cannot edit many words can still change how a text tokenises: invisible
characters between letters, look-alike letters from other scripts, compatibility forms,
extra spaces. Each breaks the watermark's contexts without changing what a reader sees.
This undoes them, in order:

1. Unicode NFKC (compatibility forms: full-width letters, ligatures, non-breaking spaces);
2. removes zero-width characters and soft hyphens, and bidirectional controls;
3. maps Cyrillic and Greek homoglyphs of ASCII letters to the ASCII letter (a fixed table
   of letters that render identically in common fonts; Unicode's confusables.txt subset);
4. collapses runs of horizontal whitespace (spaces, tabs) to one space; newlines are kept.

The result says what was changed, by category, so a client sees that the text was altered.
Character offsets in a detection of normalised text refer to the normalised text.
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
_TRANSLATE = str.maketrans(HOMOGLYPHS)
_HSPACE_RUN = re.compile(r"[ \t]{2,}")


@dataclass(frozen=True)
class NormalizedText:
    """A text after normalisation, and how many characters each step changed."""

    text: str
    changes: dict[str, int] = field(default_factory=dict)
    """Counts by step: ``nfkc``, ``zero_width``, ``bidi``, ``homoglyph``, ``whitespace``
    (characters removed or replaced); only non-zero counts appear."""

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    def to_dict(self) -> dict[str, object]:
        return {"changed": self.changed, "changes": dict(self.changes)}


def normalize(text: str) -> NormalizedText:
    """Normalise ``text`` (see the module docstring)."""
    changes: dict[str, int] = {}
    nfkc = unicodedata.normalize("NFKC", text)
    if nfkc != text:
        changes["nfkc"] = sum(1 for a, b in zip(text, nfkc) if a != b) + abs(len(text) - len(nfkc))
    zero = sum(ch in ZERO_WIDTH for ch in nfkc)
    bidi = sum(ch in BIDI_CONTROLS for ch in nfkc)
    stripped = "".join(ch for ch in nfkc if ch not in ZERO_WIDTH and ch not in BIDI_CONTROLS) \
        if zero or bidi else nfkc
    if zero:
        changes["zero_width"] = zero
    if bidi:
        changes["bidi"] = bidi
    homoglyphs = sum(ch in HOMOGLYPHS for ch in stripped)
    mapped = stripped.translate(_TRANSLATE) if homoglyphs else stripped
    if homoglyphs:
        changes["homoglyph"] = homoglyphs
    collapsed, runs = _HSPACE_RUN.subn(" ", mapped)
    if runs:
        changes["whitespace"] = len(mapped) - len(collapsed)
    return NormalizedText(text=collapsed, changes=changes)
