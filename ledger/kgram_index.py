"""An in-process index of the ledger's scheme 2 k-gram digests (issue 30 item 5): digest ->
the (generation, key, tenant) of each row, so that a detection finds its candidate
generations without probing the table once per digest of the text (~300 index probes, the
largest part of the look-up's statement).

What it is: a candidate finder, never evidence. :meth:`ledger.kgram_cache.KgramCache.read_all`
asks it which generations share digests with the text, reads every row of those that share
at least ``MIN_MATCHES`` (as it did of the generations its probe found) and checks them
against the transparency log exactly as before; the entries, leaves, key states, revocations
and checkpoint are read fresh. A row deleted, changed or relabelled after it was indexed can
only make the index suggest a generation whose fresh rows then decide (none: no match; not
what the log committed to: not cited, as before); a row an operator inserts is never indexed
(below), and inserted rows only ever keep a generation from being cited (its fresh rows no
longer match its commitment), which the fresh read of its rows still sees.

Kept current by the log, not by row ids: PostgreSQL hands ``ledger_kgrams.id`` out of a
sequence before the rows commit (two tenants' generations commit in either order), so "rows
above the highest id seen" can skip a row for good. The log's leaves are sequenced under the
head's lock, held to the commit, with the k-gram rows in the same transaction
(ledger.entries, ledger.log.tlog): leaves [0, size) of a committed head are exactly the
entries committed before it, so the index records ``covered`` (the log size it has read to)
and each request's one statement reads the rows of the finished entries logged at
[covered, size) (none, on most requests), the head's size and MAC and the highest leaf. The
head must authenticate under the log key (an operator cannot move ``covered`` past entries
not yet written) and its size be the highest leaf + 1 (no row beyond it); a head behind
``covered`` (a store restored from a backup) drops the index. Otherwise that request is
answered by the probe as before (:func:`usable`).

Layout: scheme 2 rows only; ``digests`` int64 ascending and ``groups`` int32 (an index into
the (generation, key, tenant) labels) per row, 12 bytes a k-gram, plus the labels (a tuple
per generation, ~0.5-1 byte a k-gram at ~200 k-grams a generation); new rows go to a small
sorted run per catch-up, runs merged as they accumulate (:data:`RUNS`). A snapshot is
immutable (a request looks up the one it read ``covered`` from, whatever other threads
merge meanwhile). At most :data:`MAX_KGRAMS` rows: past that the index is dropped and the probe
answers (a store that large wants the index in the database, not in each worker).
"""

from __future__ import annotations

import struct
import threading
import weakref
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from ledger.kgram_digests import V2

MAX_KGRAMS = 32_000_000
"""Rows one index holds at most (~400 MB); beyond, the probe answers (module docstring)."""
ENABLED = True
"""False: every look-up probes the table as before (the reference the tests and benches compare to)."""

_EMPTY_D = np.zeros(0, np.int64)
_EMPTY_G = np.zeros(0, np.int32)
_EMPTY_D.setflags(write=False)
_EMPTY_G.setflags(write=False)


