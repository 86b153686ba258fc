"""Signed statements: generation receipts and detection reports (Ed25519), verifiable offline.

A signed document is ``{"statement": {...}, "signature": {"alg": "Ed25519", "kid": ...,
"sig": ...}}``. The signature covers exactly::

    f"{statement['type']}/v{statement['version']}\\n".encode() || canonical_json(statement)

with :func:`keys.chain.canonical_json` (keys sorted, no whitespace, UTF-8, shortest
floats) and ``sig`` the 64-byte Ed25519 signature in unpadded base64url. ``kid`` names
the signing key in the public key set served at ``/.well-known/hallmark-keys.json``::

    {"keys": [{"kid": "sk_...", "alg": "Ed25519", "public_key": <32 bytes, base64url>,
               "state": "active" | "retired", "created_at": ..., "retired_at": ...}]}

Retired keys stay in the set, so old receipts keep verifying. A receipt's statement
(type ``hallmark.receipt``, version 1) holds: generation_id, tenant_id, tenant, key
(key_id, version, fingerprint, state; null when unwatermarked), spec, model, engine,
created_at and finished_at (the chain's timestamps), finish_reason, output_sha256 (SHA-256
of the UTF-8 text), token_ids_sha256 (SHA-256 of the ids as 4-byte big-endian),
output_tokens, watermarked_tokens, watermarked_share (watermarked/output tokens, 6
decimals), unwatermarked_reason and ledger (the tenant chain's seq and entry_hash of the
entry it attests). The golden files ``tests/data/receipt-v1*.json`` pin this encoding.
The key's fingerprint is an opaque string to the encoding: receipts signed before
fingerprints were cut to 24 bits (``watermark.key``) carry 16 hex digits, later ones 6;
both verify alike (the signature covers whatever string was signed).

This module needs only ``cryptography`` and the standard library: ``hallmark receipt
verify`` runs it in a fresh process with no database and no KEK.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from keys.chain import canonical_json

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


def public_keys(keyset: dict[str, Any]) -> dict[str, Ed25519PublicKey]:
    """Public keys by kid from a ``hallmark-keys.json`` document; a kid must match its key."""
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


def verify_signed(document: Any, keys: dict[str, Ed25519PublicKey], *, expected_type: str | None = None
                  ) -> dict[str, Any]:
    """The statement of a signed document whose signature verifies under ``keys``;
    :class:`ReceiptInvalid` with a one-line reason otherwise."""
    if not isinstance(document, dict) or not isinstance(document.get("statement"), dict) \
            or not isinstance(document.get("signature"), dict):
        raise ReceiptInvalid("not a signed Hallmark document (needs 'statement' and 'signature')")
    statement, signature = document["statement"], document["signature"]
    if expected_type is not None and statement.get("type") != expected_type:
        raise ReceiptInvalid(f"the statement is a {statement.get('type')!r}, not a {expected_type!r}")
    if signature.get("alg") != ALGORITHM:
        raise ReceiptInvalid(f"unsupported signature algorithm {signature.get('alg')!r}; expected Ed25519")
    kid = signature.get("kid")
    if kid not in keys:
        raise ReceiptInvalid(f"unknown signing key {kid!r}: not in the public key set")
    try:
        raw = unb64url(signature.get("sig"))
    except (ValueError, TypeError):
        raise ReceiptInvalid("the signature is not base64url") from None
    try:
        keys[kid].verify(raw, signed_bytes(statement))
    except (InvalidSignature, ValueError):
        raise ReceiptInvalid(f"bad signature: the statement was altered or not signed by {kid}") from None
    return statement


def verify_receipt(receipt: Any, keys: dict[str, Ed25519PublicKey], *, text: str | None = None) -> dict[str, Any]:
    """Verify a generation receipt's signature and, given ``text``, that the text is the
    one it attests (SHA-256 of its UTF-8 bytes)."""
    statement = verify_signed(receipt, keys, expected_type=RECEIPT_TYPE)
    if text is not None:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if digest != statement.get("output_sha256"):
            raise ReceiptInvalid("the text does not match the receipt: its SHA-256 differs from output_sha256")
    return statement
