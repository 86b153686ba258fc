"""Who is asking for a detection, and what that tier may see and spend.

=========  ===========================  ============================================  ===================
tier       who                          answer                                        volume
=========  ===========================  ============================================  ===================
public     anyone, no account           verdict in words, provider, opted-in tenant,  per client address
                                        confidence band, tokens, basis, signed report and in all
tenant     a tenant's API token, or     verdict, key, p to a power of ten, spans;     per tenant
           its tenant-scoped admin      evidence with the ``evidence`` scope on its
           token                        own unedited generations
expert     admin-issued expert token    the full result, evidence included; audited   unlimited
operator   the global admin token       the full result (the provider itself);        unlimited
                                        audited
=========  ===========================  ============================================  ===================
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from service.auth import Identity

PUBLIC, TENANT, EXPERT, OPERATOR = "public", "tenant", "expert", "operator"


@dataclass(frozen=True)
class Principal:
    """Whom budgets, probe families and slots are counted for. ``key`` is what is stored (a
    keyed hash: no address or token id reaches the database's working tables)."""

    tier: str
    name: str
    """Readable, in this process only (slots): ``tenant:<id>``, ``token:<id>``, ``address:<ip>``."""
    key: str


def tier_of(identity: Identity | None) -> str:
    """The tier follows what the token may reach, not whether it administers something: a
    tenant-scoped admin token manages its tenant's keys and tokens but detects as that tenant
    (issue 31: it had the operator tier, exact p and no guard, and spoofed in 5 queries)."""
    if identity is None:
        return PUBLIC
    if identity.expert:
        return EXPERT
    if identity.admin and identity.tenant_id is None:
        return OPERATOR
    return TENANT


def principal_of(identity: Identity | None, client_address: str | None, secret: bytes) -> Principal:
    """Tenant tokens count against their tenant (every token of it together: a tenant cannot
    multiply its budget by issuing tokens); expert and admin tokens against themselves; the
    public tier against the client's address."""
    tier = tier_of(identity)
    if tier == PUBLIC:
        name = f"address:{client_address or 'unknown'}"
    elif tier == TENANT:
        name = f"tenant:{identity.tenant_id}"
    else:
        name = f"token:{identity.token_id}"
    return Principal(tier, name, keyed(secret, b"principal", name.encode())[:32])


def keyed(secret: bytes, label: bytes, data: bytes) -> str:
    return hmac.new(secret, label + b"\x00" + data, hashlib.sha256).hexdigest()


def access_secret(services) -> bytes:
    """The key of the probe guard's and principals' hashes: derived from the store's primary
    KEK, so every replica agrees on it and the database alone does not hold it."""
    material = services.store.keyring.primary.material
    return hmac.new(material, b"hallmark/access/v1", hashlib.sha256).digest()
