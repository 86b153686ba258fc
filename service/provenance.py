"""The statements the gateway signs: generation receipts and detection reports.

The encoding and the signature are :mod:`keys.receipts`'; this module decides what a
statement says. A receipt attests one ledger entry (the generation's ``finished`` entry);
a detection report says what a verdict rests on, as the EU AI Act Art. 50 Code of Practice
asks: the watermark statistic and its p-value, how many keys were tested under which
multiple-testing correction, and the ledger records whose output is exactly this text.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import Any

from keys.chain import timestamp
from keys.ledger import GenerationEntry
from keys.receipts import RECEIPT_TYPE, REPORT_TYPE

DETECTOR_VERSION = "hallmark-detector/1"


def ledger_match(entry: GenerationEntry) -> dict[str, Any]:
    """A detection result's ``ledger_matches`` item: a recorded generation whose output is
    exactly the text (the same shape from the API and ``hallmark detect``)."""
    return {"generation_id": entry.id, "tenant": entry.tenant, "key_id": entry.key_id,
            "key_version": entry.key_version, "key_state": entry.key_state, "engine": entry.engine,
            "model": entry.model, "watermarked_tokens": entry.watermarked_tokens, "status": entry.status,
            "ledger": {"seq": entry.seq, "entry_hash": entry.entry_hash}, "created_at": entry.created_at.isoformat()}


RECEIPT_VERSION = 2


def receipt_statement(entry: GenerationEntry, *, fingerprint: str | None) -> dict[str, Any]:
    """The receipt of ``entry`` (format: :mod:`keys.receipts`): version 2 names the entry's
    k-gram commitment and its leaf in the transparency log, when the write that returned
    ``entry`` logged it."""
    share = round(entry.watermarked_tokens / entry.output_tokens, 6) if entry.output_tokens else 0.0
    key = None
    if entry.key_id is not None:
        key = {"key_id": entry.key_id, "version": entry.key_version, "fingerprint": fingerprint,
               "state": entry.key_state}
    return {
        "type": RECEIPT_TYPE, "version": RECEIPT_VERSION,
        "generation_id": entry.id, "tenant_id": entry.tenant_id, "tenant": entry.tenant,
        "key": key, "spec": entry.spec.public_dict() if entry.spec else None,
        "model": entry.model, "engine": entry.engine,
        "created_at": timestamp(entry.created_at),
        "finished_at": timestamp(entry.updated_at or entry.created_at),
        "finish_reason": entry.finish_reason,
        "output_sha256": entry.output_sha256, "token_ids_sha256": entry.token_ids_sha256,
        "output_tokens": entry.output_tokens, "watermarked_tokens": entry.watermarked_tokens,
        "watermarked_share": share, "unwatermarked_reason": entry.unwatermarked_reason,
        "ledger": {"seq": entry.seq, "entry_hash": entry.entry_hash, "kgrams_sha256": entry.kgrams_sha256,
                   "leaf_index": entry.log.leaf_index if entry.log is not None else None},
    }


def _finite(value: Any) -> Any:
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    return value


def report_statement(result: dict[str, Any], *, text: str | None, token_ids: list[int],
                     now: datetime | None = None) -> dict[str, Any]:
    """The detection report of a ``/v1/detect`` result (format: :mod:`keys.receipts`)."""
    now = now or datetime.now(timezone.utc)
    key = result.get("key")
    ids = hashlib.sha256(b"".join(int(t).to_bytes(4, "big") for t in token_ids)).hexdigest()
    basis = result.get("basis") if isinstance(result.get("basis"), dict) else None
    return {
        "type": REPORT_TYPE, "version": 1,
        "verdict": "watermarked" if result.get("watermarked") else "not_watermarked",
        "rests_on": {
            "watermark": {
                "statistic": ((basis or {}).get("statistic") or result.get("statistic")
                              or ((result.get("per_key") or [{}])[0] or {}).get("statistic")),
                "p_value": _finite(result.get("p_value")),
                "log10_p_value": _finite(result.get("log10_p_value")),
                "threshold": _finite(result.get("threshold")),
                "scored_tokens": result.get("scored_tokens"), "total_tokens": result.get("total_tokens"),
                "keys_tested": result.get("keys_tested"),
                "correction": result.get("correction") or "sidak over keys tested; holm per key",
                "key": ({"tenant": key.get("tenant"), "key_id": key.get("key_id"), "version": key.get("version"),
                         "state": key.get("state"), "fingerprint": key.get("fingerprint")} if key else None),
            },
            "ledger": [{"generation_id": m["generation_id"], "tenant": m.get("tenant"),
                        "seq": (m.get("ledger") or {}).get("seq"),
                        "entry_hash": (m.get("ledger") or {}).get("entry_hash")}
                       for m in result.get("ledger_matches", [])],
        },
        "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest() if text is not None else None,
        "token_ids_sha256": ids,
        "detector_version": DETECTOR_VERSION,
        "created_at": timestamp(now),
    }
