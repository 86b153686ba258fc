"""Ledger retrieval: keyed hashes of a generation's token k-grams, and matching a text to them.

Each recorded generation stores, per distinct k-gram of its output token ids (k = 8), the
first 63 bits of HMAC-SHA256 under a k-gram key derived from the generation's watermark
key secret: SHA-256("hallmark-kgram-v1" || secret as 8 bytes big-endian). No text and no
token id is stored; without the key store (the secret is wrapped under the KEK) the digests
reveal nothing and cannot be tested against a guessed text. Detection hashes the text's
k-grams under each candidate key and counts, per generation, how many distinct digests it
shares.

False-match bound. For a text unrelated to generation G (no shared k-gram), a shared
digest needs a 63-bit HMAC collision: probability at most 2^-63 per (query, stored) pair,
treating HMAC-SHA256 as a PRF. With Q query digests and M stored digests of G, the number
X of chance matches satisfies P(X >= x) <= (Q M 2^-63)^x / x! (union bound over the
x-subsets of pairs); multiplied by the number of generations searched (Bonferroni). This
bounds chance collisions only: a real shared 8-token phrase is a real match, which is why
the share of the text's k-grams that matched is reported beside it.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from keys.models import LedgerKgram

K = 8
"""Tokens per k-gram."""
DIGEST_BITS = 63
MIN_MATCHES = 2
"""Matches below this many shared k-grams are not reported."""
_CHUNK = 500


def kgram_key(secret: int) -> bytes:
    """The k-gram HMAC key of a watermark key secret (64-bit)."""
    return hashlib.sha256(b"hallmark-kgram-v1" + int(secret).to_bytes(8, "big")).digest()


def position_digests(token_ids: Sequence[int], secret: int, k: int = K) -> list[int]:
    """The 63-bit digest of the k-gram starting at each position of ``token_ids`` [n]
    (n - k + 1 of them; empty if n < k)."""
    # One keyed HMAC state, copied per k-gram: the key's two padded blocks are hashed once,
    # not once per k-gram (the digests are the same as hmac.new(key, gram) each time).
    keyed = hmac.new(kgram_key(secret), digestmod=hashlib.sha256)
    data = b"".join((int(t) & 0xFFFFFFFF).to_bytes(4, "big") for t in token_ids)
    out = []
    for start in range(0, len(token_ids) - k + 1):
        mac = keyed.copy()
        mac.update(data[4 * start:4 * (start + k)])
        out.append(int.from_bytes(mac.digest()[:8], "big") >> (64 - DIGEST_BITS))
    return out


def digests(token_ids: Sequence[int], secret: int, k: int = K) -> set[int]:
    """Distinct 63-bit digests of the k-grams of ``token_ids`` [n] (empty if n < k)."""
    return set(position_digests(token_ids, secret, k))


def matched_positions(session: Session, *, key_id: str, generation_id: str, secret: int,
                      token_ids: Sequence[int], skip: int = 0, at: Sequence[int] | None = None) -> set[int]:
    """Positions of ``token_ids`` [n] inside a k-gram that generation ``generation_id``
    recorded under ``key_id`` (the tokens the text shares with it), leaving out the first
    ``skip`` of each k-gram (a watermark context width: those tokens' contexts reach before
    the shared run). ``at``: the text's :func:`position_digests` under ``secret``, when the
    caller has them already (one text is matched against several generations)."""
    if at is None:
        at = position_digests(token_ids, secret)
    found: set[int] = set()
    for chunk in _chunks(sorted(set(at))):
        found.update(session.scalars(select(LedgerKgram.digest).where(
            LedgerKgram.key_id == key_id, LedgerKgram.generation_id == generation_id,
            LedgerKgram.digest.in_(chunk))))
    return {i for start, d in enumerate(at) if d in found for i in range(start + min(skip, K), start + K)}


def record(session: Session, *, tenant_id: str, generation_id: str, key_id: str, secret: int,
           token_ids: Sequence[int]) -> int:
    """Store the k-gram digests of one generation, in the caller's transaction; returns how many."""
    found = digests(token_ids, secret)
    session.add_all(LedgerKgram(tenant_id=tenant_id, generation_id=generation_id, key_id=key_id, digest=d)
                    for d in found)
    return len(found)


