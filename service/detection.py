"""Detection as a plain function: scope the keys by the caller, score, cite the ledger."""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from pydantic import ValidationError

from detector.detect import DetectorConfig, statistic_for
from detector.multikey import KeySet, detect_many
from detector.result import Candidate
from detector.scoring import ScoreMemo
from detector.forms import (TextForm, detect_forms, distinct_forms, merge_form_matches, original_offsets, text_forms,
                            with_runs_merged, with_span_chars)
from ledger import kgrams
from keys.errors import KeyStoreError, UnknownTenant
from keys.key_states import with_key_states as with_entry_states
from service import evidence, generation_ids
from service.auth import Identity, resolve_tenant
from service.detect_input import DegenerateInput, check_detect_input
from service.errors import Conflict, NotFound, TooLarge, Unavailable, Unprocessable
from service.http_errors import store_error
from service.kgram_hashing import kgram_cache
from service.ledger_evidence import with_key_states, with_ledger_basis, with_shared_evidence, with_shared_scores
from service.ledger_lookup import LazySession, LedgerLookup, ledger_scope, look_up, stored_keys
from service.ledger_salts import narrowed_by_ledger
from service import ledger_log
from service.provenance import ledger_match, report_scope, report_settings, report_statement
from service.schemas import DetectBody
from service.state import Services
from service.tokenization import encode_with_offsets
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


