"""A tier's answer from the core's full result, and its signed report.

The core (:func:`service.detection.detect`) returns full-precision numbers and signs them.
A tier that sees less gets a report re-signed over what it saw: the same subject, detector,
settings and scope, its own ``result`` (the answer less :data:`service.provenance.REPORT_OMITS`,
exactly as the page's verify.js compares it), a verdict text without p-value digits, and an
``access`` object naming the tier (and, for the public tier, the confidence band).
"""

from __future__ import annotations

import math
from typing import Any

from ledger.log.proof import parse_proof
from ledger.reports import verdict_of
from service.access.tiers import EXPERT, OPERATOR, PUBLIC, TENANT
from service.provenance import REPORT_OMITS, _jsonable, _verdict_text

BANDS = (("strong", -12.0), ("moderate", -6.0))
"""Public confidence bands by the global log10 p-value: strong at p <= 1e-12, moderate at
p <= 1e-6 (the default threshold), else none. Fixed: a caller learns one of three words,
which does not move while a probe's p-value wanders between 1e-6 and 1."""
TOO_SHORT = "too_short"
KEY_REVOKED = "key_revoked"
NOT_TESTED = "not_tested"

_P_KEYS = {"p_value"}
_DROPPED = {"score", "log10_p_sum", "log10_p_trgof", "log10_p_weighted"}
"""What the tenant tier drops: the statistic's value and the per-test p-values (each another
reading of the same text). The k-gram matches' counts stay (they cite the tenant's own ledger);
their log10 bounds are rounded like p."""


def band(log10_p: float) -> str:
    for name, ceiling in BANDS:
        if log10_p <= ceiling:
            return name
    return "none"


def power_of_ten(log10_p: float | None) -> int | None:
    """A log10 p-value rounded up to a whole number (the p-value is at most 10 to that):
    the verdict at any power-of-ten threshold stays what the full value says."""
    if log10_p is None or not isinstance(log10_p, (int, float)):
        return None
    if not math.isfinite(log10_p) or log10_p < -300:
        return -300
    return min(0, math.ceil(log10_p - 1e-12))


def _rounded(value: Any) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k in _DROPPED:
                continue
            if k.startswith("log10_"):
                out[k] = power_of_ten(v)
            elif k in _P_KEYS:
                exponent = power_of_ten(math.log10(v)) if isinstance(v, (int, float)) and v > 0 else -300
                out[k] = 10.0 ** exponent
            else:
                out[k] = _rounded(v)
        return out
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def tenant_answer(full: dict[str, Any], *, evidence: bool) -> dict[str, Any]:
    """The tenant tier: verdict, key, p to a whole power of ten where the text passes the
    threshold (else only the band ``p > threshold``: :func:`_above_threshold`), spans and the ledger's
    citations (generation ids, k-gram counts, whether each match passes; bounds to a power of
    ten); no scores, no per-test p-values; per-token evidence only with the ``evidence`` scope
    and only of the tenant's own generation, unedited (issue 31 item 3: evidence on any other
    text plans the next edit)."""
    out = {k: v for k, v in full.items() if k not in ("report", "evidence")}
    out = _rounded(out)
    threshold = full.get("threshold")
    if not full.get("watermarked") and isinstance(threshold, (int, float)) and threshold > 0:
        out = _above_threshold(out, threshold)
    else:
        out["p_band"] = f"p <= 1e{power_of_ten(full.get('log10_p_value'))}"
    out["tier"] = TENANT
    if evidence and full.get("evidence"):
        if own_unedited(full):
            out["evidence"] = coarse_evidence(full["evidence"])
        else:
            out["evidence_withheld"] = EVIDENCE_WITHHELD
    return out


def _above_threshold(shown: dict[str, Any], threshold: float) -> dict[str, Any]:
    """A tenant's answer about a text the watermark does not pass: one band, no p-values.

    Issue 31: the rounded p was a ratchet's gradient. An attacker keeping every edit that moved
    the rounded p down a power of ten spoofed a human text 7 times in 681 within 90 answers (30
    days of the tenant's family allowance). Above the threshold every text now reads the same
    (``p > threshold``), so no edit shows progress until the text passes; the per-key p-values
    and any span go too (each another reading of the same score). The threshold itself is at
    most the provider's policy maximum in this tier (service.access.gate), so a caller cannot
    step it down a power of ten at a time to get the gradient back one bit per query."""
    out = {**shown, "p_value": None, "log10_p_value": None, "p_band": f"p > {threshold:g}", "spans": []}
    if "log10_p_adjusted" in out:
        out["log10_p_adjusted"] = None
    out["per_key"] = [{k: (None if k == "p_value" or k.startswith("log10_") else v) for k, v in entry.items()}
                      if isinstance(entry, dict) else entry for entry in shown.get("per_key") or ()]
    return out


