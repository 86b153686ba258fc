"""Bearer-token authentication against the key store's API tokens."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from keys.errors import KeyStoreError
from keys.tokens import authenticate_token
from service.errors import Forbidden, Unauthorized, Unavailable
from service.state import Services


@dataclass(frozen=True)
class Identity:
    token_id: str
    tenant_id: str | None
    tenant: str | None
    admin: bool


def bearer_token(header: str | None) -> str:
    if not header:
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <API token>'",
                           headers={"WWW-Authenticate": "Bearer"})
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise Unauthorized("malformed Authorization header: expected 'Bearer <API token>'",
                           headers={"WWW-Authenticate": "Bearer"})
    return value.strip()


def authenticate(services: Services, header: str | None) -> Identity:
    """The identity behind an Authorization header (cached by token hash for a few seconds)."""
    raw = bearer_token(header)
    cache_key = ("token", hashlib.sha256(raw.encode()).hexdigest())

    def load() -> Identity | None:
        try:
            with services.store.transaction(write=False) as session:
                found = authenticate_token(session, raw_token=raw)
        except KeyStoreError as exc:
            raise Unavailable(exc.user_message) from None
        if found is None:
            return None
        return Identity(token_id=found.token_id, tenant_id=found.tenant_id, tenant=found.tenant, admin=found.admin)

    identity = services.token_cache.get_or_load(cache_key, load)
    if identity is None:
        raise Unauthorized("unknown or revoked API token", headers={"WWW-Authenticate": "Bearer"})
    return identity


def resolve_tenant(services: Services, identity: Identity, requested: str | None) -> tuple[str | None, str | None]:
    """(tenant id, tenant name) a request acts for. Tenant tokens act for their tenant only;
    admin tokens name one (or none: every tenant, where that makes sense)."""
    if not identity.admin:
        if requested is not None and requested != identity.tenant:
            raise Forbidden(f"this token belongs to tenant {identity.tenant!r} and cannot act for {requested!r}")
        return identity.tenant_id, identity.tenant
    if identity.tenant_id is not None and requested is None:
        return identity.tenant_id, identity.tenant
    if requested is None:
        return None, None
    try:
        return services.tenant_id(requested), requested
    except KeyStoreError as exc:
        from service.errors import NotFound

        raise NotFound(exc.user_message) from None
