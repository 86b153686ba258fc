"""What the transparency log's leaves are: pure encodings, shared by the log (ledger.log.tlog)
and the offline verifiers (ledger.receipts, ledger.keyset).

A leaf's data (the input to RFC 9162's leaf hash, SHA-256(0x00 || data)) is one of:

- a ledger entry: ``0x01 || entry_hash (32 bytes) || kgrams_sha256 (32 bytes)``, where
  ``entry_hash`` is the entry's canonical hash (ledger.chain) and ``kgrams_sha256`` commits to
  the set of k-gram digests recorded with it under their scheme (:func:`kgram_commitment`;
  the empty set's for every entry but a watermarked generation's ``finished`` one). A receipt carries both, so
  its holder recomputes the leaf.
- a signing-key event: ``0x02 || canonical JSON of the event`` (:func:`key_event`): the
  key's id, public key and validity window as of that event. So a checkpoint commits to the
  signing-key set, and a key that no leaf names is not Hallmark's.

Leaves hold hashes and public keys only: no text, no tenant name.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, Iterable

from ledger.chain import canonical_json, timestamp

ENTRY, SIGNING_KEY = 0x01, 0x02
KEY_EVENT_TYPE = "hallmark.signing_key"
KEY_EVENTS = ("created", "retired", "revoked", "adopted")
EMPTY_KGRAMS = hashlib.sha256(b"").hexdigest()
KGRAM_SCHEMES = (1, 2)
"""ledger.kgrams' digest schemes: 1, keyed per watermark key; 2, one store-wide k-gram key."""
_V2_LABEL = b"hallmark/kgrams/v2"
"""Prefixed to scheme 2's digests (18 bytes: the hashed input's length is 2 mod 8, never a
multiple of 8 as every scheme 1 input is, so no set of one scheme commits like a set of the other)."""
MIXED_KGRAMS = "mixed"
"""What :func:`kgram_rows_commitment` gives for rows of several schemes: never a leaf's
commitment (not hex), as the gateway writes a generation's rows under one scheme."""


def kgram_commitment(digests: Iterable[int], scheme: int = 1) -> str:
    """hex SHA-256 of the distinct k-gram digests, ascending, each as 8 bytes big-endian;
    scheme 2's prefixed with its label (domain separation: a set recorded under one scheme
    cannot be passed off as the other's). The empty set commits as :data:`EMPTY_KGRAMS` in
    both (no row to move between them)."""
    if scheme not in KGRAM_SCHEMES:
        raise ValueError(f"unknown k-gram scheme {scheme!r}")
    body = b"".join(int(d).to_bytes(8, "big") for d in sorted(set(digests)))
    if scheme == 2 and body:
        body = _V2_LABEL + body
    return hashlib.sha256(body).hexdigest()


def kgram_rows_commitment(rows: Iterable[tuple[int, int]]) -> str:
    """:func:`kgram_commitment` of stored rows, (scheme, digest) each: the set under its one
    scheme, :data:`MIXED_KGRAMS` for rows of several (or an unknown) scheme."""
    rows = list(rows)
    schemes = {int(scheme) for scheme, _ in rows}
    if len(schemes) > 1 or not schemes <= set(KGRAM_SCHEMES):
        return MIXED_KGRAMS
    return kgram_commitment((d for _, d in rows), schemes.pop() if schemes else 1)


def kgram_array_commitment(schemes, digests) -> str:
    """:func:`kgram_rows_commitment` of rows given as two int64 numpy arrays (scheme, digest
    per row): the same string, the digests sorted and packed by numpy (a detection checks
    every matched generation's ~one row per output token against its leaf)."""
    import numpy as np

    if len(schemes) and (int(schemes.min()) != int(schemes.max()) or int(schemes[0]) not in KGRAM_SCHEMES):
        return MIXED_KGRAMS
    if len(digests) and int(digests.min()) < 0:  # not a digest: as the row-wise form answers it
        return kgram_rows_commitment(zip(schemes.tolist(), digests.tolist()))
    body = np.unique(np.asarray(digests, dtype=np.int64)).astype(">u8").tobytes()
    if len(schemes) and int(schemes[0]) == 2 and body:
        body = _V2_LABEL + body
    return hashlib.sha256(body).hexdigest()


def entry_leaf(entry_hash: str, kgrams_sha256: str) -> bytes:
    return bytes([ENTRY]) + bytes.fromhex(entry_hash) + bytes.fromhex(kgrams_sha256)


def key_event(*, kid: str, public_key: str, event: str, at: datetime, not_before: datetime,
              not_after: datetime | None, revoked_at: datetime | None, alg: str = "Ed25519") -> dict[str, Any]:
    """A signing-key event as its leaf records it (``public_key``: base64url, as in the key set;
    ``alg``: ``Ed25519``, or ``Ed25519+ML-DSA-44`` whose public key is both halves, ledger.sigalg)."""
    if event not in KEY_EVENTS:
        raise ValueError(f"unknown signing-key event {event!r}")
    return {"type": KEY_EVENT_TYPE, "version": 1, "kid": kid, "alg": alg, "public_key": public_key,
            "event": event, "at": timestamp(at), "not_before": timestamp(not_before),
            "not_after": timestamp(not_after) if not_after else None,
            "revoked_at": timestamp(revoked_at) if revoked_at else None}


def key_event_leaf(event: dict[str, Any]) -> bytes:
    return bytes([SIGNING_KEY]) + canonical_json(event)
