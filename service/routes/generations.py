"""``GET /v1/generations`` (one's generations, newest first, paged and filtered) and
``GET /v1/generations/{id}`` (a generation's provenance record) from the ledger, each with
its key's state at generation and now (:mod:`keys.key_states`)."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BeforeValidator

from keys.key_states import with_key_states
from ledger.entries import MAX_OFFSET, get_generation, list_generations
from service import receipts
from service.auth import resolve_tenant
from service.errors import NotFound
from service.responses import GenerationPage, GenerationRecord, SignedDocument, ok
from service.routes.deps import IdentityDep, ServicesDep

router = APIRouter(tags=["Provenance"])


@router.get("/v1/generations/{generation_id}", summary="A generation's provenance record",
            responses=ok(GenerationRecord))
def generation_route(generation_id: str, services: ServicesDep, identity: IdentityDep):
    """The ledger's record of one generation: tenant, key and its state at generation and now,
    counts, output hashes, status and timestamps. Another tenant's generation answers 404."""
    scope = None if identity.admin and identity.tenant_id is None else identity.tenant_id
    with services.store.transaction(write=False) as session:
        entry = get_generation(session, generation_id=generation_id, tenant_id=scope)
        if entry is None:
            raise NotFound(f"no generation {generation_id!r} for this token")
        return with_key_states(session, [entry.to_dict()])[0]


@router.get("/v1/generations/{generation_id}/receipt", summary="A generation's receipt, again",
            responses=ok(SignedDocument))
def generation_receipt_route(generation_id: str, services: ServicesDep, identity: IdentityDep):
    """The signed receipt of a finished generation, as it was issued when the generation ended
    (with its transparency-log proof); 409 while it still runs, 404 for an unknown id or
    another tenant's generation."""
    scope = None if identity.admin and identity.tenant_id is None else identity.tenant_id
    return receipts.receipt_again(services, generation_id=generation_id, tenant_id=scope)


MAX_PAGE = 200


_ISO_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]")


def _iso_8601(value: object) -> object:
    """Only ISO 8601 date-time text, as the schema's ``date-time`` format says: pydantic would
    also read a number (``until=0.5``) as a Unix time, or a bare date as midnight."""
    if isinstance(value, str) and not _ISO_DATE_TIME.match(value):
        raise ValueError("expected an ISO 8601 date-time such as 2026-12-03T06:00:00Z")
    return value


Timestamp = Annotated[datetime | None, BeforeValidator(_iso_8601)]


def _utc(value: datetime | None) -> datetime | None:
    """A timestamp without a zone is read as UTC."""
    return value.replace(tzinfo=timezone.utc) if value is not None and value.tzinfo is None else value


@router.get("/v1/generations", summary="List generations", responses=ok(GenerationPage))
def generations_route(services: ServicesDep, identity: IdentityDep,
                      limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
                      offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
                      since: Timestamp = None, until: Timestamp = None,
                      key_id: str | None = None, tenant: str | None = None):
    """The caller's generations, newest first, ``limit`` per page from ``offset``; only those
    started in [``since``, ``until``) (ISO 8601; UTC when no zone is given) or under
    ``key_id``. An admin token sees every tenant's (or ``tenant``'s)."""
    scope, _ = resolve_tenant(services, identity, tenant)
    with services.store.transaction(write=False) as session:
        # One more than asked: whether another page exists, without a count query.
        found = list_generations(session, tenant_id=scope, limit=limit + 1, offset=offset,
                                 since=_utc(since), until=_utc(until), key_id=key_id)
        page = with_key_states(session, [g.to_dict() for g in found[:limit]])
    has_more = len(found) > limit
    return {"generations": page, "limit": limit, "offset": offset,
            "has_more": has_more, "next_offset": offset + len(page) if has_more else None}
