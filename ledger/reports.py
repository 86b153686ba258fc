"""Signed detection reports (format v2): what a detection checked, and how to verify one.

A report is a signed document like a receipt (:mod:`ledger.receipts`: the same Ed25519, or
Ed25519 + ML-DSA-44, signature over ``hallmark.detection_report/v2\\n`` || canonical JSON, the same key set).
Its statement says what was checked, as the EU AI Act Code of Practice asks of a
detection result (the content's hash, the detector's identity, a timestamp, the scope and
settings, and whether the result rests on a watermark, on the ledger, or both)::

    {"type": "hallmark.detection_report", "version": 2,
     "created_at": "2026-12-02T18:45:01.123456Z",      # when the detection ran (UTC)
     "subject": {"input": "text" | "token_ids",
                 "text_sha256": hex | null,            # SHA-256 of the UTF-8 text as sent (null for token ids)
                 "token_ids_sha256": hex,              # of the ids scored, 4 bytes big-endian each
                 "tokens": int},                       # how many ids that is
     "detector": {"version": "hallmark-detector/3",
                  "config_sha256": hex,                # SHA-256 of canonical_json(settings)
                  "id": "hallmark-detector/3+<first 16 hex digits of config_sha256>"},
     "settings": {"threshold": float, ...},            # the threshold and every detector setting
     "scope": {"keys_of": "tenant" | "all_tenants" | "public",
               "tenant": str | null,                   # the tenant whose keys, for "tenant"
               "tenants": int, "keys": int},           # how many tenants' keys, how many keys
     "verdict": "watermarked" | "not_watermarked" | "passes_lenient_threshold",
     "verdict_text": str,                              # the verdict in words, naming threshold and scope
     "basis": ["watermark" | "ledger", ...],           # what the verdict and the ledger evidence rest on
     "result": {...}}                                  # the result as the caller was shown it

``verdict`` is ``watermarked`` only when the text passed a threshold of at most
:data:`LENIENT_ABOVE` (1e-3); a text that passed a more lenient threshold (a caller may ask
for anything below 1) is ``passes_lenient_threshold``, never a bare "watermarked", and
``verdict_text`` names the threshold it passed. ``result`` is the response body the caller
saw, less the per-token ``evidence``, the ``per_key`` table and the report itself, with
non-finite numbers as null: a report never states more than its reader was shown (an
access tier that withholds p-value digits signs no digits). ``basis`` holds ``watermark``
only with the ``watermarked`` verdict, and ``ledger`` when ``result`` cites an exact copy
or a k-gram match that passes.

Verifying (:func:`verify_report`, ``hallmark report verify``, the page's ``verify.js``):
the signature under a published key whose id is the hash of its public key, the type and
version, that ``detector`` is the hash of ``settings``, that the verdict agrees with the
threshold, and, given the text or the token ids, that their SHA-256 is the one signed.
Version 1 reports (before this format: no subject, scope or settings) verify as signed
documents and are reported as version 1 (:attr:`ReportCheck.version`).

Only ``cryptography`` and the standard library: it runs in a fresh process with no store.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from ledger.chain import canonical_json, hash_token_ids
from ledger.receipts import REPORT_TYPE, ReceiptInvalid, verify_signed

REPORT_VERSION = 2
LENIENT_ABOVE = 1e-3
"""A threshold above this is not evidence of a watermark: such a pass is signed as
``passes_lenient_threshold``, never ``watermarked``."""
VERDICTS = ("watermarked", "not_watermarked", "passes_lenient_threshold", "not_tested", "key_revoked")
"""``not_tested``: nothing was tested (a public check of a text under its minimum length);
``key_revoked``: the text carries the watermark of a key revoked as compromised, which no
longer shows where it came from (neither vouches: neither has ``watermark`` in its basis)."""
SCOPES = ("tenant", "all_tenants", "public", "provider")
"""``provider``: every key of the provider, their number withheld (the public tier's reports
carry no count of the provider's tenants or keys)."""


class ReportInvalid(ReceiptInvalid):
    """A report does not verify, or does not match the text given; the message is the
    one-line reason."""


def config_sha256(settings: dict[str, Any]) -> str:
    """hex SHA-256 of the canonical JSON of the detector settings."""
    return hashlib.sha256(canonical_json(settings)).hexdigest()


def detector_identity(version: str, settings: dict[str, Any]) -> dict[str, str]:
    """The ``detector`` object: version, configuration hash and the id joining them."""
    digest = config_sha256(settings)
    return {"version": version, "config_sha256": digest, "id": f"{version}+{digest[:16]}"}


def verdict_of(watermarked: bool, threshold: float) -> str:
    if not watermarked:
        return "not_watermarked"
    return "watermarked" if threshold <= LENIENT_ABOVE else "passes_lenient_threshold"


@dataclass(frozen=True)
class ReportCheck:
    """A verified report: its statement, its version, and which of the given inputs matched."""

    statement: dict[str, Any]
    version: int
    text_matches: bool | None = None
    token_ids_match: bool | None = None


def verify_report(document: Any, keys: dict[str, Any], *, text: str | None = None,
                  token_ids: list[int] | None = None, max_p: float | None = None) -> ReportCheck:
    """Verify a detection report's signature and content (see the module docstring) and,
    given ``text`` or ``token_ids``, that the report is about them; :class:`ReportInvalid`
    (a :class:`ledger.receipts.ReceiptInvalid`) with a one-line reason otherwise.
    ``max_p``: the verifier's own policy maximum: a ``watermarked`` verdict at a threshold
    above it is refused (the threshold bounds the p-value that passed it)."""
    statement = verify_signed(document, keys, expected_type=REPORT_TYPE)
    version = statement.get("version")
    if version == 1:
        subject = {"text_sha256": statement.get("text_sha256"), "token_ids_sha256": statement.get("token_ids_sha256")}
    elif version == REPORT_VERSION:
        _check_v2(statement)
        subject = statement["subject"]
    else:
        raise ReportInvalid(f"unsupported report version {version!r}; this verifier knows 1 and {REPORT_VERSION}")
    text_matches = token_ids_match = None
    if text is not None:
        if subject.get("text_sha256") is None:
            raise ReportInvalid("the report is about token ids, not a text: check it with the token ids")
        if hashlib.sha256(text.encode("utf-8")).hexdigest() != subject["text_sha256"]:
            raise ReportInvalid("the text does not match the report: its SHA-256 differs from text_sha256")
        text_matches = True
    if token_ids is not None:
        if hash_token_ids(token_ids) != subject.get("token_ids_sha256"):
            raise ReportInvalid("the token ids do not match the report: their SHA-256 differs from token_ids_sha256")
        token_ids_match = True
    if max_p is not None and statement.get("verdict") == "watermarked":
        threshold = (statement.get("settings") or {}).get("threshold")
        if not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or threshold > max_p:
            raise ReportInvalid(f"the report says watermarked at threshold {threshold!r}, above the maximum "
                                f"{max_p:g} asked for")
    return ReportCheck(statement, version, text_matches, token_ids_match)


def verify_report_proofs(document: dict[str, Any], statement: dict[str, Any], policy: Any) -> dict[str, Any]:
    """Each ledger entry the report cites (``result.ledger_matches``) is proved in the log by
    one of the report's ``log.tlog_proofs`` (c2sp.org/tlog-proof@v1) under ``policy``
    (ledger.log.policy: a listed log's signature, the witness quorum), offline. A proof's
    ``extra`` is the leaf's data, ``0x01 || entry_hash || kgrams_sha256``: its entry hash must
    be the cited one. Returns generation id -> (leaf index, tree size, witnesses)."""
    from ledger.log import merkle
    from ledger.log.proof import TlogProofError, parse_proof, verify_proof

    result = statement.get("result") if isinstance(statement.get("result"), dict) else {}
    cited = {m["ledger"]["entry_hash"]: m.get("generation_id") for m in result.get("ledger_matches") or ()
             if isinstance(m, dict) and isinstance(m.get("ledger"), dict) and isinstance(m["ledger"].get("entry_hash"),
                                                                                         str)}
    proofs = document.get("log", {}).get("tlog_proofs") if isinstance(document.get("log"), dict) else None
    if cited and not isinstance(proofs, list):
        raise ReportInvalid("the report cites ledger entries but carries no tlog-proof of them (a report signed "
                            "before the log published a checkpoint covering them)")
    proved: dict[str, Any] = {}
    for text in proofs or ():
        try:
            extra = parse_proof(text).extra or b""
            if len(extra) != 65 or extra[0] != 0x01:
                raise TlogProofError("its extra data is not a ledger entry's leaf")
            entry_hash = extra[1:33].hex()
            if entry_hash not in cited:
                continue
            checkpoint, cosigned, proof = verify_proof(text, merkle.leaf_hash(extra), policy)
        except TlogProofError as exc:
            raise ReportInvalid(f"a tlog-proof of the report: {exc}") from None
        proved[cited[entry_hash]] = {"leaf_index": proof.index, "tree_size": checkpoint.size,
                                     "cosigned_by": sorted(cosigned)}
    missing = [g for g in cited.values() if g not in proved]
    if missing:
        raise ReportInvalid(f"no tlog-proof for the cited entry of generation {missing[0]}")
    return proved


def _check_v2(statement: dict[str, Any]) -> None:
    """The consistency a signer of format v2 guarantees (a signature alone does not show
    that the signer followed the format)."""
    for name in ("subject", "detector", "settings", "scope", "result"):
        if not isinstance(statement.get(name), dict):
            raise ReportInvalid(f"the report has no {name!r} object")
    settings, detector, scope = statement["settings"], statement["detector"], statement["scope"]
    expected = detector_identity(str(detector.get("version")), settings)
    if detector.get("config_sha256") != expected["config_sha256"] or detector.get("id") != expected["id"]:
        raise ReportInvalid("the detector id is not the hash of the settings the report states")
    threshold = settings.get("threshold")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
        raise ReportInvalid("the report states no threshold in (0, 1)")
    verdict = statement.get("verdict")
    if verdict not in VERDICTS:
        raise ReportInvalid(f"unknown verdict {verdict!r}")
    if verdict == "watermarked" and threshold > LENIENT_ABOVE:
        raise ReportInvalid(f"a 'watermarked' verdict at threshold {threshold!r}, above {LENIENT_ABOVE}")
    basis = statement.get("basis")
    if not isinstance(basis, list) or ("watermark" in basis) != (verdict == "watermarked"):
        raise ReportInvalid("the report's basis does not match its verdict")
    if scope.get("keys_of") not in SCOPES or (scope.get("keys_of") != "provider" and not isinstance(scope.get("keys"), int)):
        raise ReportInvalid("the report does not say whose keys were tested and how many")
    if not isinstance(statement.get("verdict_text"), str) or not isinstance(statement.get("created_at"), str):
        raise ReportInvalid("the report has no verdict_text or created_at")
