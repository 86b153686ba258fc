"""The transparency log in the store: one global RFC 9162 Merkle log over every tenant's
ledger entries and every signing-key event (ledger.log.leaves), signed checkpoints, proofs.

Sequencing. A leaf is appended in the transaction that writes what it logs, as that
transaction's last step: lock the head row (PostgreSQL ``FOR UPDATE``; SQLite's write
transactions are exclusive already), check its MAC, add the leaf to the tree's right border
(ledger.log.merkle.append), insert the leaf, the complete subtrees it finished (amortised one row)
and the new head, both MACed under the log key. So the log never holds an entry that did not
commit, and an entry that committed is in the log: no batching sequencer, no window in which
a receipt cannot carry its proof. The newest leaf's inclusion proof is the old border,
reversed: a receipt gets its proof for free.

Authentication. Whoever can write the database (the gateway's role, the tables' owner)
lacks the KEK and so the log key: a leaf or head they insert or change fails its MAC, and
the gateway refuses to build on a head that does not authenticate (it would otherwise sign a
checkpoint over their leaf). Detection cites only entries whose leaf authenticates and
matches the entry (:func:`logged_entries`, :func:`logged_kgrams`).

Checkpoints. ``signed_checkpoint`` signs any size the committed tree has (a receipt's
checkpoint is signed right after its transaction commits, never before: a rolled-back
append must not leave a signature behind). :func:`publish` stores one for witnesses; the
gateway publishes at least every :data:`PUBLISH_EVERY_ENTRIES` entries and
:data:`PUBLISH_EVERY_SECONDS` seconds (service settings).
"""

from __future__ import annotations

import base64
import struct
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Sequence

from sqlalchemy import bindparam, select, text, tuple_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from keys import clock
from keys.errors import KeyStoreError
from keys.kek import Keyring
from keys.models import LedgerEntry, LedgerKgram, LogCheckpoint, LogLeaf, LogNode, SigningKey
from ledger.chain import HASHED_FIELDS, canonical_json, entry_fields, entry_hash
from ledger.log import merkle
from ledger.log import rows as log_rows
from ledger.log.key import LogAuthority, LogKeyError, create_log_key, forget_log_key, load_log_key, store_log_key
from ledger.log.leaves import EMPTY_KGRAMS, entry_leaf, key_event, key_event_leaf, kgram_rows_commitment
from ledger.log.note import Checkpoint
from ledger.sigalg import alg_of_public

PUBLISH_EVERY_ENTRIES = 256
PUBLISH_EVERY_SECONDS = 30.0
STORE_INFO = "hallmark.store"


class LogTampered(KeyStoreError):
    """The log's stored state does not authenticate: someone without the log key wrote it."""


@dataclass(frozen=True)
class Sequenced:
    """Where an append put its leaf, and the tree right after it."""

    leaf_index: int
    size: int
    root: bytes
    proof: tuple[bytes, ...]
    """Inclusion proof of the leaf in the tree of ``size``."""


def authority(session: Session) -> LogAuthority | None:
    """The log key of the store this session belongs to (opened once per store), or None
    when the store has no log key yet or the session is not a store's."""
    store = session.info.get(STORE_INFO)
    if store is None:
        return None
    return store_log_key(store, session)


def writer_authority(session: Session) -> LogAuthority | None:
    """The log key an append logs under: the store's, created (with the store's existing
    entries adopted) on the first write to a store that has none, where this role may
    create it. None only for a store whose sequencing is switched off (``store.sequencing``,
    a benchmark's control arm). :class:`LogKeyError` when there is no key and none can be
    created here: the write fails rather than leave an entry outside the log."""
    store = session.info.get(STORE_INFO)
    if store is None:
        raise LogKeyError("ledger writes need a session of an opened store (keys.db.Store)")
    if not getattr(store, "sequencing", True):
        return None
    found = store_log_key(store, session)
    if found is None:
        found, _ = ensure_log(session, store.keyring, actor="ledger:first-write")
        forget_log_key(store)
    return found


