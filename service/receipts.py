"""A recorded generation's receipt, issued again (``GET /v1/generations/{id}/receipt``).

The statement is rebuilt from the generation's ``finished`` entry as the gateway signed it
when the generation ended (same fields, same key fingerprint, same ledger position), and
its log proof is the entry's inclusion in the latest published checkpoint (cosigned by the
witnesses' quorum when the log has witnesses; also as a c2sp.org/tlog-proof@v1 text), or,
before one covers it, in the tree its append committed under a checkpoint signed now. A
generation still running has no receipt yet (409); another tenant's reads as unknown (404),
and so does a row the log does not hold as written (ledger.read.authentic): only entries whose
leaf authenticates are ever signed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ledger.chain import entry_fields
from ledger.log import tlog
from keys.errors import KeyStoreError
from ledger.read import get_generation, latest_row
from keys.models import KeyRow
from service.errors import Conflict, NotFound, Unavailable
from service.http_errors import store_error
from service.state import Services


def receipt_again(services: Services, *, generation_id: str, tenant_id: str | None) -> dict[str, Any]:
    """The receipt of ``generation_id``, visible to ``tenant_id`` (None: every tenant's)."""
    try:
        with services.store.transaction(write=False) as session:
            entry = get_generation(session, generation_id=generation_id, tenant_id=tenant_id)
            if entry is None:
                raise NotFound(f"no generation {generation_id!r} for this token")
            last = latest_row(session, generation_id=generation_id, tenant_id=entry.tenant_id)
            if last is None or last.kind != "finished":
                raise Conflict(f"generation {generation_id} has not finished ({entry.status}): its receipt is "
                               "issued when it finishes", code="generation_unfinished")
            key = session.get(KeyRow, entry.key_id) if entry.key_id is not None else None
            leaf = tlog.logged_entries(session, [last]).get(last.id)
            if leaf is None:
                # Nothing is signed that the log does not hold (issue 35): a row without an
                # authentic leaf is not shown at all (ledger.read.authentic); this is a store
                # whose log was off (a benchmark's control arm) or a process without the log key.
                raise Conflict(f"generation {generation_id} is not in the transparency log, so no receipt is "
                               "signed for it", code="generation_not_logged", headers={"x-should-retry": "false"})
            size, note = leaf.idx + 1, None
            published = tlog.latest_checkpoint(session)
            if published is not None and published.size > leaf.idx:
                # Proved against the latest published checkpoint: cosigned by the witness quorum
                # when the log has witnesses, so the receipt verifies offline under a policy.
                size, note = published.size, published.note
            entry = dataclasses.replace(entry, kgrams_sha256=leaf.kgrams_sha256, fields=entry_fields(last),
                                        log=tlog.Sequenced(
                leaf_index=leaf.idx, size=size, root=tlog.root_at(session, size),
                proof=tuple(tlog.inclusion_proof(session, leaf.idx, size))))
    except KeyStoreError as exc:
        raise store_error(exc) from None
    receipt = services.receipt_for(entry, fingerprint=key.shown_fingerprint if key is not None else None, note=note)
    if receipt is None:
        raise Unavailable("the store has no signing key, so no receipt can be signed")
    return receipt
