"""``GET /v1/generations/{id}``: a generation's provenance record from the ledger."""

from __future__ import annotations

from fastapi import APIRouter

from keys.ledger import get_generation
from service.errors import NotFound
from service.routes.deps import IdentityDep, ServicesDep

router = APIRouter()


@router.get("/v1/generations/{generation_id}")
def generation_route(generation_id: str, services: ServicesDep, identity: IdentityDep):
    scope = None if identity.admin and identity.tenant_id is None else identity.tenant_id
    with services.store.transaction(write=False) as session:
        entry = get_generation(session, generation_id=generation_id, tenant_id=scope)
    if entry is None:
        raise NotFound(f"no generation {generation_id!r} for this token")
    return entry.to_dict()
