"""The statements the gateway signs: generation receipts and detection reports.

The encoding and the signature are :mod:`ledger.receipts`'; the report format is
:mod:`ledger.reports`'; this module decides what a statement says. A receipt attests one
ledger entry (the generation's ``finished`` entry); a detection report says what was
checked, as the EU AI Act Art. 50 Code of Practice asks: the text's and token ids' hashes,
the detector (version and configuration hash), the time, whose keys and how many, the
threshold and settings, the verdict naming its threshold, and the result as shown.
"""

from __future__ import annotations

import hashlib
import math
from datetime import datetime, timezone
from typing import Any, Sequence

from detector.detect import DetectorConfig
from detector.result import Candidate
from ledger import kgrams
from ledger.chain import hash_token_ids, timestamp
from ledger.entries import GenerationEntry
from ledger.receipts import RECEIPT_TYPE, REPORT_TYPE
from ledger.reports import LENIENT_ABOVE, REPORT_VERSION, SCOPES, detector_identity, verdict_of
from service.ledger_evidence import MAX_TESTED, SHARED_LEVEL

DETECTOR_VERSION = "hallmark-detector/3"
"""/3: spans share 0.05 (was 0.25), the runs-merged form (issue 30)."""
"""Named in every detection report; raised when the detector's computation changes (2:
span boundaries refined against the span's own mean, and starting at the first scored
token's context)."""


def ledger_match(entry: GenerationEntry) -> dict[str, Any]:
    """A detection result's ``ledger_matches`` item: a recorded generation whose output is
    exactly the text (the same shape from the API and ``hallmark detect``)."""
    out = {"generation_id": entry.id, "tenant": entry.tenant, "key_id": entry.key_id,
           "key_version": entry.key_version, "key_state": entry.key_state, "engine": entry.engine,
           "model": entry.model, "watermarked_tokens": entry.watermarked_tokens, "status": entry.status,
           "ledger": {"seq": entry.seq, "entry_hash": entry.entry_hash}, "created_at": entry.created_at.isoformat()}
    salt = (entry.details or {}).get("salt")
    if salt is not None:  # a `diverse` key's generation: the salt it ran under (ledger.read.SALT_DETAIL)
        out["salt"] = salt
    return out


RECEIPT_VERSION = 2


def receipt_statement(entry: GenerationEntry, *, fingerprint: str | None) -> dict[str, Any]:
    """The receipt of ``entry`` (format: :mod:`ledger.receipts`): version 2 names the entry's
    k-gram commitment and its leaf in the transparency log, when the write that returned
    ``entry`` logged it."""
    share = round(entry.watermarked_tokens / entry.output_tokens, 6) if entry.output_tokens else 0.0
    key = None
    if entry.key_id is not None:
        key = {"key_id": entry.key_id, "version": entry.key_version, "fingerprint": fingerprint,
               "state": entry.key_state}
        if entry.spec is not None and entry.spec.key_bits != 64:  # as detector.result.KeyInfo states it
            key["prf"], key["key_bits"] = entry.spec.prf, entry.spec.key_bits
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


def report_settings(config: DetectorConfig, *, normalize: bool | None) -> dict[str, Any]:
    """The ``settings`` a detection report states: the threshold, every setting of the
    detector's config, text normalisation (None for token ids) and the ledger basis's
    fixed parameters. Their hash is the detector's configuration hash."""
    return {"threshold": config.threshold, "statistic": config.dual_statistic, "test": config.test,
            "spans": config.spans, "span_min_length": config.span_min_length, "normalize": normalize,
            "ledger": {"kgram_length": kgrams.K, "shared_tokens_level": SHARED_LEVEL,
                       "matches_tested": MAX_TESTED}}


def report_scope(candidates: Sequence[Candidate], *, keys_of: str, tenant: str | None) -> dict[str, Any]:
    """The ``scope`` of a detection report: whose keys were tested (``tenant`` with its
    name, ``all_tenants`` or ``public``) and how many (tenants, keys). A `diverse` key tested
    under each of its salts is one candidate a salt and one key here: the report said "the 16
    keys of tenant demo" of one key (issue 34, item 5)."""
    if keys_of not in SCOPES:
        raise ValueError(f"keys_of must be one of {SCOPES}")
    tenants = {c.info.tenant for c in candidates if c.info.tenant is not None}
    keys = {(c.info.tenant, c.info.key_id, c.info.version) if c.info.key_id else c.info.fingerprint for c in candidates}
    return {"keys_of": keys_of, "tenant": tenant if keys_of == "tenant" else None,
            "tenants": len(tenants), "keys": len(keys)}


REPORT_OMITS = ("report", "evidence", "per_key")
"""Parts of a detection response a report does not repeat: the report itself, per-token
evidence (up to 5,000 tokens) and the per-key table (every key of a provider, for an
all-tenant scan); ``scope`` states how many keys were tested."""


