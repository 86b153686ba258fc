"""Checking a key set (``/.well-known/hallmark-keys.json``) against the pinned log key:
which signing keys a verifier may trust, and for when. Pure: no database, no KEK.

The document::

    {"log": {"origin": str, "vkey": str, "tree_size": int, "checkpoint": <C2SP signed note>},
     "keys": [{"kid", "alg", "public_key", "state", "not_before", "not_after", "revoked_at",
               "revocation_reason",
               "log": {"leaf_index": int, "event": {...}, "inclusion_proof": [base64, ...]}}]}

Each key's ``event`` is its latest leaf in the transparency log (ledger.log.leaves.key_event).
A key is trusted only when the checkpoint verifies under the *pinned* log key (never the
``vkey`` the document names: a forger would name their own) and the event's leaf is
included in it; its window and revocation are then the event's, whatever the key's other
fields say. Keys that fail are left out, so a signature by them reads as "the log's key set
does not contain it".

What one key set cannot show: that no later event exists (a server handing out an old key
set hides a later retirement or revocation until the verifier sees a newer checkpoint).
Verifiers that also witness the log (``hallmark ledger witness``) see the newest one.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ledger.log import merkle
from ledger.log.leaves import KEY_EVENT_TYPE, key_event_leaf
from ledger.log.note import Checkpoint, NoteError, Verifier, open_checkpoint
from ledger.receipts import ALGORITHM, ReceiptInvalid, TrustedKey, TrustedKeys, key_id_of, unb64url


def _trusted(entry: Any, checkpoint: Checkpoint) -> TrustedKey | None:
    try:
        log = entry["log"]
        event = log["event"]
        index = log["leaf_index"]
        proof = [base64.b64decode(h, validate=True) for h in log["inclusion_proof"]]
        raw = unb64url(event["public_key"])
        if (event.get("type") != KEY_EVENT_TYPE or event.get("alg") != ALGORITHM or len(raw) != 32
                or key_id_of(raw) != event["kid"] or entry.get("kid") != event["kid"]
                or not isinstance(index, int) or isinstance(index, bool)):
            return None
        merkle.verify_inclusion(index, checkpoint.size, merkle.leaf_hash(key_event_leaf(event)), proof,
                                checkpoint.root)
        return TrustedKey(kid=event["kid"], public_key=Ed25519PublicKey.from_public_bytes(raw),
                          not_before=event.get("not_before"), not_after=event.get("not_after"),
                          revoked_at=event.get("revoked_at"), trusted_below=event.get("trusted_below"),
                          revocation_reason=entry.get("revocation_reason") if event.get("revoked_at") else None)
    except (KeyError, TypeError, ValueError, binascii.Error, merkle.ProofError):
        return None


def trusted_keys(keyset: Any, log_key: Verifier) -> TrustedKeys:
    """The signing keys of ``keyset`` that the log signed by ``log_key`` holds, with their
    windows; :class:`ReceiptInvalid` when the key set's checkpoint does not verify."""
    if not isinstance(keyset, dict) or not isinstance(keyset.get("keys"), list):
        raise ReceiptInvalid("the key set is not a {\"keys\": [...]} document")
    log = keyset.get("log")
    if not isinstance(log, dict) or not isinstance(log.get("checkpoint"), str):
        raise ReceiptInvalid("the key set carries no transparency-log checkpoint: its keys cannot be checked "
                             "against the log (a key set from before the log, or not Hallmark's)")
    try:
        checkpoint = open_checkpoint(log["checkpoint"], log_key)
    except NoteError as exc:
        raise ReceiptInvalid(f"the key set's checkpoint: {exc}") from None
    found = {}
    for entry in keyset["keys"]:
        key = _trusted(entry, checkpoint)
        if key is not None:
            found[key.kid] = key
    return TrustedKeys(found, log_key=log_key, checkpoint=checkpoint)


def read_log_key(text: str) -> Verifier:
    """A pinned log key from a file's text: the verifier key line (``hallmark ledger
    checkpoint --json`` prints it as ``log_key``), or a witness state file holding one."""
    stripped = text.strip()
    if stripped.startswith("{"):
        import json

        try:
            stripped = str(json.loads(stripped)["log_key"])
        except (ValueError, KeyError, TypeError):
            raise ReceiptInvalid("the trusted log key file is JSON without a 'log_key'") from None
    try:
        return Verifier.parse(stripped)
    except NoteError as exc:
        raise ReceiptInvalid(f"the trusted log key: {exc}") from None
