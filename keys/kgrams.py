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
x-subsets of pairs); multiplied by the number of generations searched, or an upper bound on
it (Bonferroni; :func:`generations_searched`). This bounds chance collisions only: a real shared 8-token phrase is a real match, which is why
the share of the text's k-grams that matched is reported beside it.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from typing import Iterable, Sequence

from sqlalchemy import bindparam, func, select, text
from sqlalchemy.orm import Session

from keys import tlog
from keys.models import LedgerEntry, LedgerKgram

K = 8
"""Tokens per k-gram."""
DIGEST_BITS = 63
MIN_MATCHES = 2
"""Matches below this many shared k-grams are not reported."""
_CHUNK = 500

# Statements built once, their lists bound at execution (expanding parameters): an IN list
# of literals is coerced element by element each time a statement is built.
_ROWS = select(LedgerKgram.generation_id, LedgerKgram.digest).where(
    LedgerKgram.key_id == bindparam("key_id"), LedgerKgram.digest.in_(bindparam("digests", expanding=True)))
_ROWS_OF_TENANT = _ROWS.where(LedgerKgram.tenant_id == bindparam("tenant_id"))
# SQLite: the digests bound as one JSON array (json_each), the index on (key_id, digest) still
# used: a look-up of ~250 digests renders no bind parameter per value.
_ROWS_JSON = text("SELECT generation_id, digest FROM ledger_kgrams WHERE key_id = :key_id "
                  "AND digest IN (SELECT value FROM json_each(:digests))")
_ROWS_JSON_OF_TENANT = text("SELECT generation_id, digest FROM ledger_kgrams WHERE key_id = :key_id "
                            "AND digest IN (SELECT value FROM json_each(:digests)) AND tenant_id = :tenant_id")
_SHARED = _ROWS.where(LedgerKgram.generation_id.in_(bindparam("generation_ids", expanding=True)))
_SEARCHED = select(func.count()).select_from(LedgerEntry).where(
    LedgerEntry.key_id == bindparam("key_id"), LedgerEntry.kind == "finished", LedgerEntry.output_tokens >= K)
_SEARCHED_BY_KEY = select(LedgerEntry.key_id, func.count()).where(
    LedgerEntry.key_id.in_(bindparam("key_ids", expanding=True)), LedgerEntry.kind == "finished",
    LedgerEntry.output_tokens >= K).group_by(LedgerEntry.key_id)
_INSERT = LedgerKgram.__table__.insert()
_STORED = select(LedgerKgram.generation_id, LedgerKgram.digest).where(
    LedgerKgram.generation_id.in_(bindparam("generation_ids", expanding=True)))


def kgram_key(secret: int) -> bytes:
    """The k-gram HMAC key of a watermark key secret (64-bit)."""
    return hashlib.sha256(b"hallmark-kgram-v1" + int(secret).to_bytes(8, "big")).digest()


def position_digests(token_ids: Sequence[int], secret: int, k: int = K,
                     memo: dict[bytes, int] | None = None) -> list[int]:
    """The 63-bit digest of the k-gram starting at each position of ``token_ids`` [n]
    (n - k + 1 of them; empty if n < k). ``memo``: digests of k-grams already hashed under
    ``secret`` (by their 4k bytes), read and extended: the forms of one text (as sent,
    normalised) share most of their k-grams, so each distinct one is hashed once."""
    # HMAC (RFC 2104) from two SHA-256 states, the key's inner and outer padded blocks hashed
    # once and copied per k-gram: the same digests as hmac.new(key, gram), without the hmac
    # module's Python wrapper around each copy (most of the time at ~200 k-grams a text).
    inner = outer = None
    data = struct.pack(f">{len(token_ids)}I", *[int(t) & 0xFFFFFFFF for t in token_ids])
    memo = {} if memo is None else memo
    out = []
    for start in range(0, len(token_ids) - k + 1):
        gram = data[4 * start:4 * (start + k)]
        digest = memo.get(gram)
        if digest is None:
            if inner is None:
                inner, outer = _hmac_states(kgram_key(secret))
            mac = inner.copy()
            mac.update(gram)
            final = outer.copy()
            final.update(mac.digest())
            digest = memo[gram] = int.from_bytes(final.digest()[:8], "big") >> (64 - DIGEST_BITS)
        out.append(digest)
    return out


