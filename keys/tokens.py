"""API bearer tokens: issued once, stored as a SHA-256 hash, revocable, expiring.

A token may carry an expiry (``expires_at``; the operator's default TTL is the CLI's,
HALLMARK_TOKEN_TTL_DAYS): past it, it authenticates no more. Rotation without downtime is
:func:`rotate_token`: a new token with the same reach, and the old one's expiry brought to the
end of an overlap, so clients switch while both work. When a gateway last saw each token is
kept apart (``api_token_uses``, :func:`record_uses`), since its role may not write ``api_tokens``.

A token is ``hm_`` followed by 43 URL-safe characters (256 random bits). With that much
entropy a plain SHA-256 is a safe verifier (no password-style stretching needed), and a
database reader learns nothing usable. The raw token exists only in :class:`IssuedToken`,
returned once to whoever issued it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Iterable

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from keys import clock
from keys.audit import record_audit
from keys.errors import InvalidInput, InvalidTransition, UnknownToken
from keys.models import ApiToken, ApiTokenUse, Tenant
from keys.tenants import get_tenant, new_id

TOKEN_PREFIX = "hm_"
TOKEN_RANDOM_BYTES = 32
DISPLAY_PREFIX_LENGTH = 11  # "hm_" and 8 random characters: tells tokens apart, reveals ~48 bits
_TOKEN_LENGTH = len(TOKEN_PREFIX) + len(secrets.token_urlsafe(TOKEN_RANDOM_BYTES))
KINDS = ("standard", "expert")
"""``standard``: a tenant's or an admin's token. ``expert``: a verified expert's detection
token (regulator, researcher, fact-checker): every tenant's keys, the full result, each
request audited (service/access)."""
METRICS_SCOPE = "metrics"
SCOPES = ("evidence", METRICS_SCOPE)
"""Extra scopes an admin grants: ``evidence`` lets a tenant token ask for per-token evidence
(each use audited and charged against its own small budget); ``metrics`` lets a token read
``/metrics`` on the API's port (a scraper's token need not be an admin's)."""


def well_formed(raw_token: str) -> bool:
    """Whether a presented token could be one this store issued (no lookup needed to refuse it)."""
    return isinstance(raw_token, str) and len(raw_token) == _TOKEN_LENGTH and raw_token.startswith(TOKEN_PREFIX)


def hash_token(raw_token: str) -> str:
    return hashlib.sha256(raw_token.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TokenInfo:
    token_id: str
    tenant_id: str | None
    tenant: str | None
    admin: bool
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    kind: str = "standard"
    scopes: tuple[str, ...] = ()
    expires_at: datetime | None = None
    last_used_at: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"token_id": self.token_id, "tenant": self.tenant, "tenant_id": self.tenant_id,
                "admin": self.admin, "prefix": self.prefix, "created_at": self.created_at.isoformat(),
                "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
                "kind": self.kind, "scopes": list(self.scopes),
                "expires_at": self.expires_at.isoformat() if self.expires_at else None,
                "last_used_at": self.last_used_at.isoformat() if self.last_used_at else None}


@dataclass(frozen=True)
class IssuedToken:
    """A newly issued token. ``raw_token`` is shown once and never stored."""

    info: TokenInfo
    raw_token: str = field(repr=False)


@dataclass(frozen=True)
class TokenIdentity:
    """Who a presented token speaks for. ``tenant_id`` None with ``admin``: every tenant."""

    token_id: str
    tenant_id: str | None
    tenant: str | None
    admin: bool
    kind: str = "standard"
    scopes: tuple[str, ...] = ()
    expires_at: datetime | None = None


def _scopes(row: ApiToken) -> tuple[str, ...]:
    return tuple(sorted(set((row.scopes or "").split())))


def _info(row: ApiToken, tenant_name: str | None, last_used_at: datetime | None = None) -> TokenInfo:
    return TokenInfo(token_id=row.id, tenant_id=row.tenant_id, tenant=tenant_name, admin=row.admin,
                     prefix=row.prefix, created_at=row.created_at, revoked_at=row.revoked_at,
                     kind=row.kind or "standard", scopes=_scopes(row), expires_at=row.expires_at,
                     last_used_at=last_used_at)


def _check_ttl(ttl: timedelta | None) -> timedelta | None:
    if ttl is not None and ttl <= timedelta(0):
        raise InvalidInput("a token's lifetime must be positive (or none: it never expires)")
    return ttl


