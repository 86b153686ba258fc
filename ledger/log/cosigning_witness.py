"""A tlog-witness v1.0.0 witness (``hallmark witness serve``): cosigns a log's checkpoint
only when it extends, by a verified consistency proof, the last one it cosigned for that
origin; so two providers can witness each other's logs, and a client holding a checkpoint
with a quorum of cosignatures knows the log showed everyone the same history.

State is the witness's own SQLite file (not the gateway's store): the logs it witnesses
(origin -> log vkey) and, per origin, the last cosigned size, root and note. Checking the
old size and recording the new checkpoint are one ``BEGIN IMMEDIATE`` transaction, so two
concurrent requests cannot roll the recorded size back (the race the spec describes). The
answers follow c2sp.org/tlog-witness: 404 unknown origin, 403 no good signature by the
log's key, 400 malformed or old size above the checkpoint's, 409 (``text/x.tlog.size``)
old size not the recorded one, 422 a proof or root that does not verify, else 200 with
the cosignature line (Ed25519 tlog-cosignature v1.0.1, or ML-DSA-44 v1.1.0-rc.1).
"""

from __future__ import annotations

import hashlib
from contextlib import closing
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ledger.log import merkle
from ledger.log.cosignature import Cosigner
from ledger.log.note import Checkpoint, NoteError, Verifier, open_note
from ledger.log.witness_protocol import SIZE_TYPE, ProtocolError, parse_request

_SCHEMA = """
CREATE TABLE IF NOT EXISTS logs (origin TEXT PRIMARY KEY, vkey TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints (origin TEXT PRIMARY KEY, size INTEGER NOT NULL, root BLOB NOT NULL,
                                        note TEXT NOT NULL, cosigned_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS refused (id INTEGER PRIMARY KEY, origin TEXT NOT NULL, status INTEGER NOT NULL,
                                    reason TEXT NOT NULL, body TEXT NOT NULL, at INTEGER NOT NULL);
"""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


def _error(status: int, reason: str) -> Answer:
    return Answer(status, (reason + "\n").encode())


class CosigningWitness:
    def __init__(self, path: Path, cosigner: Cosigner) -> None:
        self.path = Path(path)
        self.cosigner = cosigner
        self._lock = threading.Lock()
        with closing(self._connect()) as db:
            db.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def add_log(self, vkey: str) -> Verifier:
        """Witness the log of ``vkey`` (its name is its origin)."""
        key = Verifier.parse(vkey)
        with closing(self._connect()) as db:
            db.execute("INSERT INTO logs (origin, vkey) VALUES (?, ?) ON CONFLICT (origin) DO UPDATE SET vkey = "
                       "excluded.vkey", (key.name, key.vkey))
        return key

    def logs(self) -> list[Verifier]:
        with closing(self._connect()) as db:
            return [Verifier.parse(v) for (v,) in db.execute("SELECT vkey FROM logs ORDER BY origin")]

    def add_checkpoint(self, body: bytes, now: int | None = None) -> Answer:
        try:
            old, proof, note = parse_request(body)
        except ProtocolError as exc:
            return _error(400, str(exc))
        origin = note.split("\n", 1)[0]
        with self._lock:
            db = self._connect()
            try:
                db.execute("BEGIN IMMEDIATE")
                answer = self._add(db, origin, old, proof, note, now)
                if answer.status not in (200, 404):
                    db.execute("INSERT INTO refused (origin, status, reason, body, at) VALUES (?, ?, ?, ?, ?)",
                               (origin, answer.status, answer.body.decode(errors="replace").strip(),
                                body.decode(errors="replace"), int(time.time())))
                db.execute("COMMIT")
                return answer
            except BaseException:
                db.execute("ROLLBACK")
                raise
            finally:
                db.close()

    def _add(self, db: sqlite3.Connection, origin: str, old: int, proof: list[bytes], note: str,
             now: int | None) -> Answer:
        row = db.execute("SELECT vkey FROM logs WHERE origin = ?", (origin,)).fetchone()
        if row is None:
            return _error(404, f"unknown log origin {origin!r}")
        try:
            text = open_note(note, Verifier.parse(row[0]))
        except NoteError as exc:
            return _error(403, str(exc))
        try:
            checkpoint = Checkpoint.parse_text(text)
        except NoteError as exc:
            return _error(400, str(exc))
        if old > checkpoint.size:
            return _error(400, f"old size {old} is above the checkpoint's size {checkpoint.size}")
        last = db.execute("SELECT size, root FROM checkpoints WHERE origin = ?", (origin,)).fetchone()
        last_size, last_root = (0, merkle.EMPTY_ROOT) if last is None else (int(last[0]), bytes(last[1]))
        if old != last_size:
            return Answer(409, f"{last_size}\n".encode(), SIZE_TYPE)
        if checkpoint.size == 0 and checkpoint.root != merkle.EMPTY_ROOT:
            return _error(422, "a checkpoint of size 0 has the empty tree's root")
        if old == 0 and proof:
            return _error(422, "a consistency proof from size 0 is empty")
        try:
            merkle.verify_consistency(old, checkpoint.size, last_root if old else checkpoint.root, checkpoint.root,
                                      proof)
        except merkle.ProofError as exc:
            return _error(422, str(exc))
        stamp = int(time.time()) if now is None else now
        line = self.cosigner.cosign(text, stamp)
        db.execute("INSERT INTO checkpoints (origin, size, root, note, cosigned_at) VALUES (?, ?, ?, ?, ?) "
                   "ON CONFLICT (origin) DO UPDATE SET size = excluded.size, root = excluded.root, "
                   "note = excluded.note, cosigned_at = excluded.cosigned_at",
                   (origin, checkpoint.size, checkpoint.root, note + line, stamp))
        return Answer(200, line.encode())

    def checkpoint(self, origin_hash: str) -> Answer:
        """The monitoring API: the last cosigned checkpoint of the log whose origin hashes
        (SHA-256, lowercase hex) to ``origin_hash``, with this witness's cosignature."""
        with closing(self._connect()) as db:
            for origin, note in db.execute("SELECT origin, note FROM checkpoints"):
                if hashlib.sha256(origin.encode("utf-8")).hexdigest() == origin_hash:
                    return Answer(200, note.encode())
        return _error(404, "this witness never cosigned a checkpoint of that log")