EVIDENCE_WITHHELD = ("per-token evidence is shown to a tenant only for a text the ledger holds unedited as one of "
                     "its own generations (an edited or foreign text's per-token scores would show where to edit "
                     "next); spans and the rounded p are above, and `hallmark detect` shows evidence locally")


def own_unedited(full: dict[str, Any]) -> bool:
    """Whether the tenant's ledger holds this exact text (or token ids) as one of its own
    generations: the core's ``ledger_matches`` (exact copies only, of the caller's tenant)."""
    return bool(full.get("ledger_matches"))


EVIDENCE_DECIMALS = 1
"""A tenant's per-token evidence: scores to one decimal (the core computes about 20 bits of
the keyed PRF's output per token; one decimal of -ln(1-u) keeps about 5), enough to see
which stretches carry the watermark, far less to test a guessed key with offline."""


def coarse_evidence(evidence: dict[str, Any]) -> dict[str, Any]:
    tokens = [{**t, "score": None if t.get("score") is None else round(t["score"], EVIDENCE_DECIMALS)}
              for t in evidence.get("tokens") or ()]
    return {**evidence, "score_sum": round(evidence.get("score_sum") or 0.0, EVIDENCE_DECIMALS), "tokens": tokens}


def full_answer(full: dict[str, Any], tier: str) -> dict[str, Any]:
    """Expert and operator tiers: the core's result and report unchanged (the tier is in the
    response's ``X-Hallmark-Access-Tier`` header, so the signed result still equals it)."""
    return full


def public_answer(full: dict[str, Any] | None, *, tokens: int, min_tokens: int, provider: str,
                  attributed: set[str]) -> dict[str, Any]:
    """The public tier: the verdict in words, the provider, the tenant where it opted in, a
    confidence band, tokens scored and the basis. ``full`` None: too short, not tested."""
    if full is None:
        return {"tier": PUBLIC, "verdict": TOO_SHORT, "watermarked": False, "provider": provider, "tenant": None,
                "confidence": "none", "tokens": tokens, "min_tokens": min_tokens, "basis": [],
                "verdict_text": (f"too short to say: {tokens} tokens, and the public check needs at least "
                                 f"{min_tokens} (the Code of Practice's threshold for marking text); not tested")}
    confidence = band(full["log10_p_value"]) if full.get("watermarked") else "none"
    basis = [b for b in full.get("basis") or () if b in ("watermark", "ledger")]
    tenant = None
    key = full.get("key") or {}
    candidates = [key.get("tenant")] + [m.get("tenant") for m in full.get("ledger_matches") or ()]
    for name in candidates:
        if name and name in attributed:
            tenant = name
            break
    if full.get("watermarked") and key.get("state") == "revoked":
        # Issue 34: the public check vouched ("strong confidence") for a key revoked as
        # compromised. Whoever holds that key could have made the text: no vouching, no band.
        words = (f"carries the watermark of a {provider} key that was revoked as compromised: whoever holds that "
                 "key could have produced it, so the watermark does not show where it came from")
        verdict, confidence = KEY_REVOKED, "none"
        basis = [b for b in basis if b != "watermark"]
    elif full.get("watermarked"):
        words = f"generated with {provider}'s watermark ({confidence} confidence)"
        verdict = "watermarked"
    elif "ledger" in basis:
        words = f"recorded in {provider}'s provenance ledger as generated text (the watermark alone does not show it)"
        verdict = "recorded"
    else:
        words = f"no evidence of {provider}'s watermark (not proof that a person wrote it)"
        verdict = "not_watermarked"
    if tenant:
        words += f", for {tenant}"
    return {"tier": PUBLIC, "verdict": verdict, "watermarked": verdict == "watermarked", "provider": provider,
            "tenant": tenant, "confidence": confidence, "tokens": int(full.get("total_tokens") or tokens),
            "basis": basis, "verdict_text": words}


