"""Detection against the key store's keys (`hallmark detect --tenant T` / `--all-tenants`)."""

from __future__ import annotations

from detector.result import Candidate
from keys.errors import KeyStoreError
from keys.material import detection_keys
from service.cli.app import CliError
from service.cli.store import cli_store
from service.state import candidate_of


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
    return [candidate_of(k) for k in keys]
