"""The store's tables (SQLAlchemy 2, typed): tenants, watermark keys, API tokens, the
provenance ledger and the audit log.

The schema is created only by the Alembic migrations in ``migrations/``; a test proves
they produce exactly these tables. The audit log is append-only: the ORM refuses to
update or delete an :class:`AuditEvent` (below), and the migration adds database
triggers that refuse it to plain SQL as well.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    event,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, ORMExecuteState, Session, mapped_column
from sqlalchemy.types import TypeDecorator

from keys.errors import AuditLogImmutable

ACTIVE = "active"
VERIFY_ONLY = "verify-only"
REVOKED = "revoked"
KEY_STATES: tuple[str, ...] = (ACTIVE, VERIFY_ONLY, REVOKED)

ID_LENGTH = 32
NAME_LENGTH = 64

# Deterministic constraint names, so migrations can name what they create and drop.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in, timezone-aware UTC out, on both databases.

    SQLite has no time zones: the value is stored as naive UTC and marked UTC on the way
    back. PostgreSQL stores ``timestamptz`` and gets an aware value.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("naive datetime given to a UTC column; use an aware datetime")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON()}


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)
    created_at: Mapped[datetime]


class WatermarkKey(Base):
    """One version of a tenant's watermark key. The secret is stored only wrapped."""

    __tablename__ = "watermark_keys"
    __table_args__ = (
        UniqueConstraint("tenant_id", "version"),
        CheckConstraint("version >= 1", name="version_positive"),
        CheckConstraint(f"state IN {KEY_STATES!r}", name="state_known"),
        CheckConstraint("(state = 'revoked') = (revoked_at IS NOT NULL)",
                        name="revoked_iff_revoked_at"),
        # At most one active key per tenant, whatever the application does.
        Index("uq_watermark_keys_one_active_per_tenant", "tenant_id", unique=True,
              sqlite_where=text("state = 'active'"), postgresql_where=text("state = 'active'")),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="RESTRICT"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    wrapped_secret: Mapped[bytes] = mapped_column(LargeBinary)
    """AES-256-GCM ciphertext and tag of the 8-byte secret (see keys.envelope)."""
    nonce: Mapped[bytes] = mapped_column(LargeBinary)
    kek_id: Mapped[str] = mapped_column(String(ID_LENGTH), index=True)
    spec: Mapped[dict[str, Any]]
    """WatermarkSpec.public_dict(): algorithm, context width, alpha, dedup, PRF, coin."""
    fingerprint: Mapped[str] = mapped_column(String(ID_LENGTH), unique=True)
    state: Mapped[str] = mapped_column(String(16))
    imported: Mapped[bool] = mapped_column(default=False)
    import_source: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime]
    activated_at: Mapped[datetime | None]
    verify_only_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    revocation_reason: Mapped[str | None] = mapped_column(Text)


class ApiToken(Base):
    """An API bearer token, stored as its SHA-256 only. No tenant: a global admin token."""

    __tablename__ = "api_tokens"
    __table_args__ = (
        CheckConstraint("admin OR tenant_id IS NOT NULL", name="tenant_or_admin"),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant_id: Mapped[str | None] = mapped_column(ForeignKey("tenants.id", ondelete="RESTRICT"),
                                                  index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    """The token's first characters, to tell tokens apart in listings."""
    admin: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]


class RateLimitBucket(Base):
    """A token bucket shared by every gateway replica on this database (see
    :mod:`service.limits`): its level and when it was last updated, in the database's
    clock (epoch seconds), so that replicas' clocks never matter."""

    __tablename__ = "rate_limit_buckets"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    level: Mapped[float] = mapped_column(Double())
    updated: Mapped[float] = mapped_column(Double())


class GenerationRecord(Base):
    """The provenance ledger: one row per generation, the output only as a hash."""

    __tablename__ = "generation_records"
    __table_args__ = (
        CheckConstraint("(key_id IS NULL) = (key_version IS NULL)", name="key_and_version"),
        CheckConstraint("prompt_tokens >= 0 AND output_tokens >= 0 AND watermarked_tokens >= 0 "
                        "AND watermarked_tokens <= output_tokens", name="token_counts"),
        Index(None, "tenant_id", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="RESTRICT"))
    key_id: Mapped[str | None] = mapped_column(ForeignKey("watermark_keys.id", ondelete="RESTRICT"),
                                               index=True)
    key_version: Mapped[int | None] = mapped_column(Integer)
    engine: Mapped[str] = mapped_column(String(NAME_LENGTH))
    model: Mapped[str] = mapped_column(String(200))
    spec: Mapped[dict[str, Any] | None]
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    watermarked_tokens: Mapped[int] = mapped_column(Integer)
    unwatermarked_reason: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    output_sha256: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime]


class AuditEvent(Base):
    """One audited change. Append-only. Tenant and key ids are plain columns, not foreign
    keys, so that no later change to those tables can ever be blocked by, or rewrite, the log."""

    __tablename__ = "audit_events"

    # BIGINT on PostgreSQL; SQLite only auto-increments a column declared INTEGER.
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer(), "sqlite"),
                                    primary_key=True, autoincrement=True)
    occurred_at: Mapped[datetime] = mapped_column(index=True)
    actor: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(NAME_LENGTH), index=True)
    tenant_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), index=True)
    key_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), index=True)
    details: Mapped[dict[str, Any]]


@event.listens_for(AuditEvent, "before_update")
@event.listens_for(AuditEvent, "before_delete")
def _refuse_audit_change(mapper: Any, connection: Any, target: AuditEvent) -> None:
    raise AuditLogImmutable()


@event.listens_for(Session, "do_orm_execute")
def _refuse_bulk_audit_change(state: ORMExecuteState) -> None:
    # Bulk UPDATE/DELETE statements skip the per-object mapper events above.
    if (state.is_update or state.is_delete) and any(
        m.class_ is AuditEvent for m in state.all_mappers
    ):
        raise AuditLogImmutable()