def detect(services: Services, identity: Identity, params: DetectBody, *, batched: bool = True,
           counted: bool = True, sign: bool = True, tokens: "Tokenised | None" = None) -> dict[str, Any]:
    """The full result of one detection (what ``/v1/detect`` answers). ``batched`` False:
    the reference path (every key scored in full, each form of the text looked up in the
    ledger on its own), which the batched one matches (tests/service/test_detect_batched.py).
    ``counted`` False: not in the detection metrics (the start's warm-up, service.warmup).
    ``sign`` False: ``report`` is the statement unsigned (``{"statement", "log"}``, its
    ``result`` and verdict text left out), for a tier that re-signs its own view of it
    (service.access.shape.resign): one signature a request, not two. Still None where the
    store has no signing key. ``tokens``: the request's tokenisations so far (the access
    gate's probe sketch tokenised the same forms), shared, not redone."""
    settings = services.settings
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
        tokenizer = services.engine.tokenizer()
        tokens = tokens if tokens is not None else Tokenised(tokenizer)
        if params.normalize:
            text_variants, normalized = tokens.forms(params.text)
        else:
            text_variants = [TextForm("as_sent", params.text, None)]
        forms = [tokens.encode(form.text) for form in text_variants]
        # Whitespace runs as the model writes them, one more form where encode splits them.
        text_variants, forms = with_runs_merged(text_variants, forms, generation_ids.segmentation_table(
            tokenizer, services.engine), lambda part: tokenize_with_offsets(tokenizer, part)[0])
        # Forms that tokenise alike are one test: scored once and counted once in the
        # Bonferroni factor over the forms (detector.forms), the first of them kept (the
        # text as sent where it is one: its offsets need no mapping).
        first: dict[tuple[int, ...], int] = {}
        kept = [i for i, (ids, _) in enumerate(forms) if first.setdefault(tuple(ids), i) == i]
        if len(kept) < len(forms):
            forms, text_variants = [forms[i] for i in kept], [text_variants[i] for i in kept]
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
    # The exact-copy look-up hashes the client's text, not its normalised form, or the token
    # ids' decoded text (their one form).
    if text is None and forms[0][0]:
        text = services.engine.tokenizer().decode(forms[0][0], skip_special_tokens=True)
    # The ledger looked up once (exact copies, every form's k-grams) for the salts and the basis;
    # an exact copy's own token ids recovered in the same transaction (service.generation_ids).
    recover = _id_recovery(services, params.text, forms[0][0], candidates) if params.text is not None else None
    searched = [t for t, _ in forms]  # the k-gram basis searches these, whatever is scored
    lookup = look_up(services, identity, tenant, candidates, searched, text, recover)
    scored_as = "text" if params.text is not None else "token_ids"
    if lookup.generation_ids is not None:
        # The text is the generation's output, and these are the ids the model wrote (their
        # SHA-256 the recorded one): scored as one form, where encode's tokens and the
        # normalised forms would only lose the watermark of re-tokenised tokens.
        recovered = lookup.generation_ids
        forms = [(list(recovered.token_ids), list(recovered.offsets))]
        text_variants = [TextForm("generation_ids", params.text, None)]
        form_names, scored_as = ["generation_ids"], "generation_ids"
    # A diverse key whose generation the ledger identifies is tested under its recorded salt.
    narrowed = narrowed_by_ledger(services, lookup, candidates, config, exact=params.text is not None)
    memo = ScoreMemo()  # the detector's scores, read again by the ledger basis's shared-token test
    if batched:  # every key in one compiled pass, screened (detector.multikey)
        keyset = keyset_of(candidates, tenant) if narrowed is candidates else KeySet.of(narrowed)
        result, best = detect_forms([token_ids for token_ids, _ in forms], keyset, config, run=detect_many,
                                    memo=memo)
    else:
        result, best = detect_forms([token_ids for token_ids, _ in forms], narrowed, config)
    # The k-gram basis tests each match's shared tokens under its own generation's salt, which
    # may be one the narrowing left out (a match to another generation of the same key).
    every_salt, candidates = candidates, narrowed
    token_ids, offsets = forms[best]
    if offsets is not None:
        # Mapped back to the client's text for the scored form only (the others' are unused).
        offsets = original_offsets(text_variants[best], offsets)
        result = with_span_chars(result, offsets)
    if batched:
        matches, kgram_matches = _ledger_basis(services, lookup, every_salt, config, memo=memo)
    else:
        matches, kgram_matches = _ledger_basis(services, lookup, every_salt, config, kgram=False)
        kgram_matches = _kgram_matches_per_form(services, identity, tenant, every_salt, searched, config)
    if counted:
        services.metrics.detections.labels("watermarked" if result.watermarked else "not_watermarked").inc()
    # The ledger is a second basis: an exact copy (output hash) or shared k-grams whose
    # chance-collision bound passes the threshold, even when the watermark no longer does.
    out = with_ledger_basis(result.to_dict(), matches, kgram_matches, config.threshold)
    out["scored_as"] = scored_as
    if normalized is not None:
        out["normalization"] = {**normalized.to_dict(), "scored": form_names[best]}
    if params.evidence:
        out["evidence"] = evidence.evidence_for(result, token_ids, candidates, config, offsets)
    # What was checked and what the verdict rests on, signed (verifiable offline like a receipt).
    scope = report_scope(candidates, keys_of="tenant" if tenant is not None else "all_tenants", tenant=tenant)
    settings = report_settings(config, normalize=params.normalize if params.text is not None else None)
    if sign:
        out["report"] = services.sign(report_statement(out, text=params.text, token_ids=list(token_ids),
                                                       scope=scope, settings=settings))
    elif services.signer() is not None:
        # The tier's re-signing replaces the result, verdict text and basis (shape.resign):
        # only what it keeps (subject, detector, settings, scope, time) is worked out here.
        bare = {"watermarked": out.get("watermarked")}
        out["report"] = {"statement": report_statement(bare, text=params.text, token_ids=list(token_ids),
                                                       scope=scope, settings=settings)}
    else:
        out["report"] = None
    cited = [(m["generation_id"], m["ledger"]["entry_hash"]) for m in out.get("ledger_matches") or ()
             if isinstance(m.get("ledger"), dict) and m.get("generation_id")]
    if out["report"] is not None and cited:  # offline proofs that the cited entries are logged
        proofs = ledger_log.entry_proofs(services, cited, lookup.facts)
        if proofs:
            out["report"]["log"] = {"tlog_proofs": proofs}
    return out


def _id_recovery(services: Services, text: str, canonical: list[int], candidates):
    """The look-up's hook (service.ledger_lookup.look_up's ``recover``) that recovers the token
    ids of the newest exact copy, under a key in scope, whose ids hash to its record."""
    tokenizer = services.engine.tokenizer()
    in_scope = {c.info.key_id for c in candidates if c.info.key_id and c.info.tenant is not None}

    def run(session, found: LedgerLookup) -> None:
        table = generation_ids.segmentation_table(tokenizer, services.engine)
        secrets = dict(stored_keys(candidates))
        for entry in found.exact:  # newest first
            if entry.key_id not in in_scope or not entry.token_ids_sha256:
                continue
            ids = generation_ids.recover(session, found.cache, entry, text, canonical, table, secrets)
            if ids is not None:
                found.generation, found.generation_ids = entry, ids
                return

    return run


_KEYSETS: dict[str | None, tuple[list[Candidate], KeySet]] = {}
_KEYSETS_MAX = 10_000
_keysets_lock = threading.Lock()