def required_authority(session: Session) -> LogAuthority:
    found = authority(session)
    if found is None:
        raise LogKeyError("the store has no transparency-log key yet: run `hallmark ledger init` (as the "
                          "database owner), or start the gateway once on a store it may write")
    return found


# --- the head -------------------------------------------------------------------------------


def _head_mac(auth: LogAuthority, size: int, border: bytes) -> bytes:
    return auth.mac(b"head", struct.pack(">Q", size), border)


def _leaf_mac(auth: LogAuthority, leaf: dict[str, Any]) -> bytes:
    return auth.mac(*_leaf_mac_parts(leaf))


def _border(raw: bytes) -> list[bytes]:
    return [raw[i:i + 32] for i in range(0, len(raw), 32)]


def read_head(session: Session, auth: LogAuthority | None, *, lock: bool = False) -> tuple[int, list[bytes]]:
    """The log's size and border; with ``auth``, :class:`LogTampered` unless its MAC checks."""
    size, raw, mac = log_rows.read_head(session, lock=lock)
    border = _border(raw)
    if len(border) != bin(size).count("1"):
        raise LogTampered(f"the log's head is malformed (size {size}, {len(border)} border hashes)")
    if auth is not None and (size or mac is not None) and not auth.check(mac, b"head", struct.pack(">Q", size), raw):
        raise LogTampered("the log's head does not authenticate under the log key: it was written by someone "
                          "without the KEK (run `hallmark ledger verify`)")
    return size, border


# --- appending ------------------------------------------------------------------------------


def append(session: Session, auth: LogAuthority, *, leaf_data: bytes, kind: str, entry_id: int | None = None,
           tenant_id: str | None = None, kgrams_sha256: str | None = None, kid: str | None = None,
           data: bytes | None = None, now: datetime | None = None) -> Sequenced:
    """Append one leaf in the session's transaction, as its last statements, so that the
    head's lock is held briefly (ledger.log.rows: two round trips on PostgreSQL)."""
    now = clock.resolve(now)
    session.flush()  # what the leaf logs is written first (the ORM's pending rows)
    size, border = read_head(session, auth, lock=True)
    leaf = {"idx": size, "leaf_hash": merkle.leaf_hash(leaf_data), "kind": kind, "entry_id": entry_id,
            "tenant_id": tenant_id, "kgrams_sha256": kgrams_sha256, "kid": kid, "data": data, "created_at": now}
    leaf["mac"] = _leaf_mac(auth, leaf)
    proof = tuple(reversed(border))
    border, completed = merkle.append(border, size, leaf["leaf_hash"])
    raw = b"".join(border)
    log_rows.write_append(session, leaf, completed, size + 1, raw, _head_mac(auth, size + 1, raw))
    return Sequenced(leaf_index=size, size=size + 1, root=merkle.root(border), proof=proof)


def append_entry(session: Session, auth: LogAuthority, row: LedgerEntry, kgrams_sha256: str = EMPTY_KGRAMS,
                 now: datetime | None = None) -> Sequenced:
    return append(session, auth, leaf_data=entry_leaf(row.entry_hash, kgrams_sha256), kind="entry",
                  entry_id=row.id, tenant_id=row.tenant_id, kgrams_sha256=kgrams_sha256, now=now)


