"""Signed statements: generation receipts and detection reports (Ed25519), verifiable offline.

A signed document is ``{"statement": {...}, "signature": {"alg": "Ed25519", "kid": ...,
"sig": ...}}``. The signature covers exactly::

    f"{statement['type']}/v{statement['version']}\\n".encode() || canonical_json(statement)

with :func:`ledger.chain.canonical_json` (keys sorted, no whitespace, UTF-8, shortest
floats) and ``sig`` the 64-byte Ed25519 signature in unpadded base64url. ``kid`` names
the signing key in the key set served at ``/.well-known/hallmark-keys.json`` (ledger.keyset:
each key with its window and the proof that the transparency log holds it).

Trust in a key comes from the log, never from the key set's own say-so: a verifier pins the
log's public key, checks the key set against it (ledger.keyset.trusted_keys) and then refuses
a signature by a key the log does not hold, by a revoked key, or dated (by the statement's
own time field, :data:`STATEMENT_TIME`) outside the key's window (:func:`check_window`).

A receipt's statement (type ``hallmark.receipt``, version 2) holds: generation_id,
tenant_id, tenant, key (key_id, version, fingerprint, state, and prf and key_bits for a key that is not
a 64-bit Philox key; null when unwatermarked), spec,
model, engine, created_at and finished_at (when the generation started, from its ``started``
entry or a one-entry generation's ``details.started_at``, and when its attested entry was
written), finish_reason,
output_sha256 (SHA-256 of the UTF-8 text), token_ids_sha256 (SHA-256 of the ids as 4-byte
big-endian), output_tokens, watermarked_tokens, watermarked_share (watermarked/output
tokens, 6 decimals), unwatermarked_reason and ledger: the tenant chain's ``seq`` and
``entry_hash`` of the entry it attests, the entry's ``kgrams_sha256`` and its
``leaf_index`` in the transparency log. Beside the signed statement, ``log`` carries a
checkpoint that includes the entry and the inclusion proof (:func:`verify_log_proof`):
checked offline with the pinned log key. Version 1 receipts (golden files
``tests/data/receipt-v1*``, which pin the encoding) had no log position.
The key's fingerprint is an opaque string to the encoding: receipts signed before
fingerprints were cut to 24 bits (``watermark.key``) carry 16 hex digits, later ones 6;
both verify alike (the signature covers whatever string was signed).

This module needs only ``cryptography``, the standard library and the pure modules
ledger.chain, ledger.log.merkle, ledger.log.note and ledger.log.leaves: ``hallmark receipt verify`` runs it in
a fresh process with no database and no KEK.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ledger.chain import canonical_json

ALGORITHM = "Ed25519"
RECEIPT_TYPE = "hallmark.receipt"
REPORT_TYPE = "hallmark.detection_report"
KID_PREFIX = "sk_"


class ReceiptInvalid(Exception):
    """A signed document does not verify; the message is the one-line reason."""


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64url(text: str) -> bytes:
    if not isinstance(text, str):
        raise ValueError("not base64url text")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def key_id_of(public_raw: bytes) -> str:
    """``sk_`` + 16 hex digits of SHA-256 of the raw 32-byte public key."""
    return KID_PREFIX + hashlib.sha256(public_raw).hexdigest()[:16]


def signed_bytes(statement: dict[str, Any]) -> bytes:
    """The exact bytes a signature covers (see the module docstring)."""
    kind, version = statement.get("type"), statement.get("version")
    if not isinstance(kind, str) or isinstance(version, bool) or not isinstance(version, int):
        raise ReceiptInvalid("the statement has no type and integer version")
    return f"{kind}/v{version}\n".encode("utf-8") + canonical_json(statement)


@dataclass(frozen=True)
class Signer:
    """An opened signing key. The private key never appears in ``repr``."""

    kid: str
    private_key: Ed25519PrivateKey

    def __repr__(self) -> str:
        return f"Signer(kid={self.kid!r})"

    def sign(self, statement: dict[str, Any]) -> dict[str, Any]:
        signature = self.private_key.sign(signed_bytes(statement))
        return {"statement": statement, "signature": {"alg": ALGORITHM, "kid": self.kid, "sig": b64url(signature)}}


@dataclass(frozen=True)
class TrustedKey:
    """A signing key a verifier trusts, and when: its window ``[not_before, not_after)``
    and its revocation, as the transparency log holds them (ledger.keyset). Timestamps are the
    chain's fixed-width UTC strings (ledger.chain.timestamp), so they order as text."""

    kid: str
    public_key: Ed25519PublicKey
    not_before: str | None = None
    not_after: str | None = None
    revoked_at: str | None = None
    revocation_reason: str | None = None
    trusted_below: int | None = None
    """For a revoked key: the log size before its compromise time (the revocation's logged
    ``trusted_below``). A receipt of this key whose entry is one of those first leaves, and whose
    content is that entry's, stays verifiable: the log, not the signature, shows it was made
    before the compromise. None: nothing it signed is trusted."""


