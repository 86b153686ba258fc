"""The probe guard: one text probed over and over counts against that text's family.

An oracle attack submits one text many times, changed a little each time (spoofing adds
watermark-like tokens, stripping removes them, and each query says whether it worked). The
guard gives each query a *family*: a query sharing at least ``share`` (default 50 %) of its
word k-grams (default 4: ``probe_kgram``) with one of the same principal's queries of the last 24 hours joins that query's
family; otherwise it starts a new one. A family answers at most ``per_day`` queries (default
10) in 24 hours; past that the detection is refused (429 ``probe_guard``) before any work.

What is kept: per query, keyed hashes of its k-grams (HMAC-SHA-256 under a key derived from
the KEK, 8 bytes each, at most ``_MAX_HASHES`` of them chosen by a fixed rule so two queries
keep the same 8-grams), the principal's keyed hash, the family's id and the time. No text,
no text hash, no address. Rows older than 24 hours are deleted on every guarded query.

The k-grams are of words (Unicode word characters after the detector's own normalisation,
detector.normalize: invisible characters and bidi controls removed, homoglyphs mapped, NFKC;
then case folding), computed before any tokenisation: cheap, and independent of the
tokenizer, so the guard runs before the detector does any work. Normalising as the detector
does matters: a variant with zero-width characters inside its words (or look-alike letters)
gets the same verdict as the original, so it must fall in the original's family (before, such
variants shared 5-9 % of their k-grams with it and each started a family of its own). Token
ids are sketched as the text they decode to (:func:`sketch_of_ids`), for the same reason.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
import unicodedata
from array import array
from dataclasses import dataclass
from typing import Sequence

from sqlalchemy import delete, select, text

from detector.normalize import normalize
from keys.models import ProbeQuery

K = 4
"""Words per k-gram. The issue proposed 8; an attacker who edits one token in every five
(the spoofing attack's pattern) leaves almost no 8-gram intact, while 4-grams survive such a
round at about (1 - 0.1)^4 = 66 % when a tenth of the words change per query; unrelated texts
share well under 5 % of their 4-grams."""
WINDOW_S = 86_400.0
_MAX_HASHES = 2048
_RECENT = 500
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Sketch:
    level: int
    """Hashes kept: those whose low ``level`` bits are zero (0: all of them)."""
    hashes: frozenset[int]

    def at(self, level: int) -> frozenset[int]:
        if level <= self.level:
            return self.hashes
        mask = (1 << level) - 1
        return frozenset(h for h in self.hashes if h & mask == 0)

    def pack(self) -> bytes:
        return bytes([self.level]) + array("Q", sorted(self.hashes)).tobytes()

    @classmethod
    def unpack(cls, data: bytes) -> "Sketch":
        values = array("Q")
        values.frombytes(data[1:])
        return cls(data[0], frozenset(values))


def words(text: str) -> list[str]:
    """The words a sketch is made of (module docstring: the detector's normalisation, NFKC, case folded)."""
    return _WORD.findall(unicodedata.normalize("NFKC", normalize(text).text).casefold())


def sketch(secret: bytes, text: str, k: int = K) -> Sketch:
    found = words(text)
    grams = [" ".join(found[i:i + k]) for i in range(max(1, len(found) - k + 1))] if found else [""]
    hashes = {int.from_bytes(hmac.new(secret, g.encode("utf-8"), hashlib.sha256).digest()[:8], "little")
              for g in grams}
    level = 0
    while len(hashes) > _MAX_HASHES:
        level += 1
        mask = (1 << level) - 1
        hashes = {h for h in hashes if h & mask == 0}
    return Sketch(level, frozenset(hashes))


def sketch_of_ids(secret: bytes, token_ids: Sequence[int], decoded: str | None, k: int = K) -> Sketch:
    """Token ids' sketch: that of the text they decode to (``decoded``, None: they do not
    decode) when it has at least ``k`` words, so that a text and its token ids are one family
    (two families would let a prober alternate them for twice a family's daily limit). Ids
    whose text has fewer words (wordless or short lists) are sketched by their digits
    instead: as text, every such list would make one k-gram (the empty or the only one) and
    unrelated lists would share a family."""
    if decoded is not None and len(words(decoded)) >= k:
        return sketch(secret, decoded, k)
    return sketch(secret, " ".join(map(str, token_ids)), k)


def share(query: Sketch, other: Sketch) -> float:
    level = max(query.level, other.level)
    mine = query.at(level)
    if not mine:
        return 0.0
    return len(mine & other.at(level)) / len(mine)


def prune(session, now: float) -> None:
    """Delete the guard's and the budgets' rows outside their windows: on PostgreSQL through
    the owner's ``hallmark_prune_access()`` (migration 0011: the service role may not delete
    them itself, so it cannot reset a family or a budget), directly on SQLite."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT hallmark_prune_access()"))
        return
    session.execute(delete(ProbeQuery).where(ProbeQuery.created < now - WINDOW_S))
    session.execute(text("DELETE FROM access_spend WHERE created < :before"), {"before": now - WINDOW_S - 600.0})


@dataclass(frozen=True)
class Verdict:
    family: str
    queries: int
    """Queries of the family in the window, this one included when admitted."""
    admitted: bool


def guard(session, *, principal: str, query: Sketch, per_day: int, min_share: float,
          now: float | None = None) -> Verdict:
    """Place ``query`` in a family of ``principal``'s recent queries; record it if the family
    is under ``per_day`` (then ``admitted``), else record nothing."""
    now = time.time() if now is None else now
    if session.get_bind().dialect.name == "postgresql":
        # One placement at a time per principal across replicas (SQLite's write transaction
        # already serialises them): two replicas reading the family's count at once would
        # both admit its last query.
        lock = int.from_bytes(hashlib.sha256(b"hallmark-probe:" + principal.encode()).digest()[:8], "big",
                              signed=True)
        session.execute(text("SELECT pg_advisory_xact_lock(:lock)"), {"lock": lock})
    prune(session, now)
    rows = session.execute(
        select(ProbeQuery.family, ProbeQuery.hashes).where(ProbeQuery.principal == principal,
                                                           ProbeQuery.created >= now - WINDOW_S)
        .order_by(ProbeQuery.created.desc()).limit(_RECENT)).all()
    family, best = None, 0.0
    for row_family, packed in rows:
        s = share(query, Sketch.unpack(packed))
        if s >= min_share and s > best:
            family, best = row_family, s
    queries = sum(1 for row_family, _ in rows if row_family == family) if family else 0
    if family is not None and queries >= per_day:
        return Verdict(family, queries, False)
    row_id = secrets.token_hex(16)
    session.add(ProbeQuery(id=row_id, principal=principal, family=family or row_id, created=now,
                           hashes=query.pack()))
    session.flush()
    return Verdict(family or row_id, queries + 1, True)