def _hmac_states(key: bytes) -> tuple["hashlib._Hash", "hashlib._Hash"]:
    """SHA-256 states after HMAC's inner and outer padded key blocks (a key of at most one
    64-byte block, as kgram_key's 32 bytes)."""
    block = key.ljust(64, b"\0")
    return (hashlib.sha256(bytes(b ^ 0x36 for b in block)), hashlib.sha256(bytes(b ^ 0x5C for b in block)))


class KgramCache:
    """What one detection learns of a text's k-grams and of the ledger, within one read
    transaction (it holds query results: never keep it past the transaction).

    The forms of one text (as sent, normalised; detector.forms) share most of their k-grams:
    each distinct k-gram is hashed once per key, and each distinct digest looked up in the
    ledger once per key and scope, for every form and every look-up of the detection
    (:func:`find_matches`, :func:`shared_positions`). A look-up fetches the matching rows
    themselves, (generation, digest), rather than counts per generation: the counts and the
    shared positions of every generation then come from one query per key, at the cost of
    returning one row per shared (generation, k-gram) pair, as many as the count query read."""

    def __init__(self) -> None:
        self._memo: dict[int, dict[bytes, int]] = {}
        self._at: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        self._rows: dict[tuple[str, str | None], dict[int, list[str]]] = {}
        self._scope_of: dict[tuple[str, str], str | None] = {}
        self._searched: dict[str, int] = {}
        self._stored: dict[str, int | None] = {}

    def at(self, token_ids: Sequence[int], secret: int) -> list[int]:
        """:func:`position_digests` of ``token_ids`` [n] under ``secret``."""
        index = (int(secret), tuple(token_ids))
        found = self._at.get(index)
        if found is None:
            found = self._at[index] = position_digests(token_ids, secret, memo=self._memo.setdefault(int(secret), {}))
        return found

    def rows(self, session: Session, key_id: str, tenant_id: str | None, digests: Iterable[int]) -> dict[int, list[str]]:
        """Per digest looked up so far under ``key_id`` in scope ``tenant_id`` (None: every
        tenant), ``digests`` included: the generations that recorded it, one entry per row."""
        known = self._rows.setdefault((key_id, tenant_id), {})
        missing = sorted(d for d in set(digests) if d not in known)
        connection = session.connection()
        sqlite = connection.dialect.name == "sqlite"
        for chunk in _chunks(missing):
            if sqlite:  # the digests as one JSON parameter: no per-value bind rendering
                stmt = _ROWS_JSON if tenant_id is None else _ROWS_JSON_OF_TENANT
                values = json.dumps(chunk)
            else:
                stmt = _ROWS if tenant_id is None else _ROWS_OF_TENANT
                values = chunk
            known.update((d, []) for d in chunk)
            for generation_id, digest in connection.execute(
                    stmt, {"key_id": key_id, "tenant_id": tenant_id, "digests": values}).all():
                known[digest].append(generation_id)
                self._scope_of[key_id, generation_id] = tenant_id
        return known

    def searched(self, session: Session, key_id: str) -> int:
        if key_id not in self._searched:
            self._searched[key_id] = generations_searched(session, key_id)
        return self._searched[key_id]

    def searched_many(self, session: Session, key_ids: Sequence[str]) -> dict[str, int]:
        """:meth:`searched` of every key in ``key_ids``, in one query per :data:`_CHUNK` keys."""
        missing = [k for k in dict.fromkeys(key_ids) if k not in self._searched]
        for chunk in _chunks_of(missing):
            self._searched.update((k, 0) for k in chunk)
            self._searched.update((k, int(n)) for k, n in session.connection().execute(
                _SEARCHED_BY_KEY, {"key_ids": chunk}))
        return {k: self._searched[k] for k in key_ids}

    def prefetch(self, session: Session, keys: Sequence[tuple[str, int]], tenant_id: str | None,
                 forms: Sequence[Sequence[int]]) -> list[tuple[str, int]]:
        """Look up, under each key, the digests of every form of one text at once (one query
        per key and :data:`_CHUNK` digests, where each form alone would take one); returns
        the keys that can match at all. A key with no finished generation of at least
        :data:`K` tokens (one count query for every key) has no k-gram recorded under it:
        the gateway writes a generation's k-grams with its finished entry, and rows written
        without one never make a match (:meth:`stored`). Such keys are neither hashed nor
        queried: :func:`find_matches` on them finds nothing, with or without this."""
        searched = self.searched_many(session, [key_id for key_id, _ in keys])
        live = [(key_id, secret) for key_id, secret in keys if searched[key_id] > 0]
        for key_id, secret in live:
            self.rows(session, key_id, tenant_id, {d for tokens in forms for d in self.at(tokens, secret)})
        return live

    def stored(self, session: Session, generation_ids: Iterable[str]) -> dict[str, int]:
        """Digests recorded per generation (every key: a generation has one), for the
        generations whose recorded digests are exactly the set their logged ``finished``
        entry committed to (keys.tlog.logged_kgrams); the others are absent: rows inserted,
        deleted or moved by anyone without the log key never make a match."""
        missing = [g for g in dict.fromkeys(generation_ids) if g not in self._stored]
        if missing:
            found: dict[str, list[int]] = {g: [] for g in missing}
            for chunk in _chunks_of(missing):
                for generation_id, digest in session.connection().execute(_STORED, {"generation_ids": chunk}):
                    found[generation_id].append(int(digest))
            authentic = tlog.logged_kgrams(session, found)
            self._stored.update((g, len(set(found[g])) if g in authentic else None) for g in missing)
        return {g: c for g, c in self._stored.items() if c is not None}

    def shared(self, key_id: str, generation_id: str, at: Sequence[int]) -> set[int] | None:
        """The digests among ``at`` that ``generation_id`` recorded under ``key_id``, when the
        look-ups so far hold them all (None: they do not). A generation's k-grams are written
        once, under its tenant (:func:`record`), so the rows of the scope it was found in are
        all of its rows among the digests looked up there."""
        if (key_id, generation_id) not in self._scope_of:
            return None
        known = self._rows[key_id, self._scope_of[key_id, generation_id]]
        if any(d not in known for d in at):
            return None
        return {d for d in set(at) if generation_id in known[d]}


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
    return shared_positions(session, key_id=key_id, generation_ids=[generation_id], at=at, skip=skip)[generation_id]