def append_entries(session: Session, auth: LogAuthority, items: Sequence[tuple[LedgerEntry, str, datetime | None]]
                   ) -> list[Sequenced]:
    """:func:`append_entry` for each (row, k-gram commitment, time) of ``items``, in order:
    the same leaves, subtrees and final head as that many appends one after another, with
    the head locked and read once and the leaves, subtrees and head written together (one
    statement each on SQLite, one in all on PostgreSQL): a group of entries' log append
    costs about one entry's (ledger.grouped)."""
    if not items:
        return []
    session.flush()  # what the leaves log is written first (the ORM's pending rows)
    size, border = read_head(session, auth, lock=True)
    leaves, completed, sequenced = [], [], []
    for row, kgrams_sha256, now in items:
        leaf = {"idx": size, "leaf_hash": merkle.leaf_hash(entry_leaf(row.entry_hash, kgrams_sha256)), "kind": "entry",
                "entry_id": row.id, "tenant_id": row.tenant_id, "kgrams_sha256": kgrams_sha256, "kid": None,
                "data": None, "created_at": clock.resolve(now)}
        leaf["mac"] = _leaf_mac(auth, leaf)
        proof = tuple(reversed(border))
        border, done = merkle.append(border, size, leaf["leaf_hash"])
        size += 1
        leaves.append(leaf)
        completed += done
        sequenced.append(Sequenced(leaf_index=size - 1, size=size, root=merkle.root(border), proof=proof))
    raw = b"".join(border)
    log_rows.write_appends(session, leaves, completed, size, raw, _head_mac(auth, size, raw))
    return sequenced


def append_key_event(session: Session, auth: LogAuthority, event: dict[str, Any],
                     now: datetime | None = None) -> Sequenced:
    return append(session, auth, leaf_data=key_event_leaf(event), kind="signing_key", kid=event["kid"],
                  data=canonical_json(event), now=now)


# --- creating the log ------------------------------------------------------------------------


def _may_create(session: Session) -> bool:
    if session.get_bind().dialect.name != "postgresql":
        return True
    return bool(session.execute(text("SELECT has_table_privilege('log_keys', 'INSERT')")).scalar())


def ensure_log(session: Session, keyring: Keyring, *, actor: str, origin: str | None = None,
               now: datetime | None = None) -> tuple[LogAuthority, int]:
    """The store's log key, created if there is none, with every ledger entry and signing
    key written before the log existed adopted as its first leaves (in the order they were
    written). Returns the key and how many leaves were adopted."""
    now = clock.resolve(now)
    found = load_log_key(session, keyring)
    if found is not None:
        return found, 0
    size, _ = read_head(session, None, lock=True)
    found = load_log_key(session, keyring)  # another replica may have created it while we waited
    if found is not None:
        return found, 0
    if size:
        raise LogKeyError(f"the log has {size} leaves but the store has no log key: its log_keys row was "
                          "deleted; restore it from a backup (a new key would start a log no witness trusts)")
    if not _may_create(session):
        raise LogKeyError("the store has no transparency-log key and this database role may not create one: run "
                          "`hallmark ledger init` as the database owner")
    auth = create_log_key(session, keyring, actor=actor, origin=origin, now=now)
    adopted = 0
    kgrams = _kgram_sets(session)
    for row in session.scalars(select(LedgerEntry).order_by(LedgerEntry.id)):
        commitment = (kgram_rows_commitment(kgrams.get(row.generation_id, ())) if row.kind == "finished"
                      else EMPTY_KGRAMS)
        append_entry(session, auth, row, commitment, now=now)
        adopted += 1
    for key in session.scalars(select(SigningKey).order_by(SigningKey.created_at, SigningKey.id)):
        append_key_event(session, auth, key_event_of(key, "adopted", now), now=now)
        adopted += 1
    return auth, adopted


def key_event_of(key: SigningKey, event: str, at: datetime) -> dict[str, Any]:
    """The leaf event of a signing key as its row stands (ledger.log.leaves.key_event)."""
    return key_event(kid=key.id, public_key=base64.urlsafe_b64encode(key.public_key).rstrip(b"=").decode("ascii"),
                     event=event, at=at, not_before=key.created_at, not_after=key.retired_at,
                     revoked_at=key.revoked_at, alg=alg_of_public(key.public_key))


def _kgram_sets(session: Session, generation_ids: Iterable[str] | None = None) -> dict[str, list[tuple[int, int]]]:
    """Per generation, its k-gram rows as (scheme, digest) (ledger.log.leaves.kgram_rows_commitment)."""
    query = select(LedgerKgram.generation_id, LedgerKgram.scheme, LedgerKgram.digest)
    if generation_ids is not None:
        query = query.where(LedgerKgram.generation_id.in_(list(generation_ids)))
    out: dict[str, list[tuple[int, int]]] = {}
    for generation_id, scheme, digest in session.execute(query):
        out.setdefault(generation_id, []).append((int(scheme), int(digest)))
    return out