def report_statement(shown: dict[str, Any], *, text: str | None, token_ids: Sequence[int],
                     scope: dict[str, Any], settings: dict[str, Any],
                     now: datetime | None = None) -> dict[str, Any]:
    """The detection report (format: :mod:`ledger.reports`) of a ``/v1/detect`` result as
    its caller is shown it.

    ``shown``: the response body the caller gets (any access tier's shape; it needs
    ``watermarked``), signed as ``result`` less :data:`REPORT_OMITS`: nothing it withholds
    is added (no p-value digits if it has none). ``text``: the text as sent, or None for
    token ids. ``token_ids``: the ids the verdict rests on (for a text, the tokens of the
    form scored). ``scope``: :func:`report_scope`. ``settings``: :func:`report_settings`
    (its ``threshold`` is the one the verdict names). ``now``: the report's time (UTC).
    """
    now = now or datetime.now(timezone.utc)
    threshold = float(settings["threshold"])
    result = _jsonable({k: v for k, v in shown.items() if k not in REPORT_OMITS})
    verdict = verdict_of(bool(shown.get("watermarked")), threshold)
    basis = ["watermark"] if verdict == "watermarked" else []
    if "ledger" in (shown.get("basis") or ()):
        basis.append("ledger")
    return {
        "type": REPORT_TYPE, "version": REPORT_VERSION,
        "created_at": timestamp(now),
        "subject": {"input": "text" if text is not None else "token_ids",
                    "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest() if text is not None else None,
                    "token_ids_sha256": hash_token_ids(list(token_ids)), "tokens": len(token_ids)},
        "detector": _detector_identity(settings),
        "settings": settings,
        "scope": scope,
        "verdict": verdict,
        "verdict_text": _verdict_text(verdict, threshold, scope, shown),
        "basis": basis,
        "result": result,
    }


_IDENTITIES: dict[tuple, dict[str, str]] = {}
_IDENTITIES_MAX = 256


def _detector_identity(settings: dict[str, Any]) -> dict[str, str]:
    """:func:`ledger.reports.detector_identity` of this detector and ``settings``, hashed once
    per distinct settings (a request's settings come from a handful of fields: the same few
    values every time, and their hash was a canonical JSON encoding and a SHA-256 each request)."""
    key = _frozen(settings)
    found = _IDENTITIES.get(key)
    if found is None:
        if len(_IDENTITIES) >= _IDENTITIES_MAX:
            _IDENTITIES.clear()
        found = _IDENTITIES[key] = detector_identity(DETECTOR_VERSION, settings)
    return dict(found)


def _frozen(value: Any) -> Any:
    """``value`` as a hashable key that tells apart what JSON tells apart (1, 1.0 and True;
    0.0 and -0.0)."""
    if isinstance(value, float):
        return float, repr(value)
    if isinstance(value, dict):
        return (dict, tuple((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (list, tuple(_frozen(v) for v in value))
    return type(value), value


def _scope_words(scope: dict[str, Any]) -> str:
    n = scope.get("keys", 0)
    keys = f"{n} key{'' if n == 1 else 's'}"
    if scope.get("keys_of") == "tenant":
        return f"the {keys} of tenant {scope.get('tenant')}"
    if scope.get("keys_of") == "public":
        return f"the {keys} of the public key set"
    tenants = scope.get("tenants", 0)
    return f"the {keys} of every tenant ({tenants} tenant{'' if tenants == 1 else 's'})"


def _verdict_text(verdict: str, threshold: float, scope: dict[str, Any], shown: dict[str, Any]) -> str:
    """The verdict in words: always the threshold and whose keys were tested, never a
    p-value (an access tier may withhold its digits)."""
    keys = _scope_words(scope)
    if verdict == "watermarked":
        words = f"watermarked: passes the threshold {threshold:g} under one of {keys}"
    elif verdict == "passes_lenient_threshold":
        words = (f"passes the threshold {threshold:g} under one of {keys}; a threshold above "
                 f"{LENIENT_ABOVE:g} is not evidence of a watermark")
    else:
        words = (f"not watermarked at threshold {threshold:g}: no evidence of the watermark of {keys} "
                 f"(not proof that a person wrote it)")
    exact = [m.get("generation_id") for m in shown.get("ledger_matches") or () if isinstance(m, dict)]
    edited = [m.get("generation_id") for m in shown.get("kgram_matches") or ()
              if isinstance(m, dict) and m.get("passes") and m.get("generation_id") not in exact]
    if exact:
        words += f"; the ledger records generation {exact[0]} with exactly this text"
    elif edited:
        words += f"; the ledger records generation {edited[0]}, of which this text is an edited copy"
    return words


def _jsonable(value: Any) -> Any:
    """``value`` as JSON would carry it (tuples as lists), with non-finite numbers as null
    (canonical JSON refuses them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
