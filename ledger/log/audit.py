"""Auditing the transparency log against the ledger (``hallmark ledger verify``).

Recomputes, from the rows, everything the log commits to and compares:

- every leaf: contiguous indexes, its MAC under the log key (with the KEK), its hash from
  what it logs (the entry's recomputed canonical hash and its k-gram rows' commitment; a
  signing-key event's data); a leaf whose entry is gone names the deletion;
- every ledger entry has a leaf (one inserted without the log key has none), in the leaf's
  tenant; every signing-key row agrees with its latest logged event;
- the tree: every stored complete subtree and the head's border, recomputed from the leaves;
- every stored checkpoint: its signature under the log key and its root against the
  recomputed tree at its size (a rewrite of history the log once signed shows here);
- optionally a checkpoint the caller pins (a witness's, a receipt's): the same.

Without the KEK the MACs are not checked (said in the report); the rest still is. What no
audit of the database alone can see: a rollback of every table to an earlier consistent
state (the log, its checkpoints and the entries together). Only someone holding a later
checkpoint (a witness, a receipt) sees that; docs/how-to/verify.md.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from keys.models import LedgerEntry, LedgerKgram, LogCheckpoint, LogLeaf, LogNode, SigningKey, Tenant
from ledger.chain import entry_fields, entry_hash, timestamp
from ledger.log import faults, merkle, tlog
from ledger.log.key import LogAuthority, log_verifier
from ledger.log.leaves import EMPTY_KGRAMS, entry_leaf, key_event_leaf, kgram_rows_commitment
from ledger.log.note import Checkpoint, NoteError, Verifier, open_checkpoint
from ledger.receipts import b64url


@dataclass
class LogReport:
    size: int = 0
    root: str = ""
    checkpoints: int = 0
    macs_checked: bool = False
    problems: list[str] = field(default_factory=list)
    tenant_leaves: dict[str, int] = field(default_factory=dict)
    """Logged entries per tenant name (what a deleted chain leaves behind)."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "size": self.size, "root": self.root, "checkpoints": self.checkpoints,
                "macs_checked": self.macs_checked, "tenant_leaves": self.tenant_leaves, "problems": self.problems}


def audit_log(session: Session, auth: LogAuthority | None, *, pinned: list[tuple[str, str]] = (),
              log_key: Verifier | None = None, max_problems: int = 20) -> LogReport:
    """The log's audit (module docstring). ``pinned``: (label, checkpoint note) pairs the
    caller holds; ``log_key``: the pinned log key (default: the KEK-opened one, else the
    database's own, which proves less)."""
    report = LogReport(macs_checked=auth is not None)
    problems = report.problems

    def problem(text: str) -> None:
        if len(problems) < max_problems:
            problems.append(text)

    verifier = log_key or (auth.verifier if auth is not None else log_verifier(session))
    if verifier is None:  # a store from before the log (migration 0008), not opened by a writer since
        count = session.scalar(select(func.count()).select_from(LedgerEntry)) or 0
        if count:
            problem(f"the ledger has {count} entries but no transparency log yet: run `hallmark ledger init` "
                    "(as the database owner, with the KEK)")
        return report
    try:
        size, border = tlog.read_head(session, auth)
    except tlog.LogTampered as exc:
        problem(exc.user_message)
        size, border = tlog.read_head(session, None)
    report.size = size
    names = dict(session.execute(select(Tenant.id, Tenant.name)).all())
    entries = {row.id: row for row in session.scalars(select(LedgerEntry))}
    kgram_sets: dict[str, list[tuple[int, int]]] = defaultdict(list)
    kgram_labels: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for generation_id, scheme, digest, key_id, tenant_id in session.execute(
            select(LedgerKgram.generation_id, LedgerKgram.scheme, LedgerKgram.digest, LedgerKgram.key_id,
                   LedgerKgram.tenant_id)):
        kgram_sets[generation_id].append((int(scheme), int(digest)))
        kgram_labels[generation_id].add((key_id, tenant_id))
    leaves = list(session.scalars(select(LogLeaf).order_by(LogLeaf.idx)))
    hashes: list[bytes] = []
    seen_entries: set[int] = set()
    committed_kgrams: set[str] = set()
    last_events: dict[str, dict[str, Any]] = {}
    tenant_leaves: dict[str, int] = defaultdict(int)
    for position, leaf in enumerate(leaves):
        if leaf.idx >= size:
            break  # beyond the head: foreign (faults.foreign_rows, below)
        if leaf.idx != position:
            problem(f"log leaf {position} is missing (the log was cut or a leaf deleted; next is {leaf.idx})")
            break
        hashes.append(leaf.leaf_hash)
        if auth is not None and not tlog.leaf_authentic(auth, leaf):
            problem(f"log leaf {leaf.idx} does not authenticate under the log key: written without the KEK")
        if leaf.kind == "signing_key":
            if leaf.data is None or merkle.leaf_hash(key_event_leaf(json.loads(leaf.data))) != leaf.leaf_hash:
                problem(f"log leaf {leaf.idx} (signing key {leaf.kid}): its data does not match its hash")
            else:
                last_events[leaf.kid] = json.loads(leaf.data)
            continue
        tenant_leaves[names.get(leaf.tenant_id, leaf.tenant_id or "?")] += 1
        row = entries.get(leaf.entry_id)
        where = f"log leaf {leaf.idx} (tenant {names.get(leaf.tenant_id, leaf.tenant_id)!r})"
        if row is None:
            problem(f"{where}: its ledger entry (id {leaf.entry_id}) is gone: deleted from the ledger")
            continue
        seen_entries.add(row.id)
        recomputed = entry_hash(entry_fields(row))
        commitment = EMPTY_KGRAMS
        relabelled = False
        if row.kind == "finished":
            stored = kgram_sets.get(row.generation_id, [])
            commitment = kgram_rows_commitment(stored)
            committed_kgrams.add(row.generation_id)
            # The commitment covers the digests; each row once, under the entry's key and tenant.
            relabelled = len(set(stored)) != len(stored) or \
                not kgram_labels.get(row.generation_id, set()) <= {(row.key_id, row.tenant_id)}
        at = f"{where}, tenant {names.get(row.tenant_id, row.tenant_id)!r} seq {row.seq}"
        if recomputed != row.entry_hash or merkle.leaf_hash(entry_leaf(recomputed, leaf.kgrams_sha256 or EMPTY_KGRAMS)) \
                != leaf.leaf_hash:
            problem(f"{at}: the entry differs from what the log holds (modified, or replaced and re-chained)")
        elif commitment != leaf.kgrams_sha256 or relabelled:
            problem(f"{at}: the k-gram rows of generation {row.generation_id} differ from the set the log "
                    "committed to (rows deleted, inserted, moved or relabelled)")
        if leaf.tenant_id != row.tenant_id:
            problem(f"{at}: the entry moved to another tenant")
    beyond = faults.foreign_rows(session, size)
    for line in beyond.describe():  # rows that block every append (issue 35): `ledger repair` removes them
        problem(line)
    if len(leaves) < size and not any("missing" in p for p in problems):
        problem(f"the log's head says {size} leaves but {len(leaves)} are stored")
    for row in entries.values():
        if row.id not in seen_entries:
            problem(f"tenant {names.get(row.tenant_id, row.tenant_id)!r} entry seq {row.seq} (generation "
                    f"{row.generation_id}) is not in the log: inserted without the log key")
    for generation_id in set(kgram_sets) - committed_kgrams:
        problem(f"k-gram rows of generation {generation_id} belong to no logged finished entry: inserted")
    report.tenant_leaves = dict(tenant_leaves)
    _audit_tree(session, hashes, size, border, problem)
    report.root = merkle.root(border).hex()
    _audit_keys(session, last_events, problem)
    roots = _Roots(hashes)
    for checkpoint in session.scalars(select(LogCheckpoint).order_by(LogCheckpoint.size)):
        report.checkpoints += 1
        _audit_checkpoint(f"published checkpoint of size {checkpoint.size}", checkpoint.note, verifier, roots,
                          len(hashes), problem)
    for label, note in pinned:
        _audit_checkpoint(label, note, verifier, roots, len(hashes), problem)
    return report