def resign(services, core_report: dict[str, Any] | None, shown: dict[str, Any], tier: str,
           key_state: str | None = None) -> dict[str, Any] | None:
    """``core_report``'s statement re-signed over ``shown`` (what this tier sees), under the
    provider's signing policy (:func:`policy`)."""
    if core_report is None:
        return None
    statement = dict(core_report["statement"])
    threshold = float(statement["settings"]["threshold"])
    verdict = verdict_of(bool(shown.get("watermarked")), threshold)
    if shown.get("verdict") == KEY_REVOKED:
        verdict = KEY_REVOKED
    basis = ["watermark"] if verdict == "watermarked" else []
    if "ledger" in (shown.get("basis") or ()):
        basis.append("ledger")
    statement["result"] = _jsonable({k: v for k, v in shown.items() if k not in REPORT_OMITS})
    statement["verdict"], statement["basis"] = verdict, basis
    if tier == PUBLIC:
        # No count of the provider's tenants or keys (issue 31): "every key of the provider".
        statement["scope"] = {"keys_of": "provider", "tenant": None}
        statement["verdict_text"] = shown["verdict_text"] + f" (public check, threshold {threshold:g})"
        statement["access"] = {"tier": tier, "confidence": shown.get("confidence")}
    else:
        statement["verdict_text"] = _verdict_text(verdict, threshold, statement["scope"], shown)
        statement["access"] = {"tier": tier}
    signed = services.sign(policy(statement, max_p=services.settings.signed_max_p, key_state=key_state))
    shown_hashes = {m["ledger"]["entry_hash"] for m in shown.get("ledger_matches") or ()
                    if isinstance(m, dict) and isinstance(m.get("ledger"), dict)}
    # The tlog-proofs of the cited entries this tier is shown (a proof's extra names its entry's hash).
    proofs = [p for p in (core_report.get("log") or {}).get("tlog_proofs") or ()
              if (parse_proof(p).extra or b"")[1:33].hex() in shown_hashes]
    if signed is not None and proofs:
        signed["log"] = {"tlog_proofs": proofs}
    return signed


def policy(statement: dict[str, Any], *, max_p: float, key_state: str | None) -> dict[str, Any]:
    """The provider's signing policy over a statement about to be signed: ``watermarked``
    only at a threshold of at most ``max_p`` (a caller's looser threshold passes as
    ``passes_lenient_threshold``, so no tenant threshold yields a signed "watermarked" that the
    policy does not back), never for a key revoked as compromised (``key_revoked``). The
    statement names the policy (``policy.max_p``)."""
    statement = {**statement, "policy": {"max_p": max_p}}
    if statement.get("verdict") != "watermarked":
        return statement
    threshold = float(statement["settings"]["threshold"])
    basis = [b for b in statement.get("basis") or () if b != "watermark"]
    if key_state == "revoked":
        statement.update(verdict=KEY_REVOKED, basis=basis, verdict_text=(
            f"carries the watermark of a key revoked as compromised (threshold {threshold:g}): whoever holds that key "
            "could have produced it, so the watermark does not show where the text came from"))
    elif threshold > max_p:
        statement.update(verdict="passes_lenient_threshold", basis=basis, verdict_text=(
            f"passes the threshold {threshold:g}, above the provider's policy maximum {max_p:g} for a signed "
            f"'watermarked'; check again at a threshold of at most {max_p:g} for that verdict"))
    return statement


def full_report(services, full: dict[str, Any]) -> dict[str, Any] | None:
    """The expert's and operator's report: the core's, unless the signing policy changes its
    verdict (then re-signed with the same result)."""
    report = full.get("report")
    if report is None:
        return None
    statement = report["statement"]
    key_state = (full.get("key") or {}).get("state")
    if statement.get("verdict") != "watermarked" or (
            key_state != "revoked" and float(statement["settings"]["threshold"]) <= services.settings.signed_max_p):
        return report
    signed = services.sign(policy(statement, max_p=services.settings.signed_max_p, key_state=key_state))
    if signed is not None and report.get("log"):
        signed["log"] = report["log"]  # the cited entries' log proofs: the same result, the same entries
    return signed


def answer(tier: str, full: dict[str, Any], *, evidence: bool) -> dict[str, Any]:
    if tier == TENANT:
        return tenant_answer(full, evidence=evidence)
    if tier in (EXPERT, OPERATOR):
        return full_answer(full, tier)
    raise ValueError(tier)