# --- reading the tree ------------------------------------------------------------------------


def _subtrees(session: Session, keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
    wanted = set(keys)
    leaves = sorted(i for level, i in wanted if level == 0)
    nodes = sorted(k for k in wanted if k[0] > 0)
    found: dict[tuple[int, int], bytes] = {}
    for start in range(0, len(leaves), 500):
        found.update(((0, i), h) for i, h in session.execute(
            select(LogLeaf.idx, LogLeaf.leaf_hash).where(LogLeaf.idx.in_(leaves[start:start + 500]))))
    for start in range(0, len(nodes), 500):
        found.update(((lv, ix), h) for lv, ix, h in session.execute(
            select(LogNode.level, LogNode.idx, LogNode.hash).where(
                tuple_(LogNode.level, LogNode.idx).in_(nodes[start:start + 500]))))
    missing = wanted - set(found)
    if missing:
        level, index = min(missing)
        raise LogTampered(f"the log's stored tree lacks the subtree at level {level}, index {index}")
    return found


def _hashes(session: Session, ranges: Sequence[merkle.Range]) -> list[bytes]:
    keys = [key for a, b in ranges for key in merkle.subtrees(a, b)]
    found = _subtrees(session, keys)
    return merkle.range_hashes(ranges, lambda level, index: found[level, index])


class ProofUnavailable(KeyStoreError, LookupError):
    """A proof was asked for a size or leaf the log does not have."""


def _check_size(session: Session, size: int) -> int:
    current, _ = read_head(session, None)
    if not 0 <= size <= current:
        raise ProofUnavailable(f"the log has {current} leaves; there is no tree of size {size}")
    return current


def root_at(session: Session, size: int) -> bytes:
    _check_size(session, size)
    return _hashes(session, [(0, size)])[0] if size else merkle.EMPTY_ROOT


def inclusion_proof(session: Session, index: int, size: int) -> list[bytes]:
    _check_size(session, size)
    if not 0 <= index < size:
        raise ProofUnavailable(f"leaf {index} is not in the tree of size {size}")
    return _hashes(session, merkle.inclusion_ranges(index, size))


def consistency_proof(session: Session, old: int, new: int) -> list[bytes]:
    _check_size(session, new)
    if not 0 <= old <= new:
        raise ProofUnavailable(f"no consistency proof from size {old} to size {new}: sizes must grow")
    return _hashes(session, merkle.consistency_ranges(old, new))


def inclusion_leaf(session: Session, index: int) -> bytes:
    """The stored hash of leaf ``index``."""
    found = session.scalar(select(LogLeaf.leaf_hash).where(LogLeaf.idx == index))
    if found is None:
        raise ProofUnavailable(f"the log has no leaf {index}")
    return found


def leaf_index_of(session: Session, leaf_hash: bytes) -> int | None:
    return session.scalar(select(LogLeaf.idx).where(LogLeaf.leaf_hash == leaf_hash).order_by(LogLeaf.idx).limit(1))


# --- checkpoints -----------------------------------------------------------------------------


def signed_checkpoint(auth: LogAuthority, size: int, root: bytes, *, timestamp_ns: int | None = None) -> str:
    """The C2SP checkpoint note of the committed tree of ``size`` with ``root``."""
    stamp = time.time_ns() if timestamp_ns is None else timestamp_ns
    return auth.signer.sign(Checkpoint(auth.origin, size, root, stamp).text())


def current_checkpoint(session: Session, auth: LogAuthority) -> tuple[int, bytes, str]:
    """A freshly signed checkpoint of the log as committed (size, root, note)."""
    size, border = read_head(session, auth)
    root = merkle.root(border)
    return size, root, signed_checkpoint(auth, size, root)


def publish(session: Session, auth: LogAuthority, *, now: datetime | None = None,
            signed: tuple[int, bytes, str] | None = None) -> LogCheckpoint | None:
    """Store a checkpoint of the log's current size for witnesses (none when that size is
    published already, e.g. by another replica). ``signed``: (size, root, note) to store
    instead, a checkpoint signed earlier and since cosigned by witnesses (service.witnessing).
    Returns the stored row, or None."""
    now = clock.resolve(now)
    size, root, note = current_checkpoint(session, auth) if signed is None else signed
    if session.get(LogCheckpoint, size) is not None:
        return None
    dialect = session.get_bind().dialect.name
    build = postgresql.insert if dialect == "postgresql" else sqlite.insert
    session.execute(build(LogCheckpoint).values(size=size, root=root, note=note, published_at=now)
                    .on_conflict_do_nothing(index_elements=["size"]))
    return session.get(LogCheckpoint, size)


def latest_checkpoint(session: Session) -> LogCheckpoint | None:
    return session.scalar(select(LogCheckpoint).order_by(LogCheckpoint.size.desc()).limit(1))


def published_size(session: Session) -> int:
    found = session.scalar(select(LogCheckpoint.size).order_by(LogCheckpoint.size.desc()).limit(1))
    return -1 if found is None else int(found)


# --- what detection may cite ------------------------------------------------------------------


_LEAF_FIELDS = ("idx", "leaf_hash", "kind", "entry_id", "tenant_id", "kgrams_sha256", "kid", "data", "mac")
_VERIFIED: dict[tuple, bool] = {}
"""Outcomes of :func:`_entry_leaf_ok` by everything it reads (the log key, every field of the
row and of its leaf): a pure function of them, so a row or leaf changed in any field is a new
key and is checked afresh. Detection cites the same few entries many times a second."""
_VERIFIED_MAX = 50_000


def _entry_leaf_ok(auth: LogAuthority, row: LedgerEntry, leaf: LogLeaf) -> bool:
    memo = (id(auth), auth.mac_key, repr([getattr(row, name) for name in HASHED_FIELDS]), row.entry_hash,
            *(getattr(leaf, name) for name in _LEAF_FIELDS))
    found = _VERIFIED.get(memo)
    if found is None:
        found = (leaf.kind == "entry" and leaf.kgrams_sha256 is not None and leaf.tenant_id == row.tenant_id
                 and leaf_authentic(auth, leaf)
                 and entry_hash(entry_fields(row)) == row.entry_hash
                 and leaf.leaf_hash == merkle.leaf_hash(entry_leaf(row.entry_hash, leaf.kgrams_sha256)))
        if len(_VERIFIED) >= _VERIFIED_MAX:
            _VERIFIED.clear()
        _VERIFIED[memo] = found
    return found


def _leaf_mac_parts(leaf: dict[str, Any]) -> tuple[bytes, ...]:
    return (b"leaf", struct.pack(">Q", leaf["idx"]), leaf["leaf_hash"], leaf["kind"].encode(),
            b"" if leaf["entry_id"] is None else struct.pack(">Q", leaf["entry_id"]),
            (leaf["tenant_id"] or "").encode(), (leaf["kgrams_sha256"] or "").encode(),
            (leaf["kid"] or "").encode(), leaf["data"] or b"")


def leaf_authentic(auth: LogAuthority, leaf: LogLeaf) -> bool:
    fields = {name: getattr(leaf, name) for name in ("idx", "leaf_hash", "kind", "entry_id", "tenant_id",
                                                     "kgrams_sha256", "kid", "data")}
    return auth.check(leaf.mac, *_leaf_mac_parts(fields))


# The Core path (rows, not ORM objects; statements built once): detection reads these for
# every ledger match it cites. Rows carry the same attributes as the mapped objects.
_LEAVES_OF = select(LogLeaf.__table__).where(LogLeaf.__table__.c.entry_id.in_(bindparam("entry_ids",
                                                                                       expanding=True)))
_FINISHED_OF = select(LedgerEntry.__table__).where(
    LedgerEntry.__table__.c.generation_id.in_(bindparam("generation_ids", expanding=True)),
    LedgerEntry.__table__.c.kind == "finished")


def logged_entries(session: Session, rows: Sequence[LedgerEntry],
                   leaves: dict[int, LogLeaf] | None = None) -> dict[int, LogLeaf]:
    """Of ``rows``, those the log holds as written: by entry id, its leaf. An entry inserted
    or changed by anyone without the log key (and so every entry when the store has no log
    key) is left out: detection never cites it. ``leaves``: the rows' leaves by entry id,
    read already with them (a join: service.ledger_lookup); None: read here."""
    auth = authority(session)
    if auth is None or not rows:
        return {}
    if leaves is None:
        leaves = {leaf.entry_id: leaf for leaf in session.connection().execute(
            _LEAVES_OF, {"entry_ids": [r.id for r in rows]})}
    return {r.id: leaves[r.id] for r in rows if r.id in leaves and _entry_leaf_ok(auth, r, leaves[r.id])}


def logged_kgrams(session: Session, digests: dict[str, list[tuple[int, int]]],
                  labels: dict[str, set[tuple[str, str]]] | None = None) -> set[str]:
    """Of the generations in ``digests`` (generation id -> every k-gram row stored for it, as
    (scheme, digest)), those whose stored digests are exactly the set, under its scheme, their
    logged ``finished`` entry committed to, each row once: rows added, removed, copied, moved
    or relabelled (scheme) by someone without the log key disqualify the generation.
    ``labels`` (generation id -> the (key id, tenant id) pairs its rows carry): a row must
    carry its logged entry's key and tenant. The commitment covers digests only, and under
    scheme 2 a digest is the same under every key, so a row relabelled to another key or
    tenant would otherwise still match the commitment."""
    if not digests:
        return set()
    rows = session.connection().execute(_FINISHED_OF, {"generation_ids": list(digests)}).all()
    return kgrams_matching(rows, logged_entries(session, rows), digests, labels)


LEAF_LABEL = "leaf_"
"""The prefix of a leaf's columns joined to its entry's (:func:`leaf_columns`)."""


def leaf_columns() -> list:
    """Every ``log_leaves`` column labelled ``leaf_<name>``: selected beside an entry's own
    (an outer join on ``entry_id``), so that one statement reads entries and their leaves."""
    table = LogLeaf.__table__
    return [table.c[name].label(LEAF_LABEL + name) for name in _LEAF_FIELDS]


def joined_leaves(rows: Iterable[Any]) -> dict[int, Any]:
    """The leaves of entry rows read with :func:`leaf_columns`, by entry id (rows without one
    left out), with the attributes of a ``LogLeaf``."""
    out = {}
    for row in rows:
        mapping = row._mapping
        if mapping[LEAF_LABEL + "idx"] is not None:
            out[row.id] = _JoinedLeaf(*(mapping[LEAF_LABEL + name] for name in _LEAF_FIELDS))
    return out


@dataclass(frozen=True)
class _JoinedLeaf:
    idx: int
    leaf_hash: bytes
    kind: str
    entry_id: int | None
    tenant_id: str | None
    kgrams_sha256: str | None
    kid: str | None
    data: bytes | None
    mac: bytes


def kgrams_matching(rows: Sequence[LedgerEntry], leaves: dict[int, LogLeaf], digests: dict[str, list[tuple[int, int]]],
                    labels: dict[str, set[tuple[str, str]]] | None = None) -> set[str]:
    """:func:`logged_kgrams` given the generations' ``finished`` entries ``rows`` and, of
    those, the ones the log holds as written (:func:`logged_entries`'s answer, however read)."""
    return {r.generation_id for r in rows
            if r.id in leaves and leaves[r.id].kgrams_sha256 == kgram_rows_commitment(digests[r.generation_id])
            and len(set(digests[r.generation_id])) == len(digests[r.generation_id])
            and (labels is None or labels.get(r.generation_id, set()) <= {(r.key_id, r.tenant_id)})}
