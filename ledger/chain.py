"""The ledger's hash chain: canonical encoding of an entry and its hash (format v1).

Each tenant's ledger entries form one chain: entry ``seq`` = 1, 2, 3, ... and
``prev_hash`` = the previous entry's ``entry_hash`` (64 zeros for seq 1). The hash of an
entry is::

    entry_hash = hex(SHA-256(b"hallmark-ledger-v1\\n" || canonical_json(fields)))

where ``fields`` is the JSON object of every column except the database's own row id and
``entry_hash`` itself::

    tenant_id, seq, prev_hash, generation_id, kind, created_at, writer, key_id,
    key_version, key_state, engine, model, spec, prompt_tokens, output_tokens,
    watermarked_tokens, unwatermarked_reason, output_sha256, token_ids_sha256,
    finish_reason, details

``created_at`` is ISO 8601 UTC with microseconds and a ``Z`` (``2026-12-02T18:45:01.123456Z``);
absent values are JSON ``null``. ``canonical_json`` is JSON with keys sorted at every
level, no whitespace (separators ``,`` and ``:``), UTF-8 without ``\\u`` escapes for
non-ASCII, integers as integers, floats in their shortest round-trip form (Python's
``repr``), NaN and infinities refused. Receipts (:mod:`ledger.receipts`) use the same
canonical JSON.

Why per tenant, not one global chain: a tenant's auditor verifies the tenant's own chain
(``hallmark ledger verify --tenant T``) without seeing other tenants' entries, tenants
never serialise on one lock, and moving an entry between tenants breaks both chains
(``tenant_id`` is hashed). What a chain cannot show alone is a cut-off tail (the newest
entries deleted): every receipt carries its entry's ``seq`` and ``entry_hash``, and
``ledger verify`` prints each chain's head, so a receipt or a recorded head proves the
entries up to it existed.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from datetime import datetime, timezone
from typing import Any

CHAIN_LABEL = b"hallmark-ledger-v1\n"
GENESIS_HASH = "0" * 64
HASHED_FIELDS: tuple[str, ...] = (
    "tenant_id", "seq", "prev_hash", "generation_id", "kind", "created_at", "writer", "key_id",
    "key_version", "key_state", "engine", "model", "spec", "prompt_tokens", "output_tokens",
    "watermarked_tokens", "unwatermarked_reason", "output_sha256", "token_ids_sha256",
    "finish_reason", "details",
)


def _check_finite(value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("canonical JSON refuses NaN and infinities")
    if isinstance(value, dict):
        for item in value.values():
            _check_finite(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_finite(item)


def canonical_json(value: Any) -> bytes:
    """The canonical bytes of a JSON value (see the module docstring)."""
    try:  # allow_nan=False refuses the same floats; the walk below only names the refusal
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8")
    except ValueError:
        _check_finite(value)
        raise


def timestamp(value: datetime) -> str:
    """A UTC instant as the chain and receipts write it: ``YYYY-MM-DDTHH:MM:SS.ffffffZ``."""
    if value.tzinfo is None:
        raise ValueError("naive datetime; the chain needs an aware UTC time")
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def entry_fields(row: Any) -> dict[str, Any]:
    """The hashed fields of a ledger row (anything with those attributes)."""
    fields = {name: getattr(row, name) for name in HASHED_FIELDS}
    fields["created_at"] = timestamp(fields["created_at"])
    return fields


def entry_hash(fields: dict[str, Any]) -> str:
    """hex SHA-256 of the label and the canonical JSON of ``fields``."""
    return hashlib.sha256(CHAIN_LABEL + canonical_json(fields)).hexdigest()


def hash_token_ids(token_ids: tuple[int, ...] | list[int]) -> str:
    """hex SHA-256 of the token ids, each as 4 bytes big-endian (ids are < 2**32)."""
    ids = [int(token) for token in token_ids]
    try:  # one pack: the same bytes as each id's to_bytes(4, "big")
        return hashlib.sha256(struct.pack(f">{len(ids)}I", *ids)).hexdigest()
    except struct.error:  # an id outside [0, 2**32): the error each id's own conversion gives
        digest = hashlib.sha256()
        for token in ids:
            digest.update(token.to_bytes(4, "big"))
        return digest.hexdigest()