def _check_scopes(scopes) -> tuple[str, ...]:
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown:
        raise InvalidInput(f"unknown scope {unknown[0]!r}; the scopes are: {', '.join(SCOPES)}")
    return tuple(sorted(set(scopes)))


def issue_token(session: Session, *, tenant: str | None, admin: bool = False, actor: str,
                now: datetime | None = None, expert: bool = False, scopes=(),
                ttl: timedelta | None = None) -> IssuedToken:
    """Issue a token for ``tenant`` (a name); ``admin`` without a tenant is a global admin
    token, ``admin`` with a tenant administers that tenant only; ``expert`` (no tenant, not
    admin) is a verified expert's detection token. ``scopes``: extra scopes (:data:`SCOPES`).
    ``ttl``: it expires that long after now (None: never). Audited (no token in it)."""
    scopes = _check_scopes(scopes)
    ttl = _check_ttl(ttl)
    if expert:
        if tenant is not None or admin:
            raise InvalidInput("an expert token is for detection across every tenant: give no --tenant "
                               "and no --admin")
    elif tenant is None and not admin:
        raise InvalidInput("a tenant token needs --tenant NAME; a global admin token needs --admin")
    now = clock.resolve(now)
    tenant_row = get_tenant(session, name=tenant) if tenant is not None else None
    raw = TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_RANDOM_BYTES)
    row = ApiToken(id=new_id("tok"), tenant_id=tenant_row.id if tenant_row else None,
                   token_hash=hash_token(raw), prefix=raw[:DISPLAY_PREFIX_LENGTH], admin=admin,
                   created_at=now, kind="expert" if expert else "standard", scopes=" ".join(scopes),
                   expires_at=now + ttl if ttl is not None else None)
    session.add(row)
    session.flush()
    record_audit(session, actor=actor, action="token.issued", tenant_id=row.tenant_id,
                 details={"token_id": row.id, "prefix": row.prefix, "admin": admin, "kind": row.kind,
                          "scopes": list(scopes),
                          "expires_at": row.expires_at.isoformat() if row.expires_at else None}, now=now)
    return IssuedToken(info=_info(row, tenant_row.name if tenant_row else None), raw_token=raw)


def revoke_token(session: Session, *, token_id: str, actor: str, now: datetime | None = None) -> TokenInfo:
    """Revoke a token (audited); :class:`InvalidTransition` if it already is."""
    now = clock.resolve(now)
    row = session.scalar(select(ApiToken).where(ApiToken.id == token_id).with_for_update())
    if row is None:
        raise UnknownToken(token_id)
    if row.revoked_at is not None:
        raise InvalidTransition(f"token {token_id} is already revoked; nothing changed")
    row.revoked_at = now
    session.flush()
    record_audit(session, actor=actor, action="token.revoked", tenant_id=row.tenant_id,
                 details={"token_id": row.id, "prefix": row.prefix, "admin": row.admin}, now=now)
    tenant = session.get(Tenant, row.tenant_id) if row.tenant_id else None
    return _info(row, tenant.name if tenant else None)


def rotate_token(session: Session, *, token_id: str, actor: str, overlap: timedelta = timedelta(days=1),
                 ttl: timedelta | None = None, now: datetime | None = None) -> tuple[IssuedToken, TokenInfo]:
    """Rotation without downtime: a new token with ``token_id``'s reach (tenant, admin, kind,
    scopes) and lifetime ``ttl`` (default: the old one's), while the old one keeps working for
    ``overlap`` more (never longer than it would have anyway). Returns (new, old); audited."""
    now = clock.resolve(now)
    if overlap < timedelta(0):
        raise InvalidInput("the overlap cannot be negative")
    row = session.scalar(select(ApiToken).where(ApiToken.id == token_id).with_for_update())
    if row is None:
        raise UnknownToken(token_id)
    if row.revoked_at is not None or (row.expires_at is not None and row.expires_at <= now):
        raise InvalidTransition(f"token {token_id} is revoked or expired; issue a new one instead")
    if ttl is None and row.expires_at is not None:
        ttl = max(row.expires_at - row.created_at, timedelta(seconds=1))
    tenant = session.get(Tenant, row.tenant_id) if row.tenant_id else None
    issued = issue_token(session, tenant=tenant.name if tenant else None, admin=row.admin, actor=actor, now=now,
                         expert=row.kind == "expert", scopes=_scopes(row), ttl=ttl)
    ends = now + overlap
    row.expires_at = ends if row.expires_at is None else min(row.expires_at, ends)
    session.flush()
    record_audit(session, actor=actor, action="token.rotated", tenant_id=row.tenant_id,
                 details={"token_id": row.id, "prefix": row.prefix, "new_token_id": issued.info.token_id,
                          "old_expires_at": row.expires_at.isoformat()}, now=now)
    return issued, _info(row, tenant.name if tenant else None)


