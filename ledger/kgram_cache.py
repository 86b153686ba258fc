"""What one detection learns of a text's k-grams and of the ledger's k-gram rows
(:class:`KgramCache`), the statements it reads them with, and the counts that bound a
look-up's false matches (:func:`generations_searched`, :func:`generations_in_scope`).
:mod:`ledger.kgrams` says what the digests are and matches texts with them.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Iterable, Sequence, TypeVar

import numpy as np

from sqlalchemy import bindparam, func, select, text
from sqlalchemy.orm import Session

from keys.models import LedgerEntry, LedgerKgram
from ledger import kgram_index
from ledger.kgram_digests import K, V1, V2, DigestArray, keyed_position_digests, kgram_key
from ledger.log.leaves import kgram_array_commitment
from ledger.log import tlog

T = TypeVar("T")

CHUNK = 500
"""Digests (or ids) per query: one statement per this many."""

# Statements built once, their lists bound at execution (expanding parameters): an IN list
# of literals is coerced element by element each time a statement is built.
_ROWS = select(LedgerKgram.generation_id, LedgerKgram.digest).where(
    LedgerKgram.key_id == bindparam("key_id"), LedgerKgram.digest.in_(bindparam("digests", expanding=True)),
    LedgerKgram.scheme == V1)
_ROWS_OF_TENANT = _ROWS.where(LedgerKgram.tenant_id == bindparam("tenant_id"))
# SQLite: the digests bound as one JSON array (json_each), the index on (key_id, digest) still
# used: a look-up of ~250 digests renders no bind parameter per value.
_ROWS_JSON = text("SELECT generation_id, digest FROM ledger_kgrams WHERE key_id = :key_id "
                  "AND digest IN (SELECT value FROM json_each(:digests)) AND scheme = 1")
_ROWS_JSON_OF_TENANT = text("SELECT generation_id, digest FROM ledger_kgrams WHERE key_id = :key_id "
                            "AND digest IN (SELECT value FROM json_each(:digests)) AND scheme = 1 "
                            "AND tenant_id = :tenant_id")
# Scheme 2: every key of the scope in one statement (ix_ledger_kgrams_digest_tenant).
_ROWS2 = select(LedgerKgram.generation_id, LedgerKgram.key_id, LedgerKgram.digest).where(
    LedgerKgram.digest.in_(bindparam("digests", expanding=True)), LedgerKgram.scheme == V2)
_ROWS2_OF_TENANT = _ROWS2.where(LedgerKgram.tenant_id == bindparam("tenant_id"))
_ROWS2_JSON = text("SELECT generation_id, key_id, digest FROM ledger_kgrams "
                   "WHERE digest IN (SELECT value FROM json_each(:digests)) AND scheme = 2")
_ROWS2_JSON_OF_TENANT = text("SELECT generation_id, key_id, digest FROM ledger_kgrams "
                             "WHERE digest IN (SELECT value FROM json_each(:digests)) AND scheme = 2 "
                             "AND tenant_id = :tenant_id")
# Which keys have scheme 1 rows: a loose index scan of ix_ledger_kgrams_v1_key (partial, scheme
# 1), one index probe per such key, whatever the rows per key (none at all on a fresh store).
_V1_KEYS = text("WITH RECURSIVE k(key_id) AS ("
                "SELECT min(key_id) FROM ledger_kgrams WHERE scheme = 1 UNION ALL "
                "SELECT (SELECT min(key_id) FROM ledger_kgrams WHERE scheme = 1 AND key_id > k.key_id) "
                "FROM k WHERE k.key_id IS NOT NULL) SELECT key_id FROM k WHERE key_id IS NOT NULL")

def _read_all(dialect: str, scoped: bool, indexed: bool = False) -> str:
    """One statement for what a detection reads of the k-gram table (:meth:`KgramCache.read_all`),
    its parts told apart by the first column: 0, the scheme 2 rows of the text's digests
    (:data:`_ROWS2`) but those of part 1's generations (part 1 holds them); 1, every row of
    each generation matching at least ``min_matches`` of
    them, or named in ``exact`` (:data:`_STORED`: their check against the log and an exact
    copy's id recovery); 2, the scope's finished generations (:func:`generations_in_scope`),
    counted only when some generation matched; 3, the keys with scheme 1 rows (:data:`_V1_KEYS`);
    4, the exact copies of the text (its output hash: statement 1 folded in), with their
    latest matching entry's id (their order), whose rows part 1 reads too.
    Generations named in ``known`` (their rows held already, verified against the log:
    :class:`VerifiedRows`) are left out of parts 0 and 1: their rows come from that cache.
    Written for the driver (its parameter style, sent with ``exec_driver_sql``: no statement
    compiled or parameter processed by SQLAlchemy on each request); every column of every part
    non-null where the reader makes arrays of it (digest, scheme)."""
    if dialect == "sqlite":  # the lists as JSON arrays (no bind parameter per value)
        digests, exact = "SELECT value FROM json_each(:digests)", "SELECT value FROM json_each(:exact)"
        known = "SELECT value FROM json_each(:known)"
        param = ":{}".format
        joined = "group_concat(digest)"
        text_of = "CAST({} AS TEXT)".format
    else:
        digests = "SELECT unnest(CAST(%(digests)s AS BIGINT[]))"
        exact = "SELECT unnest(CAST(%(exact)s AS VARCHAR[]))"
        known = "SELECT unnest(CAST(%(known)s AS VARCHAR[]))"
        param = "%({})s".format
        joined = "string_agg(CAST(digest AS VARCHAR), ',')"
        text_of = "CAST({} AS VARCHAR)".format
    tenant = f" AND tenant_id = {param('tenant_id')}" if scoped else ""
    # The exact copies (ledger.read.find_generations_by_output_hash's generations: the latest
    # 100 with an entry of this output hash in scope, by their latest such entry).
    copies = (f"copies AS (SELECT generation_id, max(id) AS latest FROM ledger_entries "
              f"WHERE output_sha256 = {param('output_sha256')}{tenant} GROUP BY generation_id "
              f"ORDER BY max(id) DESC LIMIT {EXACT_LIMIT}), ")
    # Parts 0 and 1 come one row per (generation, key[, scheme, tenant]) with their digests
    # joined (comma-separated, every row's: duplicates kept): a matched generation's ~one
    # row per output token would otherwise cost a Python row each to fetch.
    v1 = ("WITH RECURSIVE v1(key_id) AS ("
          "SELECT min(key_id) FROM ledger_kgrams WHERE scheme = 1 UNION ALL "
          "SELECT (SELECT min(key_id) FROM ledger_kgrams WHERE scheme = 1 AND key_id > v1.key_id) "
          "FROM v1 WHERE v1.key_id IS NOT NULL), ")
    rest = (
        f"UNION ALL SELECT 1, generation_id, key_id, {joined}, scheme, tenant_id FROM ledger_kgrams "
        f"WHERE generation_id IN (SELECT generation_id FROM gens) AND generation_id NOT IN ({known}) "
        "GROUP BY generation_id, key_id, scheme, tenant_id "
        f"UNION ALL SELECT 2, CAST(NULL AS VARCHAR), CAST(NULL AS VARCHAR), {text_of('count(*)')}, 2, "
        "CAST(NULL AS VARCHAR) "
        f"FROM ledger_entries WHERE kind = 'finished' AND output_tokens >= {K}{tenant} "
        "AND EXISTS (SELECT 1 FROM gens) UNION ALL "
        "SELECT 3, CAST(NULL AS VARCHAR), key_id, CAST(NULL AS VARCHAR), 1, CAST(NULL AS VARCHAR) "
        "FROM v1 WHERE key_id IS NOT NULL UNION ALL "
        f"SELECT 4, generation_id, CAST(NULL AS VARCHAR), {text_of('latest')}, 2, CAST(NULL AS VARCHAR) FROM copies")
    if not indexed:
        return (
            f"{v1}hits AS MATERIALIZED (SELECT generation_id, key_id, digest FROM ledger_kgrams "
            f"WHERE digest IN ({digests}) AND scheme = 2{tenant}), "
            f"{copies}"
            "gens AS (SELECT generation_id FROM hits GROUP BY generation_id "
            f"HAVING count(DISTINCT digest) >= {param('min_matches')} UNION {exact} "
            "UNION SELECT generation_id FROM copies) "
            f"SELECT 0 AS part, generation_id, key_id, {joined} AS digests, 2 AS scheme, "
            "CAST(NULL AS VARCHAR) AS tenant_id "
            f"FROM hits WHERE generation_id NOT IN (SELECT generation_id FROM gens) AND generation_id NOT IN ({known}) "
            f"GROUP BY generation_id, key_id {rest}")
    # With the in-process index (ledger.kgram_index): no probe of the text's digests. The
    # generations it names (``cand``) are read in full (part 1) as the probe's were; the rows
    # of the entries logged since the index's ``covered`` come back whole (part 5: the index's
    # catch-up; every row of each such generation, so they need no part 1, and their hits are
    # counted in Python: no per-row test against the text's digests here, which PostgreSQL
    # plans as a nested loop); part 6 names ``gens``; part 7 is the log's head (border and MAC
    # as hex, size) and its highest leaf (ledger.kgram_index says why).
    cand = exact.replace("exact", "cand")
    hex_of = "hex({})".format if dialect == "sqlite" else "encode({}, 'hex')".format
    rest = rest.replace("AND EXISTS (SELECT 1 FROM gens)",
                        "AND (EXISTS (SELECT 1 FROM gens) OR EXISTS (SELECT 1 FROM delta))")
    return (
        f"{v1}head AS MATERIALIZED (SELECT size, border, mac FROM log_head WHERE id = 1), "
        "delta AS MATERIALIZED (SELECT k.generation_id, k.key_id, k.digest, k.scheme, k.tenant_id "
        "FROM log_leaves l JOIN ledger_entries e ON e.id = l.entry_id "
        "JOIN ledger_kgrams k ON k.generation_id = e.generation_id "
        f"WHERE l.idx >= {param('covered')} AND l.idx < (SELECT size FROM head) AND e.kind = 'finished'), "
        f"{copies}"
        f"gens(generation_id) AS ({cand} UNION {exact} UNION SELECT generation_id FROM copies) "
        f"SELECT 5 AS part, generation_id, key_id, {joined} AS digests, scheme, tenant_id FROM delta "
        f"GROUP BY generation_id, key_id, scheme, tenant_id {rest} "
        "UNION ALL SELECT 6, generation_id, CAST(NULL AS VARCHAR), CAST(NULL AS VARCHAR), 2, CAST(NULL AS VARCHAR) "
        "FROM gens UNION ALL "
        f"SELECT 7, {hex_of('border')}, {hex_of('mac')}, {text_of('size')}, 2, "
        f"{text_of('(SELECT max(idx) FROM log_leaves)')} FROM head")


EXACT_LIMIT = 100
"""Exact copies read (ledger.read.find_generations_by_output_hash's default limit)."""

_READ_ALL = {(dialect, scoped, indexed): _read_all(dialect, scoped, indexed) for dialect in ("sqlite", "postgresql")
             for scoped in (False, True) for indexed in (False, True)}
_FINISHED = (LedgerEntry.kind == "finished", LedgerEntry.output_tokens >= K)
_SEARCHED = select(func.count()).select_from(LedgerEntry).where(LedgerEntry.key_id == bindparam("key_id"), *_FINISHED)
_SEARCHED_BY_KEY = select(LedgerEntry.key_id, func.count()).where(
    LedgerEntry.key_id.in_(bindparam("key_ids", expanding=True)), *_FINISHED).group_by(LedgerEntry.key_id)
_IN_STORE = select(func.count()).select_from(LedgerEntry).where(*_FINISHED)
_IN_TENANT = _IN_STORE.where(LedgerEntry.tenant_id == bindparam("tenant_id"))
_STORED = select(LedgerKgram.generation_id, LedgerKgram.scheme, LedgerKgram.digest, LedgerKgram.key_id,
                 LedgerKgram.tenant_id).where(
    LedgerKgram.generation_id.in_(bindparam("generation_ids", expanding=True)))


def rows_match_leaf(leaf, row, schemes: np.ndarray, digests: np.ndarray, labels: set[tuple[str, str]]) -> bool:
    """:func:`ledger.log.tlog.kgrams_matching`'s test of one generation, its rows given as
    arrays (scheme, digest per row): the rows are exactly the set, under one scheme, that its
    logged ``finished`` entry ``row`` committed to in ``leaf`` (already checked as the log
    holds it: tlog.logged_entries), each row once, and carry that entry's key and tenant."""
    if leaf.kgrams_sha256 != kgram_array_commitment(schemes, digests):
        return False
    if len(schemes) and int(schemes.min()) != int(schemes.max()):  # pragma: no cover - never committed
        distinct = len(set(zip(schemes.tolist(), digests.tolist())))
    else:
        distinct = int(np.unique(digests).size)
    return distinct == len(digests) and labels <= {(row.key_id, row.tenant_id)}


def store_kgram_key(session: Session) -> bytes | None:
    """Scheme 2's k-gram HMAC key: the store's (ledger.log.key), None while it has no log key
    (or this process no KEK). Never logged, returned or stored apart from the log key."""
    auth = tlog.authority(session)
    return None if auth is None else auth.kgram_key


def positions(at: Sequence[int], shared: set[int], skip: int) -> set[int]:
    """The token positions covered by the k-grams at ``at`` [n] whose digest is in ``shared``,
    leaving out the first ``skip`` of each k-gram."""
    first = min(skip, K)
    return {i for start, d in enumerate(at) if d in shared for i in range(start + first, start + K)}


def chunks(values: list[T]) -> Iterable[list[T]]:
    for i in range(0, len(values), CHUNK):
        yield values[i:i + CHUNK]


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


def generations_in_scope(session: Session, tenant_id: str | None) -> int:
    """An upper bound on the generations with scheme 2 k-grams in scope ``tenant_id`` (None:
    the store), the Bonferroni factor of a scheme 2 look-up, which searches all of them at
    once: the scope's ``finished`` entries with at least :data:`K` output tokens, one count
    (:func:`generations_searched` says why that bounds the generations with k-grams)."""
    if tenant_id is None:
        return int(session.connection().execute(_IN_STORE).scalar() or 0)
    return int(session.connection().execute(_IN_TENANT, {"tenant_id": tenant_id}).scalar() or 0)


@dataclass(frozen=True)
class _Verified:
    """Every k-gram row of one generation, as read once and found to be exactly what its
    logged ``finished`` entry committed to (:func:`rows_match_leaf`)."""

    commitment: str
    """The leaf's ``kgrams_sha256`` the rows matched."""
    schemes: np.ndarray
    digests: np.ndarray
    """int64, one per row, as read (an authentic generation's digests are distinct)."""
    ordered: np.ndarray
    """``digests`` ascending (the text's digests are intersected with it)."""
    label: tuple[str, str] | None
    """The (key id, tenant id) every row carries (None: no row)."""


class VerifiedRows:
    """The k-gram rows of generations already checked against the transparency log, kept
    across requests (issue 30): a detection that matches a generation read all of its ~200
    rows (~one per output token) for that check, on every request.

    Why this is safe: the rows kept are only those that matched their generation's logged
    commitment (every row once, the entry's key and tenant), which is what the log says the
    generation recorded; a generation's rows are written once, with its finished entry, and
    never changed by the gateway (append-only). Each request still reads the generation's
    entries, leaves and key states fresh (ledger.read.detection_facts) and cites a kept
    generation only if its finished entry is still logged as written and its leaf still
    commits to the kept rows (:meth:`KgramCache.stored`); key states and revocations are
    never kept. So an operator who edits, deletes, relabels or inserts the rows of a kept
    generation afterwards changes nothing a detection says: it answers from the authentic
    rows, exactly as on the untampered store (tests/ledger/test_kgram_schemes.py); a
    generation never verified is still read and checked in full, and tampering there still
    keeps it from being cited. Kept per store by its k-gram key (a copy of a store shares its
    log, and so its authentic rows); at most :data:`VERIFIED_MAX` generations in all, the
    whole cache dropped when full (a detection then reads and checks them again)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[bytes, dict[str, _Verified]] = {}
        self._by_digest: dict[bytes, dict[int, tuple[str, ...]]] = {}
        self._size = 0

    def get(self, store_key: bytes, generation_id: str) -> _Verified | None:
        kept = self._kept.get(store_key)
        return None if kept is None else kept.get(generation_id)

    def sharing(self, store_key: bytes, query: list[int], exact: Sequence[str]) -> dict[str, _Verified]:
        """The kept generations with a scheme 2 row among ``query``'s digests, or named in ``exact``."""
        kept = self._kept.get(store_key)
        if not kept:
            return {}
        index = self._by_digest[store_key]
        found = {g for gens in map(index.get, query) if gens is not None for g in gens}
        found.update(g for g in exact if g in kept)
        # (sorted: the statement's parameters, and so the answer, do not depend on set order)
        return {g: kept[g] for g in sorted(found) if g in kept}

    def keep(self, store_key: bytes, generation_id: str, verified: _Verified) -> None:
        with self._lock:
            if self._size >= VERIFIED_MAX:
                self._kept.clear()
                self._by_digest.clear()
                self._size = 0
            kept = self._kept.setdefault(store_key, {})
            if generation_id in kept:
                return
            index = self._by_digest.setdefault(store_key, {})
            for scheme, d in zip(verified.schemes.tolist(), verified.digests.tolist()):
                if scheme == V2:
                    index[d] = (*index.get(d, ()), generation_id)
            kept[generation_id] = verified
            self._size += 1

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._by_digest.clear()
            self._size = 0


VERIFIED_MAX = 512
"""Generations :data:`VERIFIED` keeps in all (each ~200 rows and as many digest-index entries: ~10 MB when full)."""
VERIFIED = VerifiedRows()
"""This process's :class:`VerifiedRows`."""


def forget_verified() -> None:
    """Drop every kept generation (tests: the full read and check again)."""
    VERIFIED.clear()


@dataclass
class _Read:
    """What :meth:`KgramCache.read_all` read: per (generation, key) the distinct digests of
    its scheme 2 rows in scope that the text has (a row copied by someone without the log key
    counts once), and every row of the generations it names."""

    scope: str | None
    query: np.ndarray
    """The text's distinct digests (every form's), int64, ascending."""
    generations: dict[str, None]
    """The generations named (exact copies first): their rows are in ``recorded``."""
    pairs: dict[tuple[str, str], set[int]]
    """(generation id, key id) -> the text's digests among its rows (the hits)."""
    recorded: dict[str, tuple[np.ndarray, np.ndarray]]
    """generation -> (schemes, digests) of its rows, int64, one entry per row."""
    labels: dict[str, set[tuple[str, str]]]
    searched: int | None
    v1_keys: frozenset[str]
    cached: dict[str, _Verified]
    """The generations whose rows came from :class:`VerifiedRows`, not the statement."""
    copies: dict[str, int]
    """The exact copies found by output hash (part 4): generation -> its latest matching entry id."""

    @classmethod
    def of(cls, rows: Sequence[Sequence], scope: str | None, query: np.ndarray, exact: Sequence[str],
           cached: dict[str, _Verified] | None = None,
           indexed: "tuple[set[str], dict[tuple[str, str], set[int]]] | None" = None) -> "_Read":
        """From :func:`_read_all`'s rows: (part, generation, key, digests joined by commas, scheme,
        tenant), and the ``cached`` generations' kept rows (the statement left them out): their
        hits and rows as the statement gives those of an untouched store."""
        from ledger.kgram_match import MIN_MATCHES

        cached = cached or {}

        generations: dict[str, None] = dict.fromkeys(exact)
        labels: dict[str, set[tuple[str, str]]] = {g: set() for g in exact}
        empty = np.zeros(0, np.int64)
        recorded: dict[str, tuple[list, list]] = {g: ([], []) for g in exact}
        searched, v1 = None, set()
        pairs: dict[tuple[str, str], set[int]] = {}
        wanted: set[int] | None = None
        copies: dict[str, int] = {}
        for part, generation_id, key_id, joined, scheme, row_tenant in rows:
            if part >= 2:
                if part == 2:
                    searched = int(joined or 0)
                elif part == 3:
                    v1.add(key_id)
                else:
                    copies[generation_id] = int(joined)
                continue
            digests = _digests_of(joined)
            found = set(digests.tolist())
            if part == 1:
                generations.setdefault(generation_id)
                labels.setdefault(generation_id, set()).add((key_id, row_tenant))
                schemes_of, digests_of = recorded.setdefault(generation_id, ([], []))
                schemes_of.append(np.full(len(digests), int(scheme), np.int64))
                digests_of.append(digests)
                if scheme != V2 or (scope is not None and row_tenant != scope):
                    continue
                # Part 1's scheme 2 rows in scope among the text's digests are hits too (part 0
                # leaves them out: they are sent once).
                wanted = set(query.tolist()) if wanted is None else wanted
                found &= wanted
                if not found:
                    continue
            pairs.setdefault((generation_id, key_id), set()).update(found)
        for generation_id in copies:  # named, as ``exact`` is (rows or none)
            generations.setdefault(generation_id)
            labels.setdefault(generation_id, set())
            recorded.setdefault(generation_id, ([], []))
        if indexed is not None:
            # With the index (_with_index): the statement's ``gens`` were read in full (part 1),
            # their hits from those rows, as the probe's; a candidate without rows now (deleted
            # since it was indexed) is read as having none. The others' hits (fewer than
            # MIN_MATCHES: what part 0 gave) come from the index and the rows logged since.
            gens, index_pairs = indexed
            for generation_id in gens:
                if generation_id not in cached:
                    generations.setdefault(generation_id)
                    labels.setdefault(generation_id, set())
                    recorded.setdefault(generation_id, ([], []))
            for (generation_id, key_id), digests in index_pairs.items():
                if generation_id not in gens and generation_id not in cached:
                    pairs.setdefault((generation_id, key_id), set()).update(
                        digests.tolist() if isinstance(digests, np.ndarray) else digests)
        stacked = {g: (np.concatenate(s) if s else empty, np.concatenate(d) if d else empty)
                   for g, (s, d) in recorded.items() if g not in cached}
        for generation_id, kept in cached.items():
            # As parts 0 and 1 read them: the scheme 2 rows in scope among the text's digests
            # are its hits; every row when it has MIN_MATCHES of them (distinct) or is an exact copy.
            label = kept.label
            hits = empty
            if label is not None and (scope is None or label[1] == scope) and len(kept.ordered) and \
                    int(kept.schemes[0]) == V2:
                hits = np.intersect1d(query, kept.ordered, assume_unique=True)
            if generation_id in generations or len(hits) >= MIN_MATCHES:
                generations.setdefault(generation_id)
                labels[generation_id] = set() if label is None else {label}
                stacked[generation_id] = (kept.schemes, kept.digests)
            if len(hits):
                pairs[generation_id, label[0]] = set(hits.tolist())
        return cls(scope, query, generations, pairs, stacked, labels, searched, frozenset(v1), cached, copies)


def _digests_of(joined) -> np.ndarray:
    """int64 digests from their comma-joined text (PostgreSQL may hand an array back as a list)."""
    if isinstance(joined, str):
        found = np.fromstring(joined, dtype=np.int64, sep=",")
        if len(found) == joined.count(",") + 1:
            return found
        joined = joined.split(",")  # pragma: no cover - not the database's integers
    return np.asarray([int(v) for v in joined], dtype=np.int64)


def _with_index(session: Session, index: "kgram_index.KgramIndex", snapshot: "kgram_index.Snapshot",
                found: "kgram_index.Found", rows: list, query: np.ndarray, scope: str | None,
                cached: "dict[str, _Verified] | None" = None):
    """The indexed statement's rows as :meth:`_Read.of` takes them (parts 1-4), and (the
    statement's ``gens``, the hits of every other generation: the index's and those among the
    rows logged since ``covered``); the index advanced to the head read. (rows, None) where
    the head is not one the index may use (ledger.kgram_index): the caller probes."""
    core, logged, gens, head = [], [], set(), None
    for row in rows:
        part = row[0]
        if part == 5:
            logged.append(row[1:])
        elif part == 6:
            gens.add(row[1])
        elif part == 7:
            head = row
        else:
            core.append(row)
    if head is None:  # no head row: a store without a log (never with a k-gram key)
        return rows, None
    _, border, mac, size, _, highest = head
    size = int(size)
    if size < snapshot.covered:  # the log is behind what was indexed: a restored store
        index.reset()
        return rows, None
    if (int(highest) + 1 if highest is not None else 0) != size:
        return rows, None  # a leaf beyond the head, or the last one gone: not a log to follow
    pairs = dict(found.pairs)
    cached = cached or {}
    if size > snapshot.covered:
        if not index.head_authentic(tlog.authority(session), size, bytes.fromhex(border or ""),
                                    None if mac is None else bytes.fromhex(mac)):
            return rows, None
        # The generations logged since: every row of each came back (part 5). Those with
        # MIN_MATCHES distinct digests of the text in scope (counting the index's hit of one
        # short: a generation split by the snapshot, only ever by rows added by hand) are read
        # as part 1 reads the candidates, the others' hits are the index's kind.
        from ledger.kgram_match import MIN_MATCHES

        in_part1 = set(gens)  # the statement's gens: read in full by part 1 (unless kept)
        parsed = [(generation_id, key_id, joined, scheme, tenant_id, kgram_index.digests_of(joined))
                  for generation_id, key_id, joined, scheme, tenant_id in logged]
        hits_of: list[np.ndarray | None] = []
        shared: dict[str, set[int]] = {}
        for generation_id, _, _, scheme, tenant_id, digests in parsed:
            hits = None
            if int(scheme) == V2 and (scope is None or tenant_id == scope):
                hits = np.intersect1d(query, digests)
                if len(hits):
                    shared.setdefault(generation_id, set()).update(hits.tolist())
            hits_of.append(hits)
        near = set(found.near)
        qualified = {g for g, hits in shared.items() if len(hits) + (g in near) >= MIN_MATCHES}
        for (generation_id, key_id, joined, scheme, tenant_id, _), hits in zip(parsed, hits_of):
            if generation_id in in_part1 or generation_id in cached:
                continue  # read in full by part 1 (a candidate, an exact copy), or kept (not read)
            if generation_id in qualified:
                core.append((1, generation_id, key_id, joined, scheme, tenant_id))
            elif hits is not None and len(hits):
                key = (generation_id, key_id)
                pairs[key] = hits if key not in pairs else np.concatenate([pairs[key], hits])
        gens |= qualified
        index.advance(snapshot, size, [(g, k, t, d) for g, k, _, scheme, t, d in parsed if int(scheme) == V2])
    return core, (gens, pairs)


class KgramCache:
    """What one detection learns of a text's k-grams and of the ledger (it holds query
    results: never keep it past the request; rows are append-only and a generation's are
    written in one transaction, so rows read in one transaction stay right in the next).

    The forms of one text (as sent, normalised; detector.forms) share most of their k-grams:
    each distinct k-gram is hashed once per k-gram key (scheme 2: once in all; scheme 1: once
    per key with such rows), and each distinct digest looked up once per scope (scheme 1:
    per key and scope), for every form and every look-up of the detection
    (:func:`ledger.kgrams.find_matches`, :func:`~ledger.kgrams.shared_positions`). A look-up
    fetches the matching rows themselves, (generation, key, digest), rather than counts per
    generation: the counts and the shared positions of every generation then come from the
    one query, at the cost of returning one row per shared (generation, k-gram) pair, as
    many as a count query reads."""

    def __init__(self, digest_array: DigestArray | None = None) -> None:
        # digest_array: a compiled pass over a whole text (ledger.kgram_digests.DigestArray),
        # passed in by the service; without one each distinct k-gram is hashed in Python.
        self._digest_array = digest_array
        self._memo: dict[bytes, dict[bytes, int]] = {}
        self._at: dict[tuple[bytes, tuple[int, ...]], list[int]] = {}
        self._rows: dict[tuple[str, str | None], dict[int, list[str]]] = {}
        self._rows2: dict[str | None, dict[int, list[tuple[str, str]]]] = {}
        self._scope_of: dict[tuple[str, str], tuple[int, str | None]] = {}
        self._searched: dict[str, int] = {}
        self._searched2: dict[str | None, int] = {}
        self._stored: dict[str, int | None] = {}
        self._store_key: bytes | None = None
        self._store_key_read = False
        self._v1_keys: frozenset[str] | None = None
        self._recorded: dict[str, list[tuple[int, int]]] = {}
        self._labels: dict[str, set[tuple[str, str]]] = {}
        self._facts = None
        self._arrays: dict[tuple[bytes, tuple[int, ...]], np.ndarray] = {}
        self._read: _Read | None = None
        self._read_forms: set = set()
        self._materialised = False
        self.copies: dict[str, int] = {}
        """What :meth:`read_all` found by output hash: generation -> its latest matching entry's id."""
        """What :meth:`read_all` read, as arrays (None: it did not run, or the per-part reads answer)."""

    def _keyed(self, token_ids: Sequence[int], key: bytes) -> list[int]:
        index = (key, tuple(token_ids))
        found = self._at.get(index)
        if found is None:
            found = self._at[index] = self._keyed_array(token_ids, key).tolist()
        return found

    def _keyed_array(self, token_ids: Sequence[int], key: bytes) -> np.ndarray:
        """:meth:`_keyed` as int64 [n - K + 1], hashed in one compiled pass where numba is there."""
        index = (key, tuple(token_ids))
        found = self._arrays.get(index)
        if found is None:
            found = self._digest_array(token_ids, key, K) if self._digest_array is not None else None
            if found is None:  # without a compiled pass: each distinct k-gram hashed once
                found = np.asarray(keyed_position_digests(token_ids, key, memo=self._memo.setdefault(key, {})),
                                   dtype=np.int64)
            self._arrays[index] = found
        return found

    def array2(self, session: Session, token_ids: Sequence[int]) -> np.ndarray | None:
        """:meth:`at2` as an int64 array (None: the store has no k-gram key)."""
        key = self.store_key(session)
        return None if key is None else self._keyed_array(token_ids, key)

    def at(self, token_ids: Sequence[int], secret: int) -> list[int]:
        """:func:`position_digests` of ``token_ids`` [n] under ``secret`` (scheme 1)."""
        return self._keyed(token_ids, kgram_key(secret))

    def store_key(self, session: Session) -> bytes | None:
        if not self._store_key_read:
            self._store_key, self._store_key_read = store_kgram_key(session), True
        return self._store_key

    def at2(self, session: Session, token_ids: Sequence[int]) -> list[int] | None:
        """Scheme 2's position digests of ``token_ids`` [n] (None: the store has no k-gram key,
        so no scheme 2 row either)."""
        key = self.store_key(session)
        return None if key is None else self._keyed(token_ids, key)

    def at_scheme(self, session: Session, scheme: int, token_ids: Sequence[int], secret: int) -> list[int] | None:
        return self.at(token_ids, secret) if scheme == V1 else self.at2(session, token_ids)

    def v1_keys(self, session: Session) -> frozenset[str]:
        """The keys with scheme 1 rows (one query: :data:`_V1_KEYS`)."""
        if self._v1_keys is None:
            self._v1_keys = frozenset(session.connection().execute(_V1_KEYS).scalars())
        return self._v1_keys

    def rows(self, session: Session, key_id: str, tenant_id: str | None, digests: Iterable[int]) -> dict[int, list[str]]:
        """Scheme 1: per digest looked up so far under ``key_id`` in scope ``tenant_id`` (None:
        every tenant), ``digests`` included: the generations that recorded it, one entry per row."""
        known = self._rows.setdefault((key_id, tenant_id), {})
        missing = sorted(d for d in set(digests) if d not in known)
        connection = session.connection()
        sqlite = connection.dialect.name == "sqlite"
        for chunk in chunks(missing):
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
                self._scope_of[key_id, generation_id] = (V1, tenant_id)
        return known

    def rows2(self, session: Session, tenant_id: str | None, digests: Iterable[int]) -> dict[int, list[tuple[str, str]]]:
        """Scheme 2: per digest looked up so far in scope ``tenant_id`` (None: every tenant),
        ``digests`` included: the (generation, key id) of each row that recorded it, every key
        at once."""
        self._materialise()
        known = self._rows2.setdefault(tenant_id, {})
        missing = sorted(d for d in set(digests) if d not in known)
        connection = session.connection()
        sqlite = connection.dialect.name == "sqlite"
        for chunk in chunks(missing):
            if sqlite:
                stmt = _ROWS2_JSON if tenant_id is None else _ROWS2_JSON_OF_TENANT
                values = json.dumps(chunk)
            else:
                stmt = _ROWS2 if tenant_id is None else _ROWS2_OF_TENANT
                values = chunk
            known.update((d, []) for d in chunk)
            for generation_id, key_id, digest in connection.execute(
                    stmt, {"tenant_id": tenant_id, "digests": values}).all():
                known[digest].append((generation_id, key_id))
                self._scope_of[key_id, generation_id] = (V2, tenant_id)
        return known

    def read_all(self, session: Session, tenant_id: str | None, forms: Sequence[Sequence[int]],
                 exact: Sequence[str] = (), output_sha256: str | None = None) -> list[str] | None:
        """Everything a detection reads of the k-gram table, in one statement
        (:func:`_read_all`): the scheme 2 rows of every form's digests in scope ``tenant_id``
        (what :meth:`rows2` reads), the keys with scheme 1 rows (:meth:`v1_keys`), every row
        of the generations that match at least :data:`~ledger.kgram_match.MIN_MATCHES`
        digests (any key) or are named in ``exact`` (:meth:`recorded`, :meth:`stored`), and
        when there are such, the scope's count (:meth:`searched2`): kept, so that those
        methods and :func:`ledger.kgrams.find_matches` read nothing more (scheme 1 keys
        aside). ``output_sha256``: the exact copies of a text of this output hash are named
        too (:attr:`copies`: ledger.read.exact_copies builds them from the facts). Returns
        those generations (for :meth:`use_facts`); None, and nothing read, when the store has
        no k-gram key (no scheme 2 row: the per-part reads answer).

        The text's digests are looked up in the store's in-process index (ledger.kgram_index),
        not probed in the table: the statement reads the rows of the generations it names
        (and of those logged since it was read, which it then adds), so the same generations
        are read and checked as by the probe; the probe answers where there is no index or
        the log's head is not one it may follow."""
        from ledger.kgram_match import MIN_MATCHES
        from ledger.read import driver_rows

        if self.store_key(session) is None:
            return None
        arrays = [self.array2(session, tokens) for tokens in forms]
        query = np.unique(np.concatenate(arrays)) if arrays else np.zeros(0, np.int64)
        connection = session.connection()
        dialect = "sqlite" if connection.dialect.name == "sqlite" else "postgresql"
        exact = list(dict.fromkeys(exact))
        digests = query.tolist()
        # Generations whose rows were checked against the log already (VerifiedRows): not read.
        cached = VERIFIED.sharing(self._store_key, digests, exact)
        if dialect == "sqlite":
            values = {"digests": "[" + ",".join(map(str, digests)) + "]", "exact": json.dumps(exact),
                      "known": json.dumps(list(cached))}
        else:
            values = {"digests": digests, "exact": exact, "known": list(cached)}
        if tenant_id is not None:
            values["tenant_id"] = tenant_id
        values["min_matches"] = MIN_MATCHES
        values["output_sha256"] = output_sha256
        index = kgram_index.index_of(session.info.get(tlog.STORE_INFO), self._store_key)
        indexed = None
        if index is not None:
            # The index names the candidates (ledger.kgram_index); the statement reads their
            # rows, and what was logged since the snapshot, instead of probing every digest.
            snapshot = index.snapshot()
            found = kgram_index.find(snapshot, query, tenant_id, MIN_MATCHES)
            lists = {"covered": snapshot.covered, "cand": found.candidates}
            if dialect == "sqlite":
                lists["cand"] = json.dumps(found.candidates)
            rows = driver_rows(connection, _READ_ALL[dialect, tenant_id is not None, True], {**values, **lists})
            rows, indexed = _with_index(session, index, snapshot, found, rows, query, tenant_id, cached)
        if indexed is None:  # no index, or the log's head not as the index needs it: the probe
            rows = driver_rows(connection, _READ_ALL[dialect, tenant_id is not None, False], values)
        read = _Read.of(rows, tenant_id, query, exact, cached, indexed)
        if read.searched is not None:
            self._searched2[tenant_id] = read.searched
        self._v1_keys = read.v1_keys
        self._labels.update(read.labels)
        self._read = read
        self._read_forms = {(self._store_key, tuple(tokens)) for tokens in forms}
        self.copies = read.copies
        return list(read.generations)

    def _read_of(self, tenant_id: str | None, token_ids: Sequence[int]) -> "_Read | None":
        """What :meth:`read_all` read, where it read scope ``tenant_id`` and hashed ``token_ids``."""
        read = self._read
        if read is None or read.scope != tenant_id or (self._store_key, tuple(token_ids)) not in self._read_forms:
            return None
        return read

    def _materialise(self) -> None:
        """What :meth:`read_all` read, as the per-part reads keep it (:meth:`rows2`, :meth:`shared`):
        for the reference paths and scheme 1 keys, which read those."""
        read = self._read
        if read is None or self._materialised:
            return
        self._materialised = True
        known = self._rows2.setdefault(read.scope, {})
        known.update((d, []) for d in read.query.tolist())
        for (generation_id, key_id), digests in read.pairs.items():
            for d in digests:
                known[d].append((generation_id, key_id))
            self._scope_of[key_id, generation_id] = (V2, read.scope)

    def counts2(self, session: Session, token_ids: Sequence[int], tenant_id: str | None,
                wanted: set[str]) -> tuple[int, int, dict[tuple[str, str], int]] | None:
        """Scheme 2's match counts of one form from what :meth:`read_all` read, in arrays: (its
        distinct digests, the generations sharing any of them under any key, and per (key id,
        generation) of a ``wanted`` key the distinct digests shared); None where it did not
        read this form in this scope (:meth:`rows2` answers)."""
        read = self._read_of(tenant_id, token_ids)
        if read is None:
            return None
        text = set(self._at_list(token_ids))
        counts: dict[tuple[str, str], int] = {}
        seen: set[str] = set()
        for (generation_id, key_id), digests in read.pairs.items():
            if text.isdisjoint(digests):
                continue
            seen.add(generation_id)
            if key_id in wanted:
                counts[key_id, generation_id] = len(text & digests) if len(text) < len(digests) else len(digests & text)
        return len(text), len(seen), counts

    def _at_list(self, token_ids: Sequence[int]) -> list[int]:
        """The read form's scheme 2 digests as a list (kept: the basis reads them again)."""
        return self._keyed(token_ids, self._store_key)

    def shared_mask(self, key_id: str, generation_id: str, token_ids: Sequence[int], skip: int) -> np.ndarray | None:
        """bool [n]: the positions of ``token_ids`` :meth:`shared` and
        :func:`positions` give (inside a k-gram ``generation_id`` recorded under ``key_id``,
        the first ``skip`` of each left out), from what :meth:`read_all` read; None where it
        does not hold them (a scheme 1 key, another form: :meth:`shared` answers). The pair
        was found in the scope read (its rows are among the hits), so that scope is its."""
        read = self._read
        read = None if read is None else self._read_of(read.scope, token_ids)
        if read is None or key_id in read.v1_keys:
            return None
        shared = read.pairs.get((generation_id, key_id))
        if not shared:
            return None
        at = self._at_list(token_ids)
        starts = np.flatnonzero(np.fromiter(map(shared.__contains__, at), bool, len(at)))
        covered = np.zeros(len(token_ids), bool)
        first = min(skip, K)
        if len(starts) and first < K:
            covered[(starts[:, None] + np.arange(first, K)).ravel()] = True
        return covered

    def use_facts(self, facts) -> None:
        """The generations' finished entries and leaves (ledger.read.detection_facts), read
        with their facts: :meth:`stored` checks their rows against them, no query."""
        self._facts = facts

    def searched(self, session: Session, key_id: str) -> int:
        if key_id not in self._searched:
            self._searched[key_id] = generations_searched(session, key_id)
        return self._searched[key_id]

    def searched_many(self, session: Session, key_ids: Sequence[str]) -> dict[str, int]:
        """:meth:`searched` of every key in ``key_ids``, in one query per :data:`CHUNK` keys."""
        missing = [k for k in dict.fromkeys(key_ids) if k not in self._searched]
        for chunk in chunks(missing):
            self._searched.update((k, 0) for k in chunk)
            self._searched.update((k, int(n)) for k, n in session.connection().execute(
                _SEARCHED_BY_KEY, {"key_ids": chunk}))
        return {k: self._searched[k] for k in key_ids}

    def searched2(self, session: Session, tenant_id: str | None) -> int:
        if tenant_id not in self._searched2:
            self._searched2[tenant_id] = generations_in_scope(session, tenant_id)
        return self._searched2[tenant_id]

    def prefetch(self, session: Session, keys: Sequence[tuple[str, int]], tenant_id: str | None,
                 forms: Sequence[Sequence[int]]) -> list[tuple[str, int]]:
        """Look up the digests of every form of one text at once: under scheme 2 in one query
        (per :data:`CHUNK` digests) for every key; under scheme 1 in one query per key with
        scheme 1 rows and a finished generation of at least :data:`K` tokens (one count query
        for those keys; the gateway writes a generation's k-grams with its finished entry,
        and rows written without one never make a match, :meth:`stored`), each hashed under
        its own key. Returns the keys that can match at all; keys with neither are neither
        hashed nor queried: :func:`~ledger.kgrams.find_matches` on them finds nothing, with or without this."""
        wanted = {key_id for key_id, _ in keys}
        live: set[str] = set()
        read = self._read
        if read is not None and all(self._read_of(tenant_id, tokens) is not None for tokens in forms):
            # read_all read every form's rows: the keys among them, no query
            present = {key_id for _, key_id in read.pairs}
            live.update(key_id for key_id in wanted if key_id in present)
        elif self.store_key(session) is not None:
            rows = self.rows2(session, tenant_id, {d for tokens in forms for d in self.at2(session, tokens)})
            live.update(key_id for found in rows.values() for _, key_id in found if key_id in wanted)
        old = self.v1_keys(session)
        v1 = [(key_id, secret) for key_id, secret in keys if key_id in old]
        searched = self.searched_many(session, [key_id for key_id, _ in v1])
        for key_id, secret in v1:
            if searched[key_id] > 0:
                live.add(key_id)
                self.rows(session, key_id, tenant_id, {d for tokens in forms for d in self.at(tokens, secret)})
        return [(key_id, secret) for key_id, secret in keys if key_id in live]

    def stored(self, session: Session, generation_ids: Iterable[str]) -> dict[str, int]:
        """Digests recorded per generation (every key: a generation has one), for the
        generations whose recorded digests, under their scheme, are exactly the set their
        logged ``finished`` entry committed to (ledger.log.tlog.logged_kgrams); the others are
        absent: rows inserted, deleted, moved or relabelled by anyone without the log key
        never make a match."""
        missing = [g for g in dict.fromkeys(generation_ids) if g not in self._stored]
        if missing:
            read, facts = self._read, self._facts
            if (read is not None and facts is not None
                    and all(g in read.recorded and g in facts.checked for g in missing)):
                # Every row of these generations and their finished entries read in the look-up:
                # checked in arrays (rows_match_leaf), their leaves as tlog.kgrams_matching reads them.
                rows = [facts.finished[g] for g in missing if g in facts.finished]
                logged = tlog.logged_entries(session, rows, facts.leaves)
                authentic = {r.generation_id for r in rows if r.id in logged and self._rows_authentic(logged[r.id], r)}
                # An authentic generation's rows are distinct (rows_match_leaf): one per digest.
                self._stored.update((g, len(read.recorded[g][1]) if g in authentic else None) for g in missing)
                return {g: c for g, c in self._stored.items() if c is not None}
            unread = [g for g in missing if self._recorded_rows(g) is None]  # read already: the id recovery's
            if unread:
                self._read_recorded(session, unread)
            found = {g: self._recorded[g] for g in missing}
            labels = {g: self._labels[g] for g in missing}
            if facts is not None and all(g in facts.checked for g in missing):
                rows = [facts.finished[g] for g in missing if g in facts.finished]
                authentic = tlog.kgrams_matching(rows, tlog.logged_entries(session, rows, facts.leaves), found,
                                                 labels)
            else:
                authentic = tlog.logged_kgrams(session, found, labels)
            self._stored.update((g, len({d for _, d in found[g]}) if g in authentic else None) for g in missing)
        return {g: c for g, c in self._stored.items() if c is not None}

    def _rows_authentic(self, leaf, row) -> bool:
        """Are the rows :meth:`read_all` holds of ``row``'s generation what its logged
        finished entry ``row`` (its ``leaf`` checked already) committed to? Kept generations
        (:class:`VerifiedRows`) were checked when read: the leaf must still commit to them and
        the entry carry their key and tenant. Others are checked here (:func:`rows_match_leaf`)
        and kept when they pass."""
        read, generation_id = self._read, row.generation_id
        kept = read.cached.get(generation_id)
        if kept is not None:
            return leaf.kgrams_sha256 == kept.commitment and (
                kept.label is None or kept.label == (row.key_id, row.tenant_id))
        schemes, digests = read.recorded[generation_id]
        labels = self._labels.get(generation_id, set())
        if not rows_match_leaf(leaf, row, schemes, digests, labels):
            return False
        if self._store_key is not None and leaf.kgrams_sha256 is not None:
            schemes.setflags(write=False)  # shared with later requests: read only
            digests.setflags(write=False)
            VERIFIED.keep(self._store_key, generation_id, _Verified(
                leaf.kgrams_sha256, schemes, digests, np.sort(digests), next(iter(labels), None)))
        return True

    def _recorded_rows(self, generation_id: str) -> list[tuple[int, int]] | None:
        """(scheme, digest) of each row of a generation, where read (None: not yet)."""
        found = self._recorded.get(generation_id)
        if found is None and self._read is not None and generation_id in self._read.recorded:
            schemes, digests = self._read.recorded[generation_id]
            found = self._recorded[generation_id] = list(zip(schemes.tolist(), digests.tolist()))
        return found

    def _read_recorded(self, session: Session, generation_ids: list[str]
                       ) -> tuple[dict[str, list[tuple[int, int]]], dict[str, set[tuple[str, str]]]]:
        """Every k-gram row of these generations: (scheme, digest) per generation, and the
        (key id, tenant id) labels of its rows; kept for :meth:`recorded`."""
        found: dict[str, list[tuple[int, int]]] = {g: [] for g in generation_ids}
        labels: dict[str, set[tuple[str, str]]] = {g: set() for g in generation_ids}
        for chunk in chunks(generation_ids):
            for generation_id, scheme, digest, key_id, tenant_id in session.connection().execute(
                    _STORED, {"generation_ids": chunk}):
                found[generation_id].append((int(scheme), int(digest)))
                labels[generation_id].add((key_id, tenant_id))
        self._recorded.update(found)
        self._labels.update(labels)
        return found, labels

    def recorded(self, session: Session, generation_id: str) -> tuple[int | None, set[int]]:
        """(scheme, digests) a generation recorded (None, empty: none), one query shared with
        :meth:`stored`. Not checked against the log: what reads it (the recovery of a
        generation's ids, service.generation_ids) proves its result by the ids' SHA-256."""
        rows = self._recorded_rows(generation_id)
        if rows is None:
            self._read_recorded(session, [generation_id])
            rows = self._recorded[generation_id]
        return (rows[0][0] if rows else None), {d for _, d in rows}

    def shared(self, session: Session, key_id: str, generation_id: str, token_ids: Sequence[int],
               secret: int) -> tuple[list[int], set[int]] | None:
        """The text's position digests under the scheme ``generation_id`` was found under, and
        those of them it recorded under ``key_id``, when the look-ups so far hold them all
        (None: they do not). A generation's k-grams are written once, under its tenant and one
        scheme (:func:`ledger.kgrams.store`), so the rows of the scope it was found in are all of its rows
        among the digests looked up there."""
        self._materialise()
        found = self._scope_of.get((key_id, generation_id))
        if found is None:
            return None
        scheme, scope = found
        at = self.at_scheme(session, scheme, token_ids, secret)
        if at is None:
            return None
        if scheme == V1:
            known = self._rows[key_id, scope]
            if any(d not in known for d in at):
                return None
            return at, {d for d in set(at) if generation_id in known[d]}
        known2 = self._rows2[scope]
        if any(d not in known2 for d in at):
            return None
        return at, {d for d in set(at) if (generation_id, key_id) in known2[d]}
