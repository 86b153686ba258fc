"""Tenants: who keys, tokens and generations belong to."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from keys import clock
from keys.audit import record_audit
from keys.errors import DuplicateTenant, InvalidInput, UnknownTenant
from keys.models import Tenant

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def new_id(prefix: str) -> str:
    """A random public identifier such as ``key_3f9c0a1b2c3d4e5f`` (not a secret)."""
    return f"{prefix}_{secrets.token_hex(8)}"


@dataclass(frozen=True)
class TenantInfo:
    id: str
    name: str
    created_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "created_at": self.created_at.isoformat()}


def _info(row: Tenant) -> TenantInfo:
    return TenantInfo(id=row.id, name=row.name, created_at=row.created_at)


def check_name(name: str) -> str:
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None:
        raise InvalidInput(f"invalid tenant name {name!r}: use 1-64 letters, digits, '.', '_' or "
                           "'-', starting with a letter or digit")
    return name


def get_tenant(session: Session, *, name: str, lock: bool = False) -> Tenant:
    """The tenant row named ``name``; ``lock`` takes a row lock (SELECT ... FOR UPDATE)
    that serialises key changes of this tenant on PostgreSQL."""
    query = select(Tenant).where(Tenant.name == name)
    if lock:
        query = query.with_for_update()
    row = session.scalar(query)
    if row is None:
        raise UnknownTenant(name)
    return row


def get_tenant_by_id(session: Session, *, tenant_id: str, lock: bool = False) -> Tenant:
    query = select(Tenant).where(Tenant.id == tenant_id)
    if lock:
        query = query.with_for_update()
    row = session.scalar(query)
    if row is None:
        raise UnknownTenant(tenant_id, is_id=True)
    return row


def create_tenant(session: Session, *, name: str, actor: str, now: datetime | None = None) -> TenantInfo:
    """Create a tenant (audited). :class:`~keys.errors.DuplicateTenant` if the name is taken."""
    check_name(name)
    if session.scalar(select(Tenant.id).where(Tenant.name == name)) is not None:
        raise DuplicateTenant(name)
    created = clock.resolve(now)
    row = Tenant(id=new_id("ten"), name=name, created_at=created)
    session.add(row)
    try:
        session.flush()
    except IntegrityError:
        raise DuplicateTenant(name) from None  # created concurrently since the check above
    record_audit(session, actor=actor, action="tenant.created", tenant_id=row.id,
                 details={"name": name}, now=created)
    return _info(row)


def list_tenants(session: Session) -> list[TenantInfo]:
    return [_info(row) for row in session.scalars(select(Tenant).order_by(Tenant.name))]