def record_uses(session: Session, uses: dict[str, datetime]) -> None:
    """Keep when each token (id -> time) was last seen (a later time wins; unknown ids ignored)."""
    if not uses:
        return
    known = set(session.scalars(select(ApiToken.id).where(ApiToken.id.in_(list(uses)))))
    rows = [{"token_id": k, "last_used_at": v} for k, v in uses.items() if k in known]
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    statement = insert(ApiTokenUse).values(rows)
    later = func.greatest if dialect == "postgresql" else func.max
    session.execute(statement.on_conflict_do_update(index_elements=["token_id"], set_={
        "last_used_at": later(ApiTokenUse.last_used_at, statement.excluded.last_used_at)}))


def last_uses(session: Session, token_ids: Iterable[str]) -> dict[str, datetime]:
    ids = list(token_ids)
    if not ids:
        return {}
    return dict(session.execute(select(ApiTokenUse.token_id, ApiTokenUse.last_used_at)
                                .where(ApiTokenUse.token_id.in_(ids))).all())


def grant_scope(session: Session, *, token_id: str, scope: str, actor: str, grant: bool = True,
                now: datetime | None = None) -> TokenInfo:
    """Grant (or withdraw) one of :data:`SCOPES` on a token; audited."""
    _check_scopes([scope])
    now = clock.resolve(now)
    row = session.scalar(select(ApiToken).where(ApiToken.id == token_id).with_for_update())
    if row is None:
        raise UnknownToken(token_id)
    scopes = set(_scopes(row))
    if grant and scope == "evidence" and row.tenant_id is None and not row.admin and row.kind == "expert":
        raise InvalidTransition("an expert token already sees per-token evidence; nothing changed")
    (scopes.add if grant else scopes.discard)(scope)
    row.scopes = " ".join(sorted(scopes))
    session.flush()
    record_audit(session, actor=actor, action="token.scope_granted" if grant else "token.scope_withdrawn",
                 tenant_id=row.tenant_id, details={"token_id": row.id, "prefix": row.prefix, "scope": scope},
                 now=now)
    tenant = session.get(Tenant, row.tenant_id) if row.tenant_id else None
    return _info(row, tenant.name if tenant else None)


def list_tokens(session: Session, *, tenant: str | None = None) -> list[TokenInfo]:
    query = select(ApiToken, Tenant.name).outerjoin(Tenant, Tenant.id == ApiToken.tenant_id)
    if tenant is not None:
        query = query.where(ApiToken.tenant_id == get_tenant(session, name=tenant).id)
    found = session.execute(query.order_by(ApiToken.created_at, ApiToken.id)).all()
    uses = last_uses(session, [row.id for row, _ in found])
    return [_info(row, name, uses.get(row.id)) for row, name in found]


def authenticate_token(session: Session, *, raw_token: str, now: datetime | None = None) -> TokenIdentity | None:
    """The identity behind a presented token, or None if it is malformed, unknown, revoked or expired."""
    if not isinstance(raw_token, str) or len(raw_token) != _TOKEN_LENGTH \
            or not raw_token.startswith(TOKEN_PREFIX):
        return None
    digest = hash_token(raw_token)
    found = session.execute(
        select(ApiToken, Tenant.name).outerjoin(Tenant, Tenant.id == ApiToken.tenant_id)
        .where(ApiToken.token_hash == digest)
    ).first()
    if found is None:
        return None
    row, tenant_name = found
    # The lookup matched on the hash already; the constant-time compare is defence in depth.
    if not hmac.compare_digest(row.token_hash, digest) or row.revoked_at is not None:
        return None
    if row.expires_at is not None and row.expires_at <= clock.resolve(now):
        return None
    return TokenIdentity(token_id=row.id, tenant_id=row.tenant_id, tenant=tenant_name, admin=row.admin,
                         kind=row.kind or "standard", scopes=_scopes(row), expires_at=row.expires_at)