@dataclass(frozen=True)
class Snapshot:
    """The index as of log size ``covered``: immutable, shared by the requests that read it."""

    covered: int
    runs: tuple = ()
    """Sorted runs (digests int64 ascending, groups int32), largest first: the main arrays and
    the small runs added since (merged when there are :data:`RUNS` of them)."""
    labels: list = field(default_factory=list)
    """group -> (generation id, key id, tenant id): shared with later snapshots, only appended to."""

    @property
    def size(self) -> int:
        return sum(len(d) for d, _ in self.runs)

    @property
    def nbytes(self) -> int:
        return sum(d.nbytes + g.nbytes for d, g in self.runs)

    def hits(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(groups, digests) of every indexed row whose digest is in ``query`` (int64
        ascending, distinct), one entry per row."""
        groups_out, digests_out = [], []
        for digests, groups in self.runs:
            if not len(digests) or not len(query):
                continue
            lo = np.searchsorted(digests, query, "left")
            n = np.searchsorted(digests, query, "right") - lo
            found = n > 0
            if not found.any():
                continue
            lo, n, q = lo[found], n[found], query[found]
            if int(n.max()) == 1:
                at, values = lo, q
            else:  # a digest recorded by several generations (shared phrases): every row
                starts = np.repeat(np.cumsum(n) - n, n)
                at = np.repeat(lo, n) + (np.arange(int(n.sum())) - starts)
                values = np.repeat(q, n)
            groups_out.append(groups[at])
            digests_out.append(values)
        if not groups_out:
            return _EMPTY_G, _EMPTY_D
        if len(groups_out) == 1:
            return groups_out[0], digests_out[0]
        return np.concatenate(groups_out), np.concatenate(digests_out)


RUNS = 8
"""Runs a snapshot holds at most: the small ones are merged into one past this, and that one
into the main run once it exceeds an eighth of it (each row sorted O(log) times in all)."""


@dataclass
class Found:
    """What the index says of one text in one scope."""

    pairs: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)
    """(generation id, key id) -> the text's digests among its indexed rows in scope (int64, a
    digest once per row)."""
    candidates: list[str] = field(default_factory=list)
    """Generations with at least ``min_matches`` distinct such digests (their rows are read fresh)."""
    near: list[str] = field(default_factory=list)
    """Generations with ``min_matches - 1``: a row logged since ``covered`` may complete them."""


def find(snapshot: Snapshot, query: np.ndarray, scope: str | None, min_matches: int) -> Found:
    """The indexed rows in scope ``scope`` (None: every tenant) sharing a digest with ``query``."""
    out = Found()
    groups, values = snapshot.hits(query)
    if not len(groups):
        return out
    labels = snapshot.labels
    per_generation: dict[str, np.ndarray] = {}
    if int(groups.min()) == int(groups.max()):  # most texts: one generation's rows (its key's)
        unique, parts = [int(groups[0])], [values]
    else:
        order = np.argsort(groups, kind="stable")
        groups, values = groups[order], values[order]
        unique, starts = np.unique(groups, return_index=True)
        unique, parts = unique.tolist(), np.split(values, starts[1:])
    for group, digests in zip(unique, parts):
        generation_id, key_id, tenant_id = labels[group]
        if scope is not None and tenant_id != scope:
            continue
        key = (generation_id, key_id)
        out.pairs[key] = digests if key not in out.pairs else np.concatenate([out.pairs[key], digests])
        seen = per_generation.get(generation_id)
        per_generation[generation_id] = digests if seen is None else np.concatenate([seen, digests])
    for generation_id in sorted(per_generation):
        digests = per_generation[generation_id]
        # Distinct digests (a row an operator copied counts once, as in the probe's count(DISTINCT)).
        n = len(digests) if len(digests) < 2 or bool(np.all(digests[1:] > digests[:-1])) else len(np.unique(digests))
        if n >= min_matches:
            out.candidates.append(generation_id)
        elif n == min_matches - 1:
            out.near.append(generation_id)
    return out


def _sorted(digests: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(digests, kind="stable")
    return digests[order], groups[order]


def _merged(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    if not len(a[0]):
        return b
    if not len(b[0]):
        return a
    # Two ascending runs: the stable sort (timsort) merges them in linear time.
    return _sorted(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))


class KgramIndex:
    """One store's index (per k-gram key). :meth:`snapshot` for a request; :meth:`advance`
    with what its statement read past the snapshot's ``covered``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshot = Snapshot(covered=0)
        self._labels: list[tuple[str, str, str]] = []
        self._group_of: dict[tuple[str, str, str], int] = {}
        self._head_ok: tuple[int, bytes, bytes | None] | None = None
        self.disabled = False
        """Over :data:`MAX_KGRAMS`: the probe answers from now on."""

    def snapshot(self) -> Snapshot:
        return self._snapshot

    def head_authentic(self, auth, size: int, border: bytes, mac: bytes | None) -> bool:
        """Does the head authenticate under the log key (tlog.read_head's check)? Memoised for
        the last head that did (most requests read the same head)."""
        seen = (size, border, mac)
        if self._head_ok == seen:
            return True
        if auth is None or len(border) % 32 or len(border) // 32 != bin(size).count("1"):
            return False
        if (size or mac is not None) and not auth.check(mac, b"head", struct.pack(">Q", size), border):
            return False
        self._head_ok = seen
        return True

    def advance(self, base: Snapshot, size: int, rows: Iterable[tuple[str, str, str, np.ndarray]]) -> None:
        """Add the scheme 2 rows (generation id, key id, tenant id, digests) of the entries
        logged at [``base.covered``, ``size``), read in one statement with that head; only
        where no other thread moved the index past ``base`` meanwhile (it read them, or a later
        request will)."""
        with self._lock:
            if self._snapshot is not base or self.disabled:
                return
            new_d, new_g = [], []
            for generation_id, key_id, tenant_id, digests in rows:
                label = (generation_id, key_id, tenant_id)
                group = self._group_of.get(label)
                if group is None:
                    group = self._group_of[label] = len(self._labels)
                    self._labels.append(label)
                new_d.append(digests)
                new_g.append(np.full(len(digests), group, np.int32))
            if base.size + sum(len(d) for d in new_d) > MAX_KGRAMS:
                self.disabled = True
                self._snapshot = Snapshot(covered=0)
                return
            runs = list(base.runs)
            if new_d:
                runs.append(_sorted(np.concatenate(new_d), np.concatenate(new_g)))
            if len(runs) > RUNS:  # the small runs into one
                small = runs[1:]
                runs = [runs[0], _sorted(np.concatenate([d for d, _ in small]), np.concatenate([g for _, g in small]))]
            if len(runs) == 2 and len(runs[1][0]) > len(runs[0][0]) // 8:
                runs = [_merged(runs[0], runs[1])]
            for d, g in runs:
                d.setflags(write=False)
                g.setflags(write=False)
            self._snapshot = Snapshot(size, tuple(runs), self._labels)

    def reset(self) -> None:
        """Forget everything (the log is behind what was indexed: a restored store)."""
        with self._lock:
            self._snapshot = Snapshot(covered=0)
            self._labels = []  # a new list: snapshots in use keep theirs
            self._group_of = {}
            self._head_ok = None


