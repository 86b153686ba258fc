"""A witness of the transparency log (``hallmark ledger witness``): remember the newest
checkpoint seen, and accept a new one only through a consistency proof from it.

The state is a small JSON file: the log's origin and pinned key (given with
``--trust-log-key``, or trusted on first use), and the last checkpoint verified. Each run
fetches the log's current checkpoint and the consistency proof from the remembered size,
and refuses (one line, the old state kept) a checkpoint not signed by the pinned key, a
smaller size than remembered (a rollback), another root at the remembered size or a proof
that does not verify (a fork: the log rewrote what this witness saw).

One witness cannot see a split view (the log showing this witness one history and someone
else another, each consistent in itself). Witnesses that compare their checkpoints can
(:func:`compare`): two checkpoints of one log must be consistent with each other, and two
signed checkpoints that are not are the log's own signed proof of misbehaviour.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ledger.log import merkle
from ledger.log.note import Checkpoint, NoteError, Verifier, open_checkpoint

Consistency = Callable[[int, int], list[bytes]]
"""Fetches the consistency proof between two sizes from the log."""


class WitnessError(Exception):
    """The witness refuses: the message is the one-line reason."""


@dataclass(frozen=True)
class WitnessState:
    log_key: Verifier
    checkpoint: Checkpoint
    note: str
    seen_at: int

    def to_dict(self) -> dict:
        return {"origin": self.log_key.name, "log_key": self.log_key.vkey, "size": self.checkpoint.size,
                "root": base64.b64encode(self.checkpoint.root).decode(), "checkpoint": self.note,
                "seen_at": self.seen_at}


def load_state(path: Path) -> WitnessState | None:
    """The state in ``path`` (None when the file does not exist); :class:`WitnessError` if unusable."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise WitnessError(f"the witness state {path} is unreadable ({type(exc).__name__}); restore it") from None
    try:
        log_key = Verifier.parse(raw["log_key"])
        checkpoint = open_checkpoint(raw["checkpoint"], log_key)
        return WitnessState(log_key, checkpoint, raw["checkpoint"], int(raw.get("seen_at", 0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise WitnessError(f"the witness state {path} is not a witness state ({exc}); restore it") from None


def save_state(path: Path, state: WitnessState) -> None:
    """Write atomically (a crash leaves the old state or the new one), readable by this user only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(state.to_dict(), out, indent=2)
            out.write("\n")
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _open(note: str, log_key: Verifier, what: str) -> Checkpoint:
    try:
        return open_checkpoint(note, log_key)
    except NoteError as exc:
        raise WitnessError(f"{what}: {exc}") from None


def advance(state: WitnessState | None, log_key: Verifier, note: str, consistency: Consistency) -> WitnessState:
    """The new state after seeing ``note`` (the log's current checkpoint); :class:`WitnessError`
    on a bad signature, a rollback, a fork or a failed proof."""
    checkpoint = _open(note, log_key, "the log's checkpoint")
    now = int(time.time())
    if state is None:
        return WitnessState(log_key, checkpoint, note, now)
    old = state.checkpoint
    if checkpoint.size < old.size:
        raise WitnessError(f"rollback: the log now shows {checkpoint.size} leaves, fewer than the {old.size} this "
                           "witness saw (entries were deleted or the log was restored from an older state)")
    if checkpoint.size == old.size:
        if checkpoint.root != old.root:
            raise WitnessError(f"fork: the log signed two different roots for size {old.size}")
        return WitnessState(log_key, checkpoint, note, now)
    try:
        proof = consistency(old.size, checkpoint.size)
    except WitnessError:
        raise
    except Exception as exc:  # noqa: BLE001 - a log that cannot prove consistency fails the same way
        raise WitnessError(f"the log gave no consistency proof from size {old.size} to {checkpoint.size}: "
                           f"{type(exc).__name__}: {exc}") from None
    try:
        merkle.verify_consistency(old.size, checkpoint.size, old.root, checkpoint.root, proof)
    except merkle.ProofError as exc:
        raise WitnessError(f"fork: the checkpoint of size {checkpoint.size} is not an extension of the one of "
                           f"size {old.size} this witness saw ({exc})") from None
    return WitnessState(log_key, checkpoint, note, now)


def compare(state: WitnessState, peer_note: str, consistency: Consistency) -> str:
    """Gossip: check another witness's checkpoint of the same log against ours; a
    one-line summary, or :class:`WitnessError` naming a split view."""
    peer = _open(peer_note, state.log_key, "the peer's checkpoint")
    mine = state.checkpoint
    if peer.size == mine.size:
        if peer.root != mine.root:
            raise WitnessError(f"split view: the log signed two different roots for size {mine.size}, one for "
                               "this witness and one for the peer")
        return f"the peer saw the same checkpoint (size {mine.size})"
    small, large = (peer, mine) if peer.size < mine.size else (mine, peer)
    try:
        merkle.verify_consistency(small.size, large.size, small.root, large.root, consistency(small.size, large.size))
    except merkle.ProofError as exc:
        raise WitnessError(f"split view: the peer's checkpoint (size {peer.size}) and this witness's (size "
                           f"{mine.size}) are not one history ({exc})") from None
    return f"the peer's checkpoint (size {peer.size}) and this witness's (size {mine.size}) are one history"
