"""Admin JSON routes (the page's Keys tab): tenants, keys, rotate, revoke, the audit log.

Thin over :mod:`keys`: each route checks the caller is an admin, scopes it (an admin token
issued for one tenant sees and changes that tenant only), calls one domain function in one
transaction, and returns its public record. Every change is audited by the domain function,
with the actor ``api:<token id>``. Also ``GET /v1/me``: what the presented token may do.
"""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from typing import Annotated, Iterator

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from keys.audit import list_audit
from keys.errors import (DuplicateKey, DuplicateTenant, InvalidInput, InvalidTransition, KeyStoreError, NoActiveKey,
                         UnknownKey, UnknownTenant)
from keys.lifecycle import get_key, list_keys, revoke_key, rotate_key
from keys.tenants import list_tenants, same_name
from service.auth import Identity
from service.errors import BadRequest, Conflict, Forbidden, NotFound, Unprocessable
from service.http_errors import store_error
from service.responses import AuditLog, KeyInfo, KeyList, Me, Rotation, TenantList, ok
from service.routes.deps import IdentityDep, ServicesDep

MAX_AUDIT_EVENTS = 500


def _admin(identity: Identity) -> Identity:
    if not identity.admin:
        raise Forbidden("this needs an admin token (`hallmark tokens issue --admin`)")
    return identity


def _scope(identity: Identity, tenant: str | None) -> str | None:
    """The tenant an admin request acts on: a tenant-scoped admin token acts on its own only."""
    if identity.tenant is not None:
        if tenant is not None and not same_name(tenant, identity.tenant):
            raise Forbidden(f"this admin token belongs to tenant {identity.tenant!r} and cannot act for {tenant!r}")
        return identity.tenant
    return tenant


@contextmanager
def _mapped() -> Iterator[None]:
    """The store's errors as HTTP errors: unknown names 404, bad input 422, a state that
    does not allow the change 409, anything else 503."""
    try:
        yield
    except (UnknownTenant, UnknownKey) as exc:
        raise NotFound(exc.user_message) from None
    except NoActiveKey as exc:  # a state, as on /v1/generate: 409 no_active_key, not retried
        raise store_error(exc) from None
    except InvalidInput as exc:
        raise Unprocessable(exc.user_message) from None
    except (InvalidTransition, DuplicateKey, DuplicateTenant) as exc:
        # The error shape of every 409 (conflict_error), and not retried by OpenAI-style clients.
        raise Conflict(exc.user_message, headers={"x-should-retry": "false"}) from None
    except KeyStoreError as exc:
        raise store_error(exc) from None


class RotateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant: str | None = None
    """The tenant whose active key to rotate (a tenant-scoped admin token: its own, the default)."""


class RevokeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=500)
    """Why the key is revoked (recorded in the audit log)."""


router = APIRouter()


@router.get("/v1/me", tags=["Account"], summary="Who this token is", responses=ok(Me))
async def me_route(identity: IdentityDep, services: ServicesDep):
    """What the presented token is: its tenant (null for a global admin token), whether it is an
    admin, its kind, the extra scopes an admin granted it, when it expires (null: never) and
    when it was last used before this request (null: not yet; kept to about a minute)."""
    try:
        last = await asyncio.to_thread(services.token_uses.last_use, identity.token_id, identity.previous_use)
    except KeyStoreError as exc:
        raise store_error(exc) from None
    return {"token_id": identity.token_id, "tenant": identity.tenant, "admin": identity.admin, "kind": identity.kind,
            "scopes": list(identity.scopes),
            "expires_at": identity.expires_at.isoformat() if identity.expires_at else None,
            "last_used_at": last.isoformat() if last else None}


@router.get("/v1/admin/tenants", tags=["Admin"], summary="List tenants", responses=ok(TenantList))
def tenants_route(services: ServicesDep, identity: IdentityDep):
    """Tenants this admin token may see."""
    scope = _scope(_admin(identity), None)
    with _mapped(), services.store.transaction(write=False) as session:
        tenants = list_tenants(session)
    return {"tenants": [t.to_dict() for t in tenants if scope is None or t.name == scope]}


@router.get("/v1/admin/keys", tags=["Admin"], summary="List watermark keys", responses=ok(KeyList))
def keys_route(services: ServicesDep, identity: IdentityDep, tenant: str | None = None):
    """Keys (never their secrets), of one tenant or, for a global admin, of all."""
    scope = _scope(_admin(identity), tenant)
    with _mapped(), services.store.transaction(write=False) as session:
        keys = list_keys(session, tenant=scope)
    return {"keys": [k.to_dict() for k in keys]}


@router.post("/v1/admin/keys/rotate", tags=["Admin"], summary="Rotate a tenant's key", responses=ok(Rotation))
def rotate_route(body: RotateBody, services: ServicesDep, identity: IdentityDep):
    """Make a new active key for the tenant; its current active key becomes verify-only."""
    scope = _scope(_admin(identity), body.tenant)
    if scope is None:
        raise BadRequest("name the tenant whose key to rotate: {\"tenant\": \"...\"}")
    with _mapped(), services.store.transaction() as session:
        rotation = rotate_key(session, services.store.keyring, tenant=scope, actor=f"api:{identity.token_id}")
    services.key_cache.clear()  # this server uses the new key at once (others within the cache TTL)
    return {"new": rotation.new.to_dict(), "previous": rotation.previous.to_dict()}


@router.post("/v1/admin/keys/{key_id}/revoke", tags=["Admin"], summary="Revoke a key", responses=ok(KeyInfo))
def revoke_route(key_id: str, body: RevokeBody, services: ServicesDep, identity: IdentityDep):
    """Revoke a compromised key: detections under it are reported as revoked."""
    _admin(identity)
    with _mapped(), services.store.transaction() as session:
        owner = get_key(session, key_id=key_id).tenant
        if identity.tenant is not None and owner != identity.tenant:
            # Answer exactly as for a key that does not exist: nothing of another tenant leaks.
            raise UnknownKey(key_id)
        info = revoke_key(session, key_id=key_id, reason=body.reason, actor=f"api:{identity.token_id}")
    services.key_cache.clear()
    return info.to_dict()


@router.get("/v1/admin/audit", tags=["Admin"], summary="Read the audit log", responses=ok(AuditLog))
def audit_route(services: ServicesDep, identity: IdentityDep, tenant: str | None = None,
                action: str | None = None, key_id: str | None = None,
                limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_EVENTS)] = 100):
    """The most recent ``limit`` audit events (oldest first), of one tenant or, for a global admin, of all."""
    scope = _scope(_admin(identity), tenant)
    with _mapped(), services.store.transaction(write=False) as session:
        events = list_audit(session, tenant=scope, action=action, key_id=key_id, limit=limit)
    return {"events": [e.to_dict() for e in events]}
