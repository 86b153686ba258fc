"""Ledger retrieval: keyed hashes of a generation's token k-grams, and matching a text to them.

Each recorded generation stores, per distinct k-gram of its output token ids (k = 8), the
first 63 bits of an HMAC-SHA256 under a k-gram key, tagged with the scheme that names it:

- scheme 2 (every generation recorded since migration 0010): the store's one k-gram key,
  derived from the transparency-log key (ledger.log.key: a random secret held only wrapped
  under the KEK, created with the log, re-wrapped by ``kek rotate``, never rotated), so a
  text is hashed once and looked up in one query (per :data:`CHUNK` digests) for every key
  and tenant in scope: ``digest IN (...)``, plus ``tenant_id = :t`` for a tenant's search.
- scheme 1 (rows recorded before): a key derived from the generation's watermark key secret,
  SHA-256("hallmark-kgram-v1" || secret as 8 bytes big-endian); still matched, per key, for
  the keys that have such rows (one query says which; a store created since has none).

Global, not per tenant: one key per store makes an operator's search of every tenant one
hash and one query, as a tenant's is; a per-tenant key would cost one hash and one query
per tenant. What it gives away: digests are now equal across keys and tenants wherever two
generations share an 8-token run, so whoever reads the table sees that two generations (of
any tenants) share some phrase, as scheme 1 already showed within one key. It still holds
that no text and no token id is stored and that, without the key store (the KEK), the
digests reveal nothing and cannot be tested against a guessed text.

False-match bound. For a text unrelated to generation G (no shared k-gram), a shared
digest needs a 63-bit HMAC collision: probability at most 2^-63 per (query, stored) pair,
treating HMAC-SHA256 as a PRF. With Q query digests and M stored digests of G, the number
X of chance matches satisfies P(X >= x) <= (Q M 2^-63)^x / x! (union bound over the
x-subsets of pairs); multiplied by the number of generations searched, or an upper bound on
it (Bonferroni): under scheme 1 the key's (:func:`generations_searched`), under scheme 2
every generation of the scope searched (:func:`generations_in_scope`: the tenant's, or the
store's), which the one look-up reaches. This bounds chance collisions only: a real shared
8-token phrase is a real match, which is why the share of the text's k-grams that matched is
reported beside it.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from sqlalchemy import bindparam, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from keys.models import LedgerKgram
from ledger.kgram_cache import (  # noqa: F401  (KgramCache and the counts re-exported)
    CHUNK, KgramCache, chunks, generations_in_scope, generations_searched, positions, store_kgram_key)
from ledger.kgram_digests import (  # noqa: F401  (re-exported: what callers read as kgrams.*)
    DIGEST_BITS, K, V1, V2, KgramSet, digests, keyed_position_digests, kgram_key, kgram_set, position_digests)
from ledger.kgram_match import MIN_MATCHES, KgramMatch, false_match_log10  # noqa: F401  (re-exported)


_SHARED = select(LedgerKgram.generation_id, LedgerKgram.scheme, LedgerKgram.digest).where(
    LedgerKgram.key_id == bindparam("key_id"), LedgerKgram.digest.in_(bindparam("digests", expanding=True)),
    LedgerKgram.generation_id.in_(bindparam("generation_ids", expanding=True)))
_SQLITE_INSERT = "INSERT INTO ledger_kgrams (tenant_id, generation_id, key_id, digest, scheme) VALUES (?, ?, ?, ?, ?)"
_PG_INSERT = text("INSERT INTO ledger_kgrams (tenant_id, generation_id, key_id, digest, scheme) "
                  "SELECT * FROM unnest(CAST(:t AS varchar[]), CAST(:g AS varchar[]), CAST(:k AS varchar[]), "
                  "CAST(:d AS bigint[]), CAST(:s AS smallint[]))")
"""PostgreSQL: every row in one statement (psycopg's executemany sends one query per row)."""


def matched_positions(session: Session, *, key_id: str, generation_id: str, secret: int,
                      token_ids: Sequence[int], skip: int = 0, cache: KgramCache | None = None) -> set[int]:
    """Positions of ``token_ids`` [n] inside a k-gram that generation ``generation_id``
    recorded under ``key_id`` (the tokens the text shares with it), leaving out the first
    ``skip`` of each k-gram (a watermark context width: those tokens' contexts reach before
    the shared run). ``secret``: the key's watermark secret (scheme 1's k-gram key)."""
    return shared_positions(session, key_id=key_id, generation_ids=[generation_id], token_ids=token_ids,
                            secret=secret, skip=skip, cache=cache)[generation_id]


def shared_positions(session: Session, *, key_id: str, generation_ids: Sequence[str], token_ids: Sequence[int],
                     secret: int, skip: int = 0, cache: KgramCache | None = None) -> dict[str, set[int]]:
    """:func:`matched_positions` for several generations under one key: none where ``cache``
    holds their rows already (the look-up that found them), else one query (per
    :data:`CHUNK` distinct digests) for the rest, each generation read under its own scheme."""
    cache = KgramCache() if cache is None else cache
    found: dict[str, set[int]] = {}
    for generation_id in dict.fromkeys(generation_ids):
        shared = cache.shared(session, key_id, generation_id, token_ids, secret)
        if shared is not None:
            found[generation_id] = positions(shared[0], shared[1], skip)
    ids = [g for g in dict.fromkeys(generation_ids) if g not in found]
    if ids:
        at = {V1: cache.at(token_ids, secret), V2: cache.at2(session, token_ids)}
        rows: dict[str, dict[int, set[int]]] = {g: {} for g in ids}
        query = sorted({d for digests_ in at.values() if digests_ for d in digests_})
        for chunk in chunks(query):
            for generation_id, scheme, digest in session.connection().execute(
                    _SHARED, {"key_id": key_id, "generation_ids": ids, "digests": chunk}):
                rows[generation_id].setdefault(int(scheme), set()).add(digest)
        for generation_id in ids:
            # One scheme per generation (ledger.entries writes them so); none shared: no position.
            by_scheme = rows[generation_id]
            found[generation_id] = set().union(*(positions(at[s], shared, skip) for s, shared in by_scheme.items()
                                                 if at.get(s)))
    return found


def store(session: Session, *, tenant_id: str, generation_id: str, key_id: str, digests: Iterable[int],
          scheme: int = V1) -> int:
    """Insert one generation's digests under ``scheme`` in the caller's transaction (ledger.entries
    does, with the entry that commits to them); returns how many."""
    return store_many(session, [(tenant_id, generation_id, key_id, digests, scheme)])


def store_many(session: Session, generations: Sequence[tuple[str, str, str, Iterable[int], int]]) -> int:
    """:func:`store` of several generations (tenant id, generation id, key id, digests, scheme)
    in one statement (ledger.grouped: a group of streams' finished entries)."""
    rows = [(tenant_id, generation_id, key_id, int(d), scheme)
            for tenant_id, generation_id, key_id, digests, scheme in generations for d in sorted(set(digests))]
    if not rows:
        return 0
    connection = session.connection()
    if connection.dialect.name == "postgresql":
        columns = list(zip(*rows))
        connection.execute(_PG_INSERT, {"t": list(columns[0]), "g": list(columns[1]), "k": list(columns[2]),
                                        "d": list(columns[3]), "s": list(columns[4])})
    else:
        # The driver's executemany with tuples: through SQLAlchemy's Core each row's parameters
        # were processed in Python (~4 µs a row; 256 streams' finished entries are ~31,000 rows).
        dbapi = connection.dialect.loaded_dbapi
        cursor = connection.connection.driver_connection.cursor()
        try:
            cursor.executemany(_SQLITE_INSERT, rows)
        except dbapi.Error as exc:  # as SQLAlchemy's error (keys.db.translate_error), parameters hidden
            raise DBAPIError.instance(_SQLITE_INSERT, None, exc, dbapi.Error, hide_parameters=True) from None
        finally:
            cursor.close()
    return len(rows)


def find_matches(session: Session, *, keys: Sequence[tuple[str, int]], token_ids: Sequence[int],
                 tenant_id: str | None, cache: KgramCache | None = None) -> list[KgramMatch]:
    """Generations sharing at least :data:`MIN_MATCHES` k-grams with ``token_ids``, under each
    ``(key_id, secret)``; scoped to ``tenant_id`` (None: every tenant). Best first.
    ``cache``: shared with the detection's other look-ups in the same request. Scheme 2
    rows: one hash of the text and one look-up for every key; scheme 1 rows: per key that
    has them (none on a store created since migration 0010)."""
    cache = KgramCache() if cache is None else cache
    # dict.fromkeys: a `diverse` key comes as one candidate per salt, all with its key id
    # and secret (scheme 1 k-grams are keyed by the key's own secret, not the salt's).
    keys = list(dict.fromkeys(keys))
    found = _matches_v2(session, keys, token_ids, tenant_id, cache)
    old = cache.v1_keys(session)
    v1 = _matches_v1(session, [(key_id, secret) for key_id, secret in keys if key_id in old], token_ids,
                     tenant_id, cache)
    out = [m for key_id in dict.fromkeys(key_id for key_id, _ in keys)
           for m in (*found.get(key_id, ()), *v1.get(key_id, ()))]
    return sorted(out, key=lambda match: (match.log10_false_match_bound, -match.matched))


def _matches_v2(session: Session, keys: Sequence[tuple[str, int]], token_ids: Sequence[int], tenant_id: str | None,
                cache: KgramCache) -> dict[str, list[KgramMatch]]:
    wanted = {key_id for key_id, _ in keys}
    # What the look-up read (KgramCache.read_all), counted in arrays; else row by row.
    fast = cache.counts2(session, token_ids, tenant_id, wanted)
    if fast is not None:
        queried, seen_count, counts = fast
        if not queried:
            return {}
    else:
        at = cache.at2(session, token_ids)
        query = sorted(set(at or ()))
        if not query:
            return {}
        rows = cache.rows2(session, tenant_id, query)
        counts = {}
        seen: set[str] = set()
        for digest in query:
            # Distinct rows: a row copied by someone without the log key counts once (and its
            # generation is no longer authentic: KgramCache.stored).
            for generation_id, key_id in set(rows[digest]):
                seen.add(generation_id)
                if key_id in wanted:
                    counts[key_id, generation_id] = counts.get((key_id, generation_id), 0) + 1
        queried, seen_count = len(query), len(seen)
    # Ties keep the generation ids' order within a key, as scheme 1's look-up gives.
    hits = sorted((key_id, g) for (key_id, g), n in counts.items() if n >= MIN_MATCHES)
    if not hits:
        return {}
    # At least the generations seen matching, whatever the ledger holds.
    searched = max(cache.searched2(session, tenant_id), seen_count, 1)
    stored = cache.stored(session, [g for _, g in hits])
    out: dict[str, list[KgramMatch]] = {}
    for key_id, generation_id in hits:
        if generation_id not in stored:  # not as the log holds it: never cited
            continue
        matched = counts[key_id, generation_id]
        m = stored[generation_id] or matched
        out.setdefault(key_id, []).append(KgramMatch(
            generation_id=generation_id, key_id=key_id, matched=matched, queried=queried, stored=m,
            log10_false_match_bound=false_match_log10(matched, queried, m, searched)))
    return out


def _matches_v1(session: Session, keys: Sequence[tuple[str, int]], token_ids: Sequence[int], tenant_id: str | None,
                cache: KgramCache) -> dict[str, list[KgramMatch]]:
    out: dict[str, list[KgramMatch]] = {}
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
            for generation_id in set(rows[digest]):
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
            out.setdefault(key_id, []).append(KgramMatch(
                generation_id=generation_id, key_id=key_id, matched=matched, queried=len(query), stored=m,
                log10_false_match_bound=false_match_log10(matched, len(query), m, searched)))
    return out
