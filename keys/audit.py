"""The audit log: who changed what, when. Append-only (see :mod:`keys.models`).

Every state change in the store calls :func:`record_audit` inside the same transaction
as the change, so an event exists exactly when its change committed. Details are small
JSON objects of identifiers, states and counts; a detail named like a secret is refused.
"""

from __future__ import annotations

import getpass
import json
import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from keys import clock
from keys.errors import InvalidInput, UnknownTenant
from keys.models import AuditEvent, Tenant

ACTOR_LENGTH = 200
# Details never carry secrets; refusing these names catches the obvious mistake early.
FORBIDDEN_DETAIL_NAMES = frozenset(
    {"secret", "key", "raw_token", "token", "kek", "material", "password", "plaintext"}
)


@dataclass(frozen=True)
class AuditEntry:
    id: int
    occurred_at: datetime
    actor: str
    action: str
    tenant_id: str | None
    tenant: str | None
    key_id: str | None
    details: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "occurred_at": self.occurred_at.isoformat(), "actor": self.actor,
                "action": self.action, "tenant": self.tenant, "tenant_id": self.tenant_id,
                "key_id": self.key_id, "details": self.details}


def default_actor() -> str:
    """``HALLMARK_ACTOR`` if set, else ``cli:<OS user>``."""
    configured = os.environ.get("HALLMARK_ACTOR", "").strip()
    if configured:
        return configured[:ACTOR_LENGTH]
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container user without a passwd entry
        user = f"uid{os.getuid()}"
    return f"cli:{user}"


def _check_details(details: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(details, dict):
        raise InvalidInput("audit details must be a JSON object")
    bad = sorted(name for name in details if name.lower() in FORBIDDEN_DETAIL_NAMES)
    if bad:
        raise InvalidInput(f"audit details must not carry secrets (refused field {bad[0]!r})")
    try:
        # Round-trip so that what is stored is exactly what a reader gets back.
        return json.loads(json.dumps(details))
    except (TypeError, ValueError):
        raise InvalidInput("audit details must be JSON-serialisable") from None


def record_audit(session: Session, *, actor: str, action: str, tenant_id: str | None = None,
                 key_id: str | None = None, details: dict[str, Any] | None = None,
                 now: datetime | None = None) -> AuditEvent:
    """Add one event to the session's transaction (it commits or rolls back with the change)."""
    if not actor or not isinstance(actor, str):
        raise InvalidInput("an audit event needs an actor")
    if not action or not isinstance(action, str):
        raise InvalidInput("an audit event needs an action")
    event = AuditEvent(occurred_at=clock.resolve(now), actor=actor[:ACTOR_LENGTH], action=action,
                       tenant_id=tenant_id, key_id=key_id, details=_check_details(details or {}))
    session.add(event)
    return event


def list_audit(session: Session, *, tenant: str | None = None, action: str | None = None,
               key_id: str | None = None, limit: int | None = None) -> list[AuditEntry]:
    """Events oldest first; with ``limit``, the most recent ``limit`` of them.

    ``tenant`` is a tenant name (unknown names raise :class:`~keys.errors.UnknownTenant`).
    """
    query = select(AuditEvent, Tenant.name).outerjoin(Tenant, Tenant.id == AuditEvent.tenant_id)
    if tenant is not None:
        # Names are unique without regard to case (keys.tenants); only ASCII is folded, so that
        # lower() never maps a non-ASCII letter (the Kelvin sign) onto a tenant's name.
        tenant_id = (session.scalar(select(Tenant.id).where(func.lower(Tenant.name) == tenant.lower()))
                     if isinstance(tenant, str) and tenant.isascii() else None)
        if tenant_id is None:
            raise UnknownTenant(tenant)
        query = query.where(AuditEvent.tenant_id == tenant_id)
    if action is not None:
        query = query.where(AuditEvent.action == action)
    if key_id is not None:
        query = query.where(AuditEvent.key_id == key_id)
    if limit is not None:
        if limit < 1:
            raise InvalidInput("--limit must be at least 1")
        query = query.order_by(AuditEvent.id.desc()).limit(limit)
    else:
        query = query.order_by(AuditEvent.id)
    rows = session.execute(query).all()
    entries = [AuditEntry(id=e.id, occurred_at=e.occurred_at, actor=e.actor, action=e.action,
                          tenant_id=e.tenant_id, tenant=name, key_id=e.key_id, details=e.details)
               for e, name in rows]
    return sorted(entries, key=lambda entry: entry.id)
