"""Bearer-token authentication against the key store's API tokens.

Lookups are cached (:class:`service.caching.TokenCache`: known and unknown tokens apart);
a cache miss queries the database in a worker thread (:func:`authenticate_async`), at most
``_LOOKUPS`` at once, so that neither a slow database nor a flood of random tokens stalls
the event loop or exhausts the connection pool.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass, field, replace
from datetime import datetime

from keys import clock
from keys.errors import KeyStoreError
from keys.tenants import same_name
from keys.tokens import authenticate_token, well_formed
from service.errors import Forbidden, Unauthorized
from service.http_errors import store_error
from service.state import Services

log = logging.getLogger("hallmark.auth")


@dataclass(frozen=True)
class Identity:
    token_id: str
    tenant_id: str | None
    tenant: str | None
    admin: bool
    kind: str = "standard"
    """``standard`` or ``expert`` (keys.tokens.KINDS)."""
    scopes: tuple[str, ...] = ()
    expires_at: datetime | None = None
    previous_use: datetime | None = field(default=None, compare=False)
    """When this process saw the token before this request (None: not since it started)."""

    @property
    def expert(self) -> bool:
        return self.kind == "expert"


def bearer_token(header: str | None) -> str:
    if not header:
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <API token>'",
                           headers={"WWW-Authenticate": "Bearer"})
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise Unauthorized("malformed Authorization header: expected 'Bearer <API token>'",
                           headers={"WWW-Authenticate": "Bearer"})
    return value.strip()


_LOOKUPS = 4  # concurrent token lookups in the database, per process
_lookup_slots: dict[int, asyncio.Semaphore] = {}


def _load(services: Services, raw: str) -> Identity | None:
    try:
        with services.store.transaction(write=False) as session:
            found = authenticate_token(session, raw_token=raw)
    except KeyStoreError as exc:
        raise store_error(exc) from None
    if found is None:
        return None
    return Identity(token_id=found.token_id, tenant_id=found.tenant_id, tenant=found.tenant, admin=found.admin,
                    kind=found.kind, scopes=found.scopes, expires_at=found.expires_at)


def _known(identity: Identity | None, services: Services | None = None) -> Identity:
    # A cached identity may outlive its token's expiry by the cache's few seconds: checked here too.
    if identity is None or (identity.expires_at is not None and identity.expires_at <= clock.utcnow()):
        raise Unauthorized("unknown, revoked or expired API token", headers={"WWW-Authenticate": "Bearer"})
    if services is not None:
        identity = replace(identity, previous_use=services.token_uses.saw(identity.token_id))
    return identity


def authenticate(services: Services, header: str | None) -> Identity:
    """The identity behind an Authorization header (cached by token hash for a few seconds).
    Blocking on a cache miss: from async code use :func:`authenticate_async`."""
    raw = bearer_token(header)
    cache_key = hashlib.sha256(raw.encode()).hexdigest()
    return _known(services.token_cache.get_or_load(cache_key, lambda: _load(services, raw)), services)


async def authenticate_async(services: Services, header: str | None) -> Identity:
    """:func:`authenticate` with the database lookup in a worker thread."""
    raw = bearer_token(header)
    if not well_formed(raw):  # refused without a lookup (and without filling the cache)
        return _known(None)
    cache_key = hashlib.sha256(raw.encode()).hexdigest()
    found, identity = services.token_cache.lookup_refreshing(cache_key, lambda: _load(services, raw))
    if found:
        return _known(identity, services)
    slots = _lookup_slots.setdefault(id(asyncio.get_running_loop()), asyncio.Semaphore(_LOOKUPS))
    async with slots:
        found, identity = services.token_cache.lookup(cache_key)  # another waiter may have loaded it
        if not found:
            identity = await asyncio.to_thread(_load, services, raw)
            services.token_cache.store(cache_key, identity)
    return _known(identity, services)


def resolve_tenant(services: Services, identity: Identity, requested: str | None) -> tuple[str | None, str | None]:
    """(tenant id, tenant name) a request acts for. Tenant tokens and tenant-scoped admin
    tokens act for their own tenant only (naming another, existing or not, is 403 with the
    same message, so the answer tells nothing about other tenants); global admin tokens
    name one (or none: every tenant, where that makes sense)."""
    if identity.tenant_id is not None:
        if requested is not None and not same_name(requested, identity.tenant):
            raise Forbidden(f"this token acts for tenant {identity.tenant!r} only")
        return identity.tenant_id, identity.tenant
    if requested is None:
        return None, None
    try:
        return services.tenant_id(requested), requested
    except KeyStoreError as exc:
        from service.errors import NotFound

        raise NotFound(exc.user_message) from None