def keyset_of(candidates: list[Candidate], scope: str | None = None) -> KeySet:
    """The :class:`~detector.multikey.KeySet` of the candidate list the key cache holds for
    ``scope`` (a tenant name, None: every tenant): its PRF keys as arrays, grouped by spec,
    built once per list. The key cache builds a new list when its entry expires or is cleared
    (a key created, rotated or revoked through this gateway), and a new list replaces the
    scope's KeySet (one kept per scope)."""
    found = _KEYSETS.get(scope)
    if found is not None and found[0] is candidates:
        return found[1]
    keyset = KeySet.of(candidates)
    with _keysets_lock:
        if len(_KEYSETS) >= _KEYSETS_MAX and scope not in _KEYSETS:
            _KEYSETS.clear()
        _KEYSETS[scope] = (candidates, keyset)
    return keyset


def _ledger_basis(services: Services, lookup: LedgerLookup, candidates, config, *,
                  kgram: bool = True, memo: ScoreMemo | None = None) -> tuple[list[dict[str, Any]], list]:
    """The ledger basis from the detection's one look-up: its exact copies as result items,
    and (``kgram``) its k-gram matches under the keys tested, with the watermark evidence of
    the shared tokens (service.ledger_evidence; their positions from the rows the look-up
    fetched; their scores from ``memo``, the detector's), merged over the forms, the salts and
    key states those the look-up read (so usually no query here)."""
    if not lookup.exact and not (kgram and lookup.forms):
        return [], []
    try:
        with contextlib.ExitStack() as stack:  # the transaction opened only if something is read
            session = LazySession(lambda: stack.enter_context(services.store.transaction(write=False)))
            now = lookup.now if all(e.key_id is None or e.key_id in lookup.now for e in lookup.exact) else None
            matches = with_entry_states(session, [ledger_match(e) for e in lookup.exact], now=now)
            if not kgram or not lookup.forms:
                return matches, []
            return matches, with_key_states(session, merge_form_matches([
                with_shared_scores(session, found, candidates, tokens, config, cache=lookup.cache, memo=memo,
                                   salts=lookup.salts)
                for tokens, found in zip(lookup.forms, lookup.kgram)]), at_generation=lookup.at_generation,
                now=lookup.now)
    except KeyStoreError as exc:
        raise store_error(exc) from None


def _kgram_matches_per_form(services: Services, identity: Identity, tenant, candidates, forms, config) -> list:
    """The k-gram basis as it was before the look-ups were batched (the reference path): every
    form looked up on its own, the shared positions and key states per form."""
    keys, scope = stored_keys(candidates), ledger_scope(services, identity, tenant)
    if not keys:
        return []
    try:
        with services.store.transaction(write=False) as session:
            # Every form of the text is searched, not only the one the watermark scored best
            # (detector.forms.merge_form_matches says why and what it costs).
            # One cache for every form and look-up: the forms share most of their k-grams.
            cache = kgram_cache()
            return merge_form_matches([
                with_shared_evidence(session, kgrams.find_matches(session, keys=keys, token_ids=tokens,
                                                                  tenant_id=scope, cache=cache),
                                     candidates, tokens, config, cache=cache)
                for tokens in distinct_forms(forms, kgrams.K)])
    except KeyStoreError as exc:
        raise store_error(exc) from None


class Tokenised:
    """One request's tokenisations by text (and its normalised forms), made once and read by
    each step that needs them: the access gate's probe sketch, the public tier's token count,
    the core (issue 30 item 4: a request tokenises each form once). The lists are shared:
    read them, do not change them."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._encoded: dict[str, tuple[list[int], list[tuple[int, int]] | None]] = {}
        self._forms: tuple[str, Any] | None = None

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]] | None]:
        found = self._encoded.get(text)
        if found is None:
            found = self._encoded[text] = tokenize_with_offsets(self.tokenizer, text)
        return found

    def forms(self, text: str):
        """:func:`detector.forms.text_forms` of ``text`` (the forms and the normalisation)."""
        if self._forms is None or self._forms[0] != text:
            self._forms = (text, text_forms(text))
        return self._forms[1]


def tokenize_with_offsets(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]] | None]:
    """Token ids and character offsets; through the fast tokenizer's backend when there is
    one (several times cheaper per call than the transformers wrapper)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is not None:
        return encode_with_offsets(backend, text)
    return tokenizer.encode(text, add_special_tokens=False), None