def shared_positions(session: Session, *, key_id: str, generation_ids: Sequence[str], at: Sequence[int],
                     skip: int = 0, cache: KgramCache | None = None) -> dict[str, set[int]]:
    """:func:`matched_positions` for several generations under one key, in one query (per
    :data:`_CHUNK` distinct digests), or none where ``cache`` holds the rows already: per
    generation id, the positions of the text whose :func:`position_digests` are ``at``
    [n - k + 1] inside a k-gram it shares."""
    found: dict[str, set[int]] = {}
    for generation_id in dict.fromkeys(generation_ids):
        shared = None if cache is None else cache.shared(key_id, generation_id, at)
        if shared is not None:
            found[generation_id] = shared
    ids = [g for g in dict.fromkeys(generation_ids) if g not in found]
    if ids:
        found.update((g, set()) for g in ids)
        for chunk in _chunks(sorted(set(at))):
            for generation_id, digest in session.connection().execute(
                    _SHARED, {"key_id": key_id, "generation_ids": ids, "digests": chunk}):
                found[generation_id].add(digest)
    first = min(skip, K)
    return {g: {i for start, d in enumerate(at) if d in shared for i in range(start + first, start + K)}
            for g, shared in found.items()}


def kgram_set(key_id: str, secret: int, token_ids: Sequence[int]) -> tuple[str, set[int]]:
    """What a finished generation's ledger entry records and commits to (keys.ledger's
    ``kgram_set``): its key id and the distinct digests of its k-grams under that key."""
    return key_id, digests(token_ids, secret)


