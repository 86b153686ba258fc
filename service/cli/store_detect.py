"""Detection against the key store's keys (`hallmark detect --tenant T` / `--all-tenants`)."""

from __future__ import annotations

from typing import Any, Sequence

from detector.result import Candidate, salted_candidates
from keys.errors import KeyStoreError
from keys.material import detection_keys
from service.cli.app import CliError
from service.cli.store import cli_store
from service.key_scopes import candidate_of


def stored_candidates(*, tenant: str | None) -> list[Candidate]:
    """Every key (active, verify-only, revoked) of ``tenant``, or of all tenants."""
    try:
        with cli_store(require_kek=True) as store, store.transaction(write=False) as session:
            keys = detection_keys(session, store.keyring, tenant=tenant)
    except KeyStoreError as exc:
        raise CliError(exc.user_message) from None
    if not keys:
        where = f"tenant {tenant!r}" if tenant else "the store"
        raise CliError(f"{where} has no keys to test; create one with `hallmark keys create`")
    return salted_candidates([candidate_of(k) for k in keys])


def add_ledger_evidence(result: dict[str, Any], *, tenant: str | None, text: str | None,
                        forms: Sequence[Sequence[int]], candidates: list[Candidate], config) -> dict[str, Any]:
    """The ledger's evidence, as the API gives it (service.detection): recorded generations
    whose output is exactly ``text``, and generations sharing k-grams of any of the text's
    forms (token ids [n] each: as given and normalised, detector.forms) under the stored
    candidate keys, scoped to ``tenant`` (None: every tenant)."""
    from detector.forms import distinct_forms, merge_form_matches
    from ledger import kgrams
    from keys.key_states import with_key_states
    from ledger.entries import find_generations_by_output_hash, hash_output
    from keys.tenants import get_tenant
    from service.ledger_evidence import with_ledger_basis, with_shared_evidence
    from service.provenance import ledger_match

    keys = [(c.info.key_id, c.key.secret) for c in candidates if c.info.tenant is not None and c.info.key_id]
    try:
        with cli_store(require_kek=True) as store, store.transaction(write=False) as session:
            tenant_id = None if tenant is None else get_tenant(session, name=tenant).id
            found = [] if not text else find_generations_by_output_hash(
                session, output_sha256=hash_output(text), tenant_id=tenant_id)
            exact = with_key_states(session, [ledger_match(e) for e in found])
            matches = [] if not keys else merge_form_matches([
                with_shared_evidence(session, kgrams.find_matches(session, keys=keys, token_ids=tokens,
                                                                  tenant_id=tenant_id), candidates, tokens, config)
                for tokens in distinct_forms(forms, kgrams.K)])
    except KeyStoreError as exc:
        raise CliError(exc.user_message) from None
    return with_ledger_basis(result, exact, matches, config.threshold)
