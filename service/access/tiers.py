"""Who is asking for a detection, and what that tier may see and spend.

=========  ===========================  ============================================  ===================
tier       who                          answer                                        volume
=========  ===========================  ============================================  ===================
public     anyone, no account           verdict in words, provider, opted-in tenant,  per client address
                                        confidence band, tokens, basis, signed report and in all
tenant     a tenant's API token, or     verdict, key, p to a power of ten and spans   per tenant
           its tenant-scoped admin      where the text passes, else ``p > threshold``;
           token                        evidence with the ``evidence`` scope on its
                                        own unedited generations
expert     admin-issued expert token    the full result, evidence included; audited   unlimited
operator   the global admin token       the full result (the provider itself);        unlimited
                                        audited
=========  ===========================  ============================================  ===================
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from service.access.addresses import groups
from service.auth import Identity

PUBLIC, TENANT, EXPERT, OPERATOR = "public", "tenant", "expert", "operator"


@dataclass(frozen=True)
class Principal:
    """Whom budgets, probe families and slots are counted for. ``key`` is what is stored (a
    keyed hash: no address or token id reaches the database's working tables)."""

    tier: str
    name: str
    """Readable, in this process only (slots): ``tenant:<id>``, ``token:<id>``, ``address:<group>``."""
    key: str
    family: str = ""
    """Whose probe families a query joins (keyed): the tenant, the token, or for the public
    tier one space shared by every public caller (:data:`PUBLIC_FAMILIES`)."""
    wide: str | None = None
    """The public tier's wide group (keyed): a budget shared by a network's addresses."""


PUBLIC_FAMILIES = b"public-families"
"""The public tier's one family space: every address, every network (issue 31, third round).
Families were kept per /24 (/48), and an attacker with a fresh /24 for every query stripped
at 43-48 % of tokens changed against the blind attacker's 76 %: every network was a fresh
allowance of the same text. A text's family now gets its answers from the public tier as a
whole (3 a day by default), whoever asks; an exact repeat of an answered query is answered
again without counting (service.access.probe: nothing new to learn from it)."""


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


def principal_of(identity: Identity | None, client_address: str | None, secret: bytes,
                 settings=None) -> Principal:
    """Tenant tokens (and the tenant's admin tokens) count against their tenant (every token
    of it together: a tenant cannot multiply its budget or its text families by issuing
    tokens); expert and global admin tokens against themselves; the public tier against the
    client's address group and a second budget against the wide group
    (service.access.addresses); its text families against one space of every public caller
    (:data:`PUBLIC_FAMILIES`)."""
    tier = tier_of(identity)
    if tier == PUBLIC:
        found = groups(client_address, **_prefixes(settings))
        name = f"address:{found.group}"
        key = keyed(secret, b"principal", name.encode())[:32]
        wide = keyed(secret, b"principal", f"network:{found.wide}".encode())[:32]
        return Principal(tier, name, key, family=keyed(secret, b"principal", PUBLIC_FAMILIES)[:32], wide=wide)
    if tier == TENANT:
        name = f"tenant:{identity.tenant_id}"
    else:
        name = f"token:{identity.token_id}"
    key = keyed(secret, b"principal", name.encode())[:32]
    return Principal(tier, name, key, family=key)


def _prefixes(settings) -> dict[str, int]:
    if settings is None:
        return {}
    return {"ipv6_group": settings.ipv6_group_prefix, "ipv4_wide": settings.ipv4_share_prefix,
            "ipv6_wide": settings.ipv6_share_prefix}


def keyed(secret: bytes, label: bytes, data: bytes) -> str:
    return hmac.new(secret, label + b"\x00" + data, hashlib.sha256).hexdigest()


def access_secret(services) -> bytes:
    """The key of the probe guard's and principals' hashes: derived from the store's primary
    KEK, so every replica agrees on it and the database alone does not hold it."""
    material = services.store.keyring.primary.material
    return hmac.new(material, b"hallmark/access/v1", hashlib.sha256).digest()