class _Roots:
    """Roots of the recomputed tree at any size, from its leaf hashes."""

    def __init__(self, hashes: list[bytes]) -> None:
        self.hashes = hashes
        self.border: list[bytes] = []
        self.at = {0: merkle.EMPTY_ROOT}
        for i, h in enumerate(hashes):
            self.border, _ = merkle.append(self.border, i, h)
            self.at[i + 1] = merkle.root(self.border)


def _audit_tree(session: Session, hashes: list[bytes], size: int, border: list[bytes], problem) -> None:
    nodes: dict[tuple[int, int], bytes] = {}
    recomputed: list[bytes] = []
    for i, h in enumerate(hashes):
        recomputed, completed = merkle.append(recomputed, i, h)
        nodes.update(((level, index), value) for level, index, value in completed)
    stored = {(n.level, n.idx): n.hash for n in session.scalars(select(LogNode))}
    bad = sorted(k for k in stored if nodes.get(k) != stored[k])
    if bad:
        problem(f"{len(bad)} stored subtree(s) of the log do not match its leaves (first: level {bad[0][0]}, "
                f"index {bad[0][1]}): the tree was rewritten")
    if len(hashes) == size and recomputed != border:
        problem("the log's head does not match its leaves: the head was rewritten")


def _audit_keys(session: Session, events: dict[str, dict[str, Any]], problem) -> None:
    for row in session.scalars(select(SigningKey)):
        event = events.get(row.id)
        if event is None:
            problem(f"signing key {row.id} is not in the log: inserted without the log key (verifiers refuse it)")
            continue
        window = (b64url(row.public_key), timestamp(row.created_at),
                  timestamp(row.retired_at) if row.retired_at else None,
                  timestamp(row.revoked_at) if row.revoked_at else None)
        if window != (event["public_key"], event["not_before"], event["not_after"], event["revoked_at"]):
            problem(f"signing key {row.id}: its row differs from its latest logged event (changed without the "
                    "log key; the log's version is the one trusted)")


def _audit_checkpoint(label: str, note: str, verifier: Verifier | None, roots: _Roots, size: int, problem) -> None:
    try:
        checkpoint = open_checkpoint(note, verifier) if verifier is not None else Checkpoint.parse_text(
            note.split("\n\n")[0] + "\n")
    except NoteError as exc:
        problem(f"{label}: {exc}")
        return
    if checkpoint.size > size:
        problem(f"{label}: the log signed {checkpoint.size} leaves but holds {size}: entries were cut off")
    elif roots.at[checkpoint.size] != checkpoint.root:
        problem(f"{label}: the log's recomputed root at size {checkpoint.size} differs from the signed one: "
                "history was rewritten (edited, deleted, reordered or inserted entries)")