@dataclass(frozen=True)
class KgramMatch:
    """A generation sharing k-grams with the text under one key."""

    generation_id: str
    key_id: str
    matched: int
    """Distinct k-gram digests the text shares with the generation."""
    queried: int
    """Distinct k-gram digests of the text."""
    stored: int
    """Distinct k-gram digests recorded for the generation."""
    log10_false_match_bound: float
    """log10 of the bound on a chance (hash-collision) match this large (module docstring)."""
    shared_tokens: int | None = None
    """Scored tokens of the text inside the shared k-grams (None: not computed)."""
    log10_shared_p: float | None = None
    """log10 p of the watermark test over those tokens alone, under this key: whether the
    shared phrases were sampled under the watermark or are text any writer could produce
    (boilerplate the model reproduces with no choice to make; service.ledger_evidence)."""

    def to_dict(self) -> dict[str, object]:
        return {"generation_id": self.generation_id, "key_id": self.key_id, "matched_kgrams": self.matched,
                "text_kgrams": self.queried, "generation_kgrams": self.stored,
                "share": round(self.matched / self.queried, 6) if self.queried else 0.0,
                "log10_false_match_bound": self.log10_false_match_bound,
                "shared_tokens": self.shared_tokens, "log10_shared_p": self.log10_shared_p}


def false_match_log10(matched: int, queried: int, stored: int, generations: int) -> float:
    """log10 of min(1, G (Q M 2^-63)^x / x!)."""
    if matched <= 0:
        return 0.0
    per_pair = math.log10(max(1, queried)) + math.log10(max(1, stored)) - DIGEST_BITS * math.log10(2.0)
    bound = math.log10(max(1, generations)) + matched * per_pair - math.lgamma(matched + 1) / math.log(10.0)
    return min(0.0, bound)


def _chunks(values: list[int]) -> Iterable[list[int]]:
    for i in range(0, len(values), _CHUNK):
        yield values[i:i + _CHUNK]


def find_matches(session: Session, *, keys: Sequence[tuple[str, int]], token_ids: Sequence[int],
                 tenant_id: str | None) -> list[KgramMatch]:
    """Generations sharing at least :data:`MIN_MATCHES` k-grams with ``token_ids``, under each
    ``(key_id, secret)``; scoped to ``tenant_id`` (None: every tenant). Best first."""
    out: list[KgramMatch] = []
    for key_id, secret in keys:
        query = sorted(digests(token_ids, secret))
        if not query:
            continue
        counts: dict[str, int] = {}
        for chunk in _chunks(query):
            stmt = (select(LedgerKgram.generation_id, func.count(LedgerKgram.id))
                    .where(LedgerKgram.key_id == key_id, LedgerKgram.digest.in_(chunk))
                    .group_by(LedgerKgram.generation_id))
            if tenant_id is not None:
                stmt = stmt.where(LedgerKgram.tenant_id == tenant_id)
            for generation_id, count in session.execute(stmt):
                counts[generation_id] = counts.get(generation_id, 0) + int(count)
        hits = {g: c for g, c in counts.items() if c >= MIN_MATCHES}
        if not hits:
            continue
        searched = session.scalar(select(func.count(func.distinct(LedgerKgram.generation_id)))
                                  .where(LedgerKgram.key_id == key_id)) or 1
        stored = dict(session.execute(select(LedgerKgram.generation_id, func.count(LedgerKgram.id))
                                      .where(LedgerKgram.generation_id.in_(list(hits)))
                                      .group_by(LedgerKgram.generation_id)).all())
        for generation_id, matched in hits.items():
            m = int(stored.get(generation_id, matched))
            out.append(KgramMatch(generation_id=generation_id, key_id=key_id, matched=matched, queried=len(query),
                                  stored=m, log10_false_match_bound=false_match_log10(matched, len(query), m,
                                                                                      int(searched))))
    return sorted(out, key=lambda match: (match.log10_false_match_bound, -match.matched))
