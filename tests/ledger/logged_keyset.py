"""A key set whose one signing key a (test) transparency log holds: what the offline
verifiers need for a golden file's signer (ledger.keyset). Built from the pure parts only."""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ledger.chain import timestamp
from ledger.log import merkle
from ledger.log.leaves import key_event, key_event_leaf
from ledger.log.note import Checkpoint, NoteSigner
from ledger.receipts import Signer, b64url


def logged_keyset(signer: Signer, *, not_before, log_seed: bytes = b"\x07" * 32) -> tuple[dict[str, Any], str]:
    """(key set document, the log's verifier key) for ``signer``, logged as created at
    ``not_before`` (an aware datetime), in a one-leaf log with a deterministic key."""
    log = NoteSigner("hallmark.test/log", Ed25519PrivateKey.from_private_bytes(log_seed))
    raw = signer.private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    event = key_event(kid=signer.kid, public_key=b64url(raw), event="created", at=not_before, not_before=not_before,
                      not_after=None, revoked_at=None)
    root = merkle.leaf_hash(key_event_leaf(event))
    note = log.sign(Checkpoint(log.name, 1, root, 0).text())
    keyset = {"log": {"origin": log.name, "vkey": log.verifier.vkey, "tree_size": 1, "checkpoint": note},
              "keys": [{"kid": signer.kid, "alg": "Ed25519", "public_key": b64url(raw), "state": "active",
                        "not_before": timestamp(not_before), "not_after": None, "revoked_at": None,
                        "log": {"leaf_index": 0, "event": event, "inclusion_proof": []}}]}
    return keyset, log.verifier.vkey
