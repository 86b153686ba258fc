"""Tenants: who keys, tokens and generations belong to.

A tenant's name keeps the case the admin typed (it is shown so), but names are unique
without regard to case: ``Acme`` cannot be created beside ``acme``, and a lookup by name
matches any case (``ACME`` finds ``acme``), as a person reading them would expect. The
database enforces it with a unique index on ``lower(name)`` (migration 0007); names are
ASCII, so Python's and both databases' ``lower()`` agree.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
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


def same_name(a: str, b: str) -> bool:
    """Whether two tenant names name the same tenant (names are unique without regard to
    case; a string that is not a tenant name matches nothing, so lower() never folds a
    non-ASCII letter into an ASCII one)."""
    return (isinstance(a, str) and isinstance(b, str) and NAME_PATTERN.fullmatch(a) is not None
            and NAME_PATTERN.fullmatch(b) is not None and a.lower() == b.lower())


def get_tenant(session: Session, *, name: str, lock: bool = False) -> Tenant:
    """The tenant row named ``name`` in any case; ``lock`` takes a row lock (SELECT ... FOR UPDATE)
    that serialises key changes of this tenant on PostgreSQL."""
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None:
        # No tenant has such a name; and lower() must not fold a non-ASCII letter into an
        # ASCII one (Python maps the Kelvin sign U+212A to 'k').
        raise UnknownTenant(name)
    query = select(Tenant).where(func.lower(Tenant.name) == name.lower())
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
    """Create a tenant (audited), its name kept as given. :class:`~keys.errors.DuplicateTenant`
    if the name is taken in any case (the error names the existing spelling)."""
    check_name(name)
    existing = session.scalar(select(Tenant.name).where(func.lower(Tenant.name) == name.lower()))
    if existing is not None:
        raise DuplicateTenant(existing)
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


def set_public_attribution(session: Session, *, name: str, on: bool, actor: str,
                           now: datetime | None = None) -> TenantInfo:
    """Whether the public detection check may name tenant ``name`` (its opt-in); audited."""
    row = get_tenant(session, name=name, lock=True)
    row.public_attribution = on
    session.flush()
    record_audit(session, actor=actor, action="tenant.public_attribution", tenant_id=row.id,
                 details={"name": row.name, "on": on}, now=clock.resolve(now))
    return _info(row)


def list_tenants(session: Session) -> list[TenantInfo]:
    # Alphabetical without regard to case, the same on both databases (PostgreSQL's collation
    # and SQLite's binary order disagree on case).
    return [_info(row) for row in session.scalars(select(Tenant).order_by(func.lower(Tenant.name)))]
