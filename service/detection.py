"""Detection as a plain function: scope the keys by the caller, score, cite the ledger."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from detector.detect import DetectorConfig, statistic_for
from detector.forms import (TextForm, detect_forms, distinct_forms, merge_form_matches, original_offsets, text_forms,
                            with_span_chars)
from keys import kgrams
from keys.errors import KeyStoreError, UnknownTenant
from keys.ledger import hash_output
from service import evidence
from service.auth import Identity, resolve_tenant
from service.detect_input import DegenerateInput, check_detect_input
from service.errors import Conflict, NotFound, RateLimited, TooLarge, Unavailable, Unprocessable
from service.http_errors import store_error
from service.ledger_evidence import with_ledger_basis, with_shared_evidence
from service.provenance import report_scope, report_settings, report_statement
from service.schemas import DetectBody
from service.state import Services
from watermark.validation import describe

log = logging.getLogger("hallmark.detection")


def detector_config(params: DetectBody) -> DetectorConfig:
    """The detector's config from the request body (the one place the fields map)."""
    fields: dict[str, Any] = {"dual_statistic": params.statistic, "spans": params.spans, "test": params.test}
    if params.threshold is not None:
        fields["threshold"] = params.threshold
    try:
        return DetectorConfig(**fields)
    except ValidationError as exc:
        raise Unprocessable(describe(exc, default="")) from None


def detect(services: Services, identity: Identity, params: DetectBody) -> dict[str, Any]:
    settings = services.settings
    wait = services.detect_wait(identity.token_id)
    if wait > 0:
        services.metrics.rate_limited.labels("/v1/detect").inc()
        raise RateLimited(f"detection rate limit reached for this token; retry in {wait:.1f} s",
                          headers={"Retry-After": str(max(1, round(wait + 0.5)))})
    if (params.text is None) == (params.token_ids is None):
        raise Unprocessable("give exactly one of 'text' and 'token_ids'")
    try:
        check_detect_input(params.text, params.token_ids, getattr(services.engine, "vocab_size", None))
    except DegenerateInput as exc:
        raise Unprocessable(str(exc), code=exc.code) from None
    config = detector_config(params)
    _, tenant = resolve_tenant(services, identity, params.tenant)
    try:
        candidates = services.detection_candidates(tenant)
    except UnknownTenant as exc:
        raise NotFound(exc.user_message) from None
    except KeyStoreError as exc:
        raise store_error(exc) from None
    if not candidates:
        raise NotFound("no keys to test: the tenant has no watermark keys yet")
    normalized = None
    if params.text is not None:
        if len(params.text) > settings.max_detect_chars:
            raise TooLarge(f"text has {len(params.text)} characters; the limit is {settings.max_detect_chars}")
        if params.normalize:
            text_variants, normalized = text_forms(params.text)
        else:
            text_variants = [TextForm("as_sent", params.text, None)]
        forms = [_tokenized(services, form) for form in text_variants]
        form_names = [form.name for form in text_variants]
        text = params.text
    else:
        token_ids = list(params.token_ids)
        if any(t < 0 or t >= 2**32 for t in token_ids):
            raise Unprocessable("token_ids must be integers in [0, 2**32)")
        forms = [(token_ids, None)]
        form_names = ["as_sent"]
        text = None
    for token_ids, _ in forms:
        if len(token_ids) > settings.max_detect_tokens:
            raise TooLarge(f"{len(token_ids)} tokens; the limit is {settings.max_detect_tokens}")
    for candidate in candidates:  # a statistic the keys in scope cannot use: the client's choice, 422
        try:
            statistic_for(candidate, config)
        except ValueError as exc:
            # 409: the request is well formed; the keys in scope (server state) lack a keyed coin.
            raise Conflict(f"statistic {params.statistic!r}: {exc}; use 'auto', 'max' or 'weighted'",
                           code="statistic_unavailable", headers={"x-should-retry": "false"}) from None
    if params.evidence:
        evidence.check_size(max(len(t) for t, _ in forms), settings.max_evidence_tokens)
    result, best = detect_forms([token_ids for token_ids, _ in forms], candidates, config)
    token_ids, offsets = forms[best]
    if offsets is not None:
        result = with_span_chars(result, offsets)
    if text is None and token_ids:
        text = services.engine.tokenizer().decode(token_ids, skip_special_tokens=True)
    matches: list[dict[str, Any]] = []
    if params.text is not None:
        text = params.text  # the client's text, not its normalised form: exact-copy hash, signed report
    if text:
        scope = identity.tenant_id if not identity.admin else (None if tenant is None else services.tenant_id(tenant))
        matches = services.ledger_matches(hash_output(text), scope)
    kgram_matches = _kgram_matches(services, identity, tenant, candidates, [t for t, _ in forms], config)
    services.metrics.detections.labels("watermarked" if result.watermarked else "not_watermarked").inc()
    # The ledger is a second basis: an exact copy (output hash) or shared k-grams whose
    # chance-collision bound passes the threshold, even when the watermark no longer does.
    out = with_ledger_basis(result.to_dict(), matches, kgram_matches, config.threshold)
    if normalized is not None:
        out["normalization"] = {**normalized.to_dict(), "scored": form_names[best]}
    if params.evidence:
        out["evidence"] = evidence.evidence_for(result, token_ids, candidates, config, offsets)
    # What was checked and what the verdict rests on, signed (verifiable offline like a receipt).
    scope = report_scope(candidates, keys_of="tenant" if tenant is not None else "all_tenants", tenant=tenant)
    settings = report_settings(config, normalize=params.normalize if params.text is not None else None)
    out["report"] = services.sign(report_statement(out, text=params.text, token_ids=list(token_ids),
                                                   scope=scope, settings=settings))
    return out


def _tokenized(services: Services, form: TextForm) -> tuple[list[int], list[tuple[int, int]] | None]:
    """Token ids of one form of the text, and their character offsets in the client's text."""
    token_ids, offsets = tokenize_with_offsets(services.engine.tokenizer(), form.text)
    return token_ids, None if offsets is None else original_offsets(form, offsets)


def _kgram_matches(services: Services, identity: Identity, tenant, candidates, forms, config) -> list:
    """Generations sharing k-grams with the text under a stored candidate key (keys.kgrams),
    with the watermark evidence of the shared tokens (service.ledger_evidence)."""
    keys = [(c.info.key_id, c.key.secret) for c in candidates if c.info.tenant is not None and c.info.key_id]
    if not keys:
        return []
    scope = identity.tenant_id if not identity.admin else (None if tenant is None else services.tenant_id(tenant))
    try:
        with services.store.transaction(write=False) as session:
            # Every form of the text is searched, not only the one the watermark scored best
            # (detector.forms.merge_form_matches says why and what it costs).
            # One cache for every form and look-up: the forms share most of their k-grams.
            cache = kgrams.KgramCache()
            return merge_form_matches([
                with_shared_evidence(session, kgrams.find_matches(session, keys=keys, token_ids=tokens,
                                                                  tenant_id=scope, cache=cache),
                                     candidates, tokens, config, cache=cache)
                for tokens in distinct_forms(forms, kgrams.K)])
    except KeyStoreError as exc:
        raise store_error(exc) from None


def tokenize_with_offsets(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]] | None]:
    """Token ids and character offsets; through the fast tokenizer's backend when there is
    one (several times cheaper per call than the transformers wrapper)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is not None:
        encoding = backend.encode(text, add_special_tokens=False)
        return encoding.ids, encoding.offsets
    return tokenizer.encode(text, add_special_tokens=False), None