class TrustedKeys(dict):
    """kid -> :class:`TrustedKey`, with the log they came from: ``log_key`` (the pinned
    :class:`ledger.log.note.Verifier`) and ``checkpoint`` (the key set's checkpoint), or None for a
    key set not checked against a log."""

    def __init__(self, keys: dict[str, TrustedKey], *, log_key: Any = None, checkpoint: Any = None) -> None:
        super().__init__(keys)
        self.log_key = log_key
        self.checkpoint = checkpoint


WINDOW_GRACE = timedelta(seconds=60)
"""A statement dated this close outside its key's window still verifies: gateways keep their
signing key for a few seconds after a rotation (the key cache) and replicas' clocks differ.
Revocation has no grace."""
STATEMENT_TIME = {RECEIPT_TYPE: "finished_at", REPORT_TYPE: "created_at"}
"""The field of each statement type that dates it (what the key's window is checked against)."""


def _instant(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


_BOUND = (("generation_id", "generation_id"), ("tenant_id", "tenant_id"), ("model", "model"), ("engine", "engine"),
          ("spec", "spec"), ("finish_reason", "finish_reason"), ("output_sha256", "output_sha256"),
          ("token_ids_sha256", "token_ids_sha256"), ("output_tokens", "output_tokens"),
          ("watermarked_tokens", "watermarked_tokens"), ("unwatermarked_reason", "unwatermarked_reason"),
          ("finished_at", "created_at"))
UNBOUND = ("tenant", "key.fingerprint", "created_at (of a streamed generation)")
"""What a receipt says that its entry does not fix: vouched for by the signature alone."""


def check_entry(document: Any, statement: dict[str, Any]) -> None:
    """:class:`ReceiptInvalid` unless the receipt carries its entry (``entry``: every hashed
    field, ledger.chain) and that entry hashes to the statement's ``ledger.entry_hash`` and says
    what the statement says (all but :data:`UNBOUND`). Then the statement's content is the
    logged entry's, whoever signed it."""
    from ledger.chain import HASHED_FIELDS, entry_hash

    entry = document.get("entry") if isinstance(document, dict) else None
    ledger = statement.get("ledger") if isinstance(statement.get("ledger"), dict) else {}
    if not isinstance(entry, dict) or set(entry) != set(HASHED_FIELDS):
        raise ReceiptInvalid("the receipt does not carry its ledger entry, so its content cannot be checked "
                             "against the log (receipts issued before revocation times existed do not)")
    try:
        if entry_hash(entry) != ledger.get("entry_hash"):
            raise ReceiptInvalid("the receipt's entry does not hash to its ledger.entry_hash")
    except (TypeError, ValueError):
        raise ReceiptInvalid("the receipt's entry is malformed") from None
    key = statement.get("key") if isinstance(statement.get("key"), dict) else None
    wrong = [name for name, field in _BOUND if statement.get(name) != entry.get(field)]
    wrong += [] if entry.get("kind") == "finished" else ["kind"]
    wrong += [] if ledger.get("seq") == entry.get("seq") else ["ledger.seq"]
    wrong += [] if (key or {}).get("key_id") == entry.get("key_id") and (key or {}).get("version") == \
        entry.get("key_version") and (key or {}).get("state") == entry.get("key_state") else ["key"]
    started = (entry.get("details") or {}).get("started_at") if isinstance(entry.get("details"), dict) else None
    if started is not None and statement.get("created_at") != started:
        wrong.append("created_at")
    if wrong:
        raise ReceiptInvalid(f"the receipt says what its logged entry does not ({', '.join(wrong)})")


def check_window(statement: dict[str, Any], key: TrustedKey, document: Any = None) -> None:
    """:class:`ReceiptInvalid` when ``key`` may not have signed ``statement``: the statement's
    own time (:data:`STATEMENT_TIME`) outside the key's window, or the key revoked, unless the
    log shows the statement was made before the compromise (:attr:`TrustedKey.trusted_below`: a
    receipt, with its entry (:func:`check_entry`), at a leaf before that size; its inclusion is
    :func:`verify_receipt`'s to check, and that function requires it for such a key)."""
    if key.revoked_at is not None:
        why = f": {key.revocation_reason}" if key.revocation_reason else ""
        head = f"signed by revoked key {key.kid} (compromised at {key.revoked_at}{why})"
        below = key.trusted_below
        if below is None or isinstance(below, bool) or not isinstance(below, int) or below <= 0:
            raise ReceiptInvalid(f"{head}; nothing it signed is trusted")
        if statement.get("type") != RECEIPT_TYPE:
            raise ReceiptInvalid(f"{head}; the log records receipts' entries, not detection reports, so no report "
                                 "it signed can be shown to predate the compromise")
        index = (statement.get("ledger") or {}).get("leaf_index") if isinstance(statement.get("ledger"), dict) \
            else None
        if not isinstance(index, int) or isinstance(index, bool) or index >= below:
            raise ReceiptInvalid(f"{head}; the log shows only its first {below} leaves before that, and this "
                                 f"receipt's entry is leaf {index}")
        check_entry(document, statement)
        return
    name = STATEMENT_TIME.get(statement.get("type"), "created_at")
    when = _instant(statement.get(name))
    if when is None:
        raise ReceiptInvalid(f"the statement has no valid {name} to check its signing key's window against")
    start, end = _instant(key.not_before), _instant(key.not_after)
    if start is not None and when < start - WINDOW_GRACE:
        raise ReceiptInvalid(f"signed by {key.kid} for {name} {statement[name]}, before the key's window opened "
                             f"({key.not_before})")
    if end is not None and when >= end + WINDOW_GRACE:
        raise ReceiptInvalid(f"signed by {key.kid} for {name} {statement[name]}, after the key was retired "
                             f"({key.not_after})")


def public_keys(keyset: dict[str, Any]) -> dict[str, Ed25519PublicKey]:
    """Public keys by kid from a key set document, unchecked against any log (a kid must
    match its key). Trust no signature on these alone: ledger.keyset.trusted_keys checks the
    set against the pinned log key and gives each key its window."""
    if not isinstance(keyset, dict) or not isinstance(keyset.get("keys"), list):
        raise ReceiptInvalid("the key set is not a {\"keys\": [...]} document")
    found: dict[str, Ed25519PublicKey] = {}
    for entry in keyset["keys"]:
        try:
            raw = unb64url(entry["public_key"])
            if entry.get("alg") != ALGORITHM or len(raw) != 32 or key_id_of(raw) != entry["kid"]:
                continue
            found[entry["kid"]] = Ed25519PublicKey.from_public_bytes(raw)
        except (KeyError, TypeError, ValueError):
            continue
    return found


def verify_signed(document: Any, keys: Mapping[str, TrustedKey | Ed25519PublicKey], *,
                  expected_type: str | None = None) -> dict[str, Any]:
    """The statement of a signed document whose signature verifies under ``keys``;
    :class:`ReceiptInvalid` with a one-line reason otherwise. With :class:`TrustedKey`
    values (ledger.keyset.trusted_keys), also refuses a revoked key or a statement dated
    outside its key's window (:func:`check_window`): what detection reports and receipts
    both rely on."""
    if not isinstance(document, dict) or not isinstance(document.get("statement"), dict) \
            or not isinstance(document.get("signature"), dict):
        raise ReceiptInvalid("not a signed Hallmark document (needs 'statement' and 'signature')")
    statement, signature = document["statement"], document["signature"]
    if expected_type is not None and statement.get("type") != expected_type:
        raise ReceiptInvalid(f"the statement is a {statement.get('type')!r}, not a {expected_type!r}")
    if signature.get("alg") != ALGORITHM:
        raise ReceiptInvalid(f"unsupported signature algorithm {signature.get('alg')!r}; expected Ed25519")
    kid = signature.get("kid")
    if not isinstance(kid, str) or kid not in keys:
        raise ReceiptInvalid(f"unknown signing key {kid!r}: the log's key set does not contain it")
    key = keys[kid]
    public = key.public_key if isinstance(key, TrustedKey) else key
    try:
        raw = unb64url(signature.get("sig"))
    except (ValueError, TypeError):
        raise ReceiptInvalid("the signature is not base64url") from None
    try:
        public.verify(raw, signed_bytes(statement))
    except (InvalidSignature, ValueError):
        raise ReceiptInvalid(f"bad signature: the statement was altered or not signed by {kid}") from None
    if isinstance(key, TrustedKey):
        check_window(statement, key, document)
    return statement


def verify_log_proof(receipt: dict[str, Any], statement: dict[str, Any], log_key: Any) -> Any:
    """The receipt's entry is in the log: its leaf (ledger.log.leaves.entry_leaf of the statement's
    ``ledger.entry_hash`` and ``ledger.kgrams_sha256``) at ``ledger.leaf_index`` is included in
    the checkpoint the receipt carries, signed by ``log_key``. Returns that checkpoint."""
    from ledger.log import merkle
    from ledger.log.leaves import entry_leaf
    from ledger.log.note import NoteError, open_checkpoint

    ledger = statement.get("ledger") if isinstance(statement.get("ledger"), dict) else {}
    proof = receipt.get("log")
    if not isinstance(proof, dict):
        raise ReceiptInvalid("the receipt carries no transparency-log proof (receipts from before the log "
                             "have none): its entry cannot be shown to be in the log")
    try:
        checkpoint = open_checkpoint(proof.get("checkpoint"), log_key)
    except NoteError as exc:
        raise ReceiptInvalid(f"the receipt's checkpoint: {exc}") from None
    try:
        index = ledger["leaf_index"]
        leaf = merkle.leaf_hash(entry_leaf(ledger["entry_hash"], ledger["kgrams_sha256"]))
        hashes = [base64.b64decode(h, validate=True) for h in proof.get("inclusion_proof")]
        if not isinstance(index, int) or isinstance(index, bool) or proof.get("leaf_index") != index:
            raise ValueError
    except (KeyError, TypeError, ValueError):
        raise ReceiptInvalid("the receipt's ledger position or inclusion proof is malformed") from None
    try:
        merkle.verify_inclusion(index, checkpoint.size, leaf, hashes, checkpoint.root)
    except merkle.ProofError as exc:
        raise ReceiptInvalid(f"the receipt's entry is not in the log: {exc}") from None
    return checkpoint


def verify_tlog_proof(receipt: dict[str, Any], statement: dict[str, Any], policy: Any) -> Any:
    """The receipt's ``log.tlog_proof`` (c2sp.org/tlog-proof@v1) proves its entry's leaf at its
    ``ledger.leaf_index`` under ``policy`` (ledger.log.policy: a listed log's signature and the
    witness quorum), offline. Returns (checkpoint, witnesses that cosigned it)."""
    from ledger.log import merkle
    from ledger.log.leaves import entry_leaf
    from ledger.log.proof import TlogProofError, verify_proof

    ledger = statement.get("ledger") if isinstance(statement.get("ledger"), dict) else {}
    text = receipt.get("log", {}).get("tlog_proof") if isinstance(receipt.get("log"), dict) else None
    if not isinstance(text, str):
        raise ReceiptInvalid("the receipt carries no tlog-proof (c2sp.org/tlog-proof@v1): fetch it again from "
                             "GET /v1/generations/{id}/receipt once the log published a witnessed checkpoint")
    try:
        leaf = merkle.leaf_hash(entry_leaf(ledger["entry_hash"], ledger["kgrams_sha256"]))
    except (KeyError, TypeError, ValueError):
        raise ReceiptInvalid("the receipt's ledger entry is malformed") from None
    try:
        checkpoint, cosigned, proof = verify_proof(text, leaf, policy)
    except TlogProofError as exc:
        raise ReceiptInvalid(f"the receipt's tlog-proof: {exc}") from None
    if proof.index != ledger.get("leaf_index"):
        raise ReceiptInvalid("the receipt's tlog-proof is for another leaf than its ledger entry")
    return checkpoint, cosigned


def verify_receipt(receipt: Any, keys: Mapping[str, TrustedKey | Ed25519PublicKey], *, text: str | None = None,
                   log_key: Any = None) -> dict[str, Any]:
    """Verify a generation receipt: its signature (and, with a log-checked key set, the
    key's window), that its entry is in the transparency log (with ``log_key``, or the key
    set's own), and, given ``text``, that the text is the one it attests (SHA-256 of its
    UTF-8 bytes)."""
    statement = verify_signed(receipt, keys, expected_type=RECEIPT_TYPE)
    log_key = log_key if log_key is not None else getattr(keys, "log_key", None)
    signer = keys.get(receipt["signature"].get("kid"))
    if log_key is None and isinstance(signer, TrustedKey) and signer.revoked_at is not None:
        raise ReceiptInvalid(f"signed by revoked key {signer.kid}: only the log can vouch for it, and no log key "
                             "was given")
    if log_key is not None:
        verify_log_proof(receipt, statement, log_key)
    if text is not None:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if digest != statement.get("output_sha256"):
            raise ReceiptInvalid("the text does not match the receipt: its SHA-256 differs from output_sha256")
    return statement