_INDEXES: "weakref.WeakKeyDictionary[object, dict[bytes, KgramIndex]]" = weakref.WeakKeyDictionary()
_INDEXES_LOCK = threading.Lock()


def index_of(store, store_key: bytes) -> KgramIndex | None:
    """The index of ``store`` (keys.db.Store, from the session's info) under its k-gram key;
    None where there is none to keep (no store, disabled)."""
    if store is None or not ENABLED:
        return None
    with _INDEXES_LOCK:
        try:
            by_key = _INDEXES.setdefault(store, {})
        except TypeError:  # pragma: no cover - not weak-referenceable
            return None
        found = by_key.get(store_key)
        if found is None:
            found = by_key[store_key] = KgramIndex()
    return None if found.disabled else found


def forget_indexes() -> None:
    """Drop every index (tests: built again from the log on the next look-up)."""
    with _INDEXES_LOCK:
        _INDEXES.clear()


def digests_of(joined) -> np.ndarray:
    """int64 digests from their comma-joined text (as the statement aggregates them)."""
    if isinstance(joined, str):
        found = np.fromstring(joined, dtype=np.int64, sep=",") if joined else _EMPTY_D
        if len(found) == (joined.count(",") + 1 if joined else 0):
            return found
        joined = joined.split(",")  # pragma: no cover - not the database's integers
    return np.asarray([int(v) for v in joined], dtype=np.int64)


def scheme2_rows(rows: Sequence[tuple]) -> list[tuple[str, str, str, np.ndarray]]:
    """The statement's catch-up rows (generation, key, digests joined, scheme, tenant) kept
    for the index: scheme 2 only (scheme 1 keys keep their per-key reads)."""
    return [(g, k, t, digests_of(joined)) for g, k, joined, scheme, t in rows if int(scheme) == V2]