def store(session: Session, *, tenant_id: str, generation_id: str, key_id: str, digests: Iterable[int]) -> int:
    """Insert one generation's digests in the caller's transaction (keys.ledger does, with
    the entry that commits to them); returns how many."""
    rows = [{"tenant_id": tenant_id, "generation_id": generation_id, "key_id": key_id, "digest": int(d)}
            for d in sorted(set(digests))]
    if rows:
        session.connection().execute(_INSERT, rows)  # Core: the ORM's bulk insert costs more than the rows
    return len(rows)


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
    key_state_at_generation: str | None = None
    """The key's state the ledger recorded for the generation (keys.key_states)."""
    key_state_now: str | None = None
    """The key's state now."""

    def to_dict(self) -> dict[str, object]:
        return {"generation_id": self.generation_id, "key_id": self.key_id, "matched_kgrams": self.matched,
                "text_kgrams": self.queried, "generation_kgrams": self.stored,
                "share": round(self.matched / self.queried, 6) if self.queried else 0.0,
                "log10_false_match_bound": self.log10_false_match_bound,
                "shared_tokens": self.shared_tokens, "log10_shared_p": self.log10_shared_p,
                "key_state_at_generation": self.key_state_at_generation, "key_state_now": self.key_state_now}


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


def _chunks_of(values: list[str]) -> Iterable[list[str]]:
    for i in range(0, len(values), _CHUNK):
        yield values[i:i + _CHUNK]


def generations_searched(session: Session, key_id: str) -> int:
    """An upper bound on the generations with k-grams recorded under ``key_id`` (every tenant),
    the Bonferroni factor of :func:`false_match_log10`: the ``finished`` ledger entries under
    the key with at least :data:`K` output tokens. The gateway writes a generation's k-grams
    only in the transaction of its finished entry, under that entry's key, from the same token
    ids (service.generation), and a generation has at most one finished entry (a unique
    index); so the two counts are equal, except that records carried over from before the
    k-grams (migration 0006) count here too. Counting those entries (ix_ledger_entries_key_id:
    one row per generation and checkpoint) replaces counting distinct generations over every
    k-gram row of the key (about one per output token) on each request with a hit."""
    return int(session.connection().execute(_SEARCHED, {"key_id": key_id}).scalar() or 0)


def find_matches(session: Session, *, keys: Sequence[tuple[str, int]], token_ids: Sequence[int],
                 tenant_id: str | None, cache: KgramCache | None = None) -> list[KgramMatch]:
    """Generations sharing at least :data:`MIN_MATCHES` k-grams with ``token_ids``, under each
    ``(key_id, secret)``; scoped to ``tenant_id`` (None: every tenant). Best first.
    ``cache``: shared with the detection's other look-ups in the same transaction."""
    cache = KgramCache() if cache is None else cache
    out: list[KgramMatch] = []
    # dict.fromkeys: a `diverse` key comes as one candidate per salt, all with its key id
    # and secret (k-grams are keyed by the key's own secret, not the salt's).
    keys = list(dict.fromkeys(keys))
    recorded = cache.searched_many(session, [key_id for key_id, _ in keys])
    for key_id, secret in keys:
        if recorded[key_id] == 0:  # nothing recorded under the key (KgramCache.prefetch)
            continue
        query = sorted(set(cache.at(token_ids, secret)))
        if not query:
            continue
        rows = cache.rows(session, key_id, tenant_id, query)
        counts: dict[str, int] = {}
        for digest in query:
            for generation_id in rows[digest]:
                counts[generation_id] = counts.get(generation_id, 0) + 1
        # Ties keep the generation ids' order (what SQLite's GROUP BY gave before, for any database).
        hits = {g: counts[g] for g in sorted(counts) if counts[g] >= MIN_MATCHES}
        if not hits:
            continue
        # At least the generations seen matching, whatever the ledger holds.
        searched = max(cache.searched(session, key_id), len(counts), 1)
        stored = cache.stored(session, hits)
        for generation_id, matched in hits.items():
            if generation_id not in stored:  # not as the log holds it: never cited
                continue
            m = stored[generation_id] or matched
            out.append(KgramMatch(generation_id=generation_id, key_id=key_id, matched=matched, queried=len(query),
                                  stored=m, log10_false_match_bound=false_match_log10(matched, len(query), m,
                                                                                      searched)))
    return sorted(out, key=lambda match: (match.log10_false_match_bound, -match.matched))
