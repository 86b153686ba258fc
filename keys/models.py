"""The store's tables (SQLAlchemy 2, typed): tenants, watermark keys, API tokens, the
provenance ledger and the audit log.

The schema is created only by the Alembic migrations in ``migrations/``; a test proves
they produce exactly these tables. The audit log and the provenance ledger are append-only: the ORM refuses to
update or delete an :class:`AuditEvent` or a :class:`LedgerEntry` (below), and the
migrations add database triggers that refuse it to plain SQL as well.
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
    SmallInteger,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    event,
    false,
    func,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, ORMExecuteState, Session, mapped_column
from sqlalchemy.types import TypeDecorator

from keys.errors import AuditLogImmutable, LedgerImmutable
from watermark.key import fingerprint_of_check_value

ACTIVE = "active"
VERIFY_ONLY = "verify-only"
REVOKED = "revoked"
KEY_STATES: tuple[str, ...] = (ACTIVE, VERIFY_ONLY, REVOKED)
LEDGER_KINDS: tuple[str, ...] = ("started", "checkpoint", "finished")
SIGNING_KEY_STATES: tuple[str, ...] = ("active", "retired")

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


def partial_unique_index(name: str, *columns: str, where: str) -> Index:
    """A unique index over the rows matching ``where``, on both databases.

    Only SQLite's option is named here: naming a ``postgresql_*`` option makes SQLAlchemy
    import its whole PostgreSQL dialect (the asyncpg, psycopg and pg8000 modules too), about
    6% of a store command's start-up on SQLite, for a predicate that only DDL uses, and the
    schema's DDL is the migrations'. They give PostgreSQL the same predicate, and
    tests/keys/test_migrations.py checks it on both databases against this one.
    """
    return Index(name, *columns, unique=True, sqlite_where=text(where))


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON()}


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)
    """As the admin typed it; unique without regard to case (keys/tenants.py)."""

    __table_args__ = (Index("uq_tenants_name_lower", func.lower(name), unique=True),)
    created_at: Mapped[datetime]
    public_attribution: Mapped[bool] = mapped_column(default=False, server_default=false())
    """Whether the public detection check may name this tenant (the tenant opted in)."""


class KeyRow(Base):
    """One version of a tenant's watermark key. The secret is stored only wrapped."""

    __tablename__ = "watermark_keys"
    __table_args__ = (
        UniqueConstraint("tenant_id", "version"),
        CheckConstraint("version >= 1", name="version_positive"),
        CheckConstraint(f"state IN {KEY_STATES!r}", name="state_known"),
        CheckConstraint("(state = 'revoked') = (revoked_at IS NOT NULL)",
                        name="revoked_iff_revoked_at"),
        # At most one active key per tenant, whatever the application does.
        partial_unique_index("uq_watermark_keys_one_active_per_tenant", "tenant_id", where="state = 'active'"),
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
    """watermark.key.check_value(secret): 64 bits that confirm a guessed secret, so private
    to the store (unwrap check, duplicate imports). Show :attr:`shown_fingerprint` instead."""
    state: Mapped[str] = mapped_column(String(16))
    imported: Mapped[bool] = mapped_column(default=False)
    import_source: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime]
    activated_at: Mapped[datetime | None]
    verify_only_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    revocation_reason: Mapped[str | None] = mapped_column(Text)

    @property
    def shown_fingerprint(self) -> str:
        """The public 24-bit fingerprint (watermark.key.fingerprint of the secret)."""
        return fingerprint_of_check_value(self.fingerprint)


class ApiToken(Base):
    """An API bearer token, stored as its SHA-256 only. No tenant: a global admin token."""

    __tablename__ = "api_tokens"
    __table_args__ = (
        CheckConstraint("admin OR tenant_id IS NOT NULL OR kind = 'expert'", name="tenant_or_admin"),
        CheckConstraint("kind IN ('standard', 'expert')", name="kind"),
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
    kind: Mapped[str] = mapped_column(String(16), default="standard", server_default="standard")
    """``standard`` (a tenant's or an admin's token) or ``expert`` (a verified expert's
    detection token: every tenant's keys, the full result, each request audited)."""
    scopes: Mapped[str] = mapped_column(String(200), default="")
    """Space-separated extra scopes an admin granted (``evidence``: per-token evidence)."""
    expires_at: Mapped[datetime | None]
    """When it stops working (None: never). Rotation sets the old token's to the overlap's end."""


class ApiTokenUse(Base):
    """When a gateway last saw a token (at most once a minute per process; keys.tokens)."""

    __tablename__ = "api_token_uses"

    token_id: Mapped[str] = mapped_column(ForeignKey("api_tokens.id", ondelete="CASCADE"), primary_key=True)
    last_used_at: Mapped[datetime]


class RateLimitBucket(Base):
    """A token bucket shared by every gateway replica on this database (see
    :mod:`service.limits`): its level and when it was last updated, in the database's
    clock (epoch seconds), so that replicas' clocks never matter."""

    __tablename__ = "rate_limit_buckets"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    level: Mapped[float] = mapped_column(Double())
    updated: Mapped[float] = mapped_column(Double())
    rate: Mapped[float | None] = mapped_column(Double(), nullable=True)
    """Pinned at creation on PostgreSQL (``hallmark_take_bucket``, migration 0013): a caller
    passing a larger rate or burst refills nothing."""
    burst: Mapped[float | None] = mapped_column(Double(), nullable=True)


class ProbeQuery(Base):
    """The probe guard's memory of one detection query (service/access/probe.py): keyed
    hashes of its k-grams, never text, for 24 hours. ``principal`` is a keyed hash of who
    asked; ``family`` the first query of the text family it belongs to."""

    __tablename__ = "probe_queries"
    __table_args__ = (Index("ix_probe_queries_principal_created", "principal", "created"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    principal: Mapped[str] = mapped_column(String(64))
    family: Mapped[str] = mapped_column(String(32))
    created: Mapped[float] = mapped_column(Double(), index=True)
    hashes: Mapped[bytes] = mapped_column(LargeBinary())


class AccessSpend(Base):
    """One charge against a detection budget (service/access/budgets.py): a budget's level is
    its day's allowance less the sum of its rows of the last 24 hours. Rows are only ever
    inserted (on PostgreSQL the service role may not update or delete them, and a negative
    row must give back part of a reservation of the last ten minutes, once: migration 0012),
    so a leaked database credential cannot reset a budget."""

    __tablename__ = "access_spend"
    __table_args__ = (Index("ix_access_spend_name_created", "name", "created"),
                      CheckConstraint("amount >= 0 OR settles IS NOT NULL", name="refund_settles"))

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    amount: Mapped[float] = mapped_column(Double())
    created: Mapped[float] = mapped_column(Double(), index=True)
    settles: Mapped[str | None] = mapped_column(String(32), nullable=True, unique=True)


class LedgerEntry(Base):
    """The provenance ledger: an append-only, per-tenant hash chain of generation events.

    One generation is one or more entries sharing ``generation_id``: ``started`` (a stream,
    written before its first token leaves), ``checkpoint`` (a stream, at most every 32
    tokens, covering what is about to be sent), ``finished`` (the last entry, with its
    ``finish_reason``). Every entry carries the whole record (tenant, key, spec, counts and
    hashes of the output so far), so each one stands alone as evidence. ``seq`` counts a
    tenant's entries from 1 and ``prev_hash`` is the previous entry's ``entry_hash``
    (:mod:`ledger.chain` documents the canonical encoding). Append-only: the ORM refuses
    updates and deletes, and the migration adds database triggers that refuse them to plain
    SQL as well.
    """

    __tablename__ = "ledger_entries"
    __table_args__ = (
        UniqueConstraint("tenant_id", "seq"),
        CheckConstraint("seq >= 1", name="seq_positive"),
        CheckConstraint(f"kind IN {LEDGER_KINDS!r}", name="kind_known"),
        CheckConstraint("(key_id IS NULL) = (key_version IS NULL)", name="key_and_version"),
        CheckConstraint("prompt_tokens >= 0 AND output_tokens >= 0 AND watermarked_tokens >= 0 "
                        "AND watermarked_tokens <= output_tokens", name="token_counts"),
        CheckConstraint("(kind = 'finished') = (finish_reason IS NOT NULL)", name="finish_reason_iff_finished"),
        # At most one start and one end per generation, whatever the application does.
        partial_unique_index("uq_ledger_entries_one_start", "generation_id", where="kind = 'started'"),
        partial_unique_index("uq_ledger_entries_one_finish", "generation_id", where="kind = 'finished'"),
    )

    # BIGINT on PostgreSQL; SQLite only auto-increments a column declared INTEGER.
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer(), "sqlite"),
                                    primary_key=True, autoincrement=True)
    """Insertion order across tenants (not hashed: the chain is per tenant)."""
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="RESTRICT"))
    seq: Mapped[int] = mapped_column(BigInteger().with_variant(Integer(), "sqlite"))
    prev_hash: Mapped[str] = mapped_column(String(64))
    entry_hash: Mapped[str] = mapped_column(String(64), unique=True)
    generation_id: Mapped[str] = mapped_column(String(ID_LENGTH), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    writer: Mapped[str] = mapped_column(String(200))
    """The process that wrote the entry (host/pid/start), to tell a dead stream from a live one."""
    key_id: Mapped[str | None] = mapped_column(ForeignKey("watermark_keys.id", ondelete="RESTRICT"),
                                               index=True)
    key_version: Mapped[int | None] = mapped_column(Integer)
    key_state: Mapped[str | None] = mapped_column(String(16))
    """The key's state when the entry was written (a key revoked mid-generation shows here)."""
    engine: Mapped[str] = mapped_column(String(NAME_LENGTH))
    model: Mapped[str] = mapped_column(String(200))
    spec: Mapped[dict[str, Any] | None]
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    watermarked_tokens: Mapped[int] = mapped_column(Integer)
    unwatermarked_reason: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    output_sha256: Mapped[str] = mapped_column(String(64), index=True)
    token_ids_sha256: Mapped[str | None] = mapped_column(String(64))
    """None only for records carried over from before the chain (they kept no token ids)."""
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    details: Mapped[dict[str, Any] | None]
    """Small JSON facts, e.g. a remote output's measured ``log10_p``."""


class SigningKey(Base):
    """An Ed25519 key that signs receipts and detection reports; the private half is
    stored only wrapped under the KEK (AES-256-GCM, bound to the key id)."""

    __tablename__ = "signing_keys"
    __table_args__ = (
        CheckConstraint(f"state IN {SIGNING_KEY_STATES!r}", name="state_known"),
        partial_unique_index("uq_signing_keys_one_active", "state", where="state = 'active'"),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    public_key: Mapped[bytes] = mapped_column(LargeBinary)
    wrapped_private: Mapped[bytes] = mapped_column(LargeBinary)
    nonce: Mapped[bytes] = mapped_column(LargeBinary)
    kek_id: Mapped[str] = mapped_column(String(ID_LENGTH), index=True)
    state: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    retired_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    """Set when the key was revoked (compromised): no statement it signed is trusted."""
    revocation_reason: Mapped[str | None] = mapped_column(Text)


class StoreKek(Base):
    """One row: the id of the KEK every wrapped secret of the store is under. Writers of
    wrapped secrets lock it shared and KEK rotation locks it exclusively, so no secret can
    be written under a KEK that a concurrent rotation is retiring."""

    __tablename__ = "store_kek"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    kek_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    changed_at: Mapped[datetime | None]


class LogKey(Base):
    """The transparency log's long-lived Ed25519 key (one row): signs checkpoints and keys
    the MACs of the log's head and leaves. Sealed under the KEK like a signing key."""

    __tablename__ = "log_keys"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    origin: Mapped[str] = mapped_column(String(200))
    public_key: Mapped[bytes] = mapped_column(LargeBinary)
    wrapped_private: Mapped[bytes] = mapped_column(LargeBinary)
    nonce: Mapped[bytes] = mapped_column(LargeBinary)
    kek_id: Mapped[str] = mapped_column(String(ID_LENGTH), index=True)
    created_at: Mapped[datetime]


class LogHead(Base):
    """One row: the log's size and the right border of its tree (the roots of its complete
    subtrees, 32 bytes each, largest first), MACed under the log key. Appends lock it."""

    __tablename__ = "log_head"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    size: Mapped[int] = mapped_column(BigInteger().with_variant(Integer(), "sqlite"))
    border: Mapped[bytes] = mapped_column(LargeBinary)
    mac: Mapped[bytes | None] = mapped_column(LargeBinary)
    updated_at: Mapped[datetime | None]


class LogLeaf(Base):
    """One leaf of the log: a ledger entry or a signing-key event (ledger.log.tlog)."""

    __tablename__ = "log_leaves"
    __table_args__ = (CheckConstraint("kind IN ('entry', 'signing_key')", name="kind_known"),)

    idx: Mapped[int] = mapped_column(BigInteger().with_variant(Integer(), "sqlite"), primary_key=True,
                                     autoincrement=False)
    leaf_hash: Mapped[bytes] = mapped_column(LargeBinary)
    kind: Mapped[str] = mapped_column(String(16))
    entry_id: Mapped[int | None] = mapped_column(BigInteger().with_variant(Integer(), "sqlite"), unique=True)
    tenant_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    kgrams_sha256: Mapped[str | None] = mapped_column(String(64))
    kid: Mapped[str | None] = mapped_column(String(ID_LENGTH), index=True)
    data: Mapped[bytes | None] = mapped_column(LargeBinary)
    """A signing-key event's canonical JSON (public); None for entries (the leaf is their hash)."""
    mac: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime]


class LogNode(Base):
    """A complete subtree of level >= 1 (leaves [idx * 2**level, (idx + 1) * 2**level))."""

    __tablename__ = "log_nodes"

    level: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    idx: Mapped[int] = mapped_column(BigInteger().with_variant(Integer(), "sqlite"), primary_key=True,
                                     autoincrement=False)
    hash: Mapped[bytes] = mapped_column(LargeBinary)


class LogCheckpoint(Base):
    """A published checkpoint (C2SP signed note), what witnesses are handed."""

    __tablename__ = "log_checkpoints"

    size: Mapped[int] = mapped_column(BigInteger().with_variant(Integer(), "sqlite"), primary_key=True,
                                      autoincrement=False)
    root: Mapped[bytes] = mapped_column(LargeBinary)
    note: Mapped[str] = mapped_column(Text)
    published_at: Mapped[datetime]


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


@event.listens_for(LedgerEntry, "before_update")
@event.listens_for(LedgerEntry, "before_delete")
@event.listens_for(LogLeaf, "before_update")
@event.listens_for(LogLeaf, "before_delete")
@event.listens_for(LogNode, "before_update")
@event.listens_for(LogNode, "before_delete")
@event.listens_for(LogCheckpoint, "before_update")
@event.listens_for(LogCheckpoint, "before_delete")
def _refuse_ledger_change(mapper: Any, connection: Any, target: Any) -> None:
    raise LedgerImmutable()


@event.listens_for(Session, "do_orm_execute")
def _refuse_bulk_audit_change(state: ORMExecuteState) -> None:
    # Bulk UPDATE/DELETE statements skip the per-object mapper events above.
    if state.is_update or state.is_delete:
        classes = {m.class_ for m in state.all_mappers}
        if AuditEvent in classes:
            raise AuditLogImmutable()
        if classes & {LedgerEntry, LogLeaf, LogNode, LogCheckpoint}:
            raise LedgerImmutable()


class LedgerKgram(Base):
    """Keyed hashes of a recorded generation's token k-grams (see :mod:`ledger.kgrams`): lets
    detection match an edited copy to its generation without storing text or token ids.
    Each digest is an HMAC under a key held only wrapped under the KEK (``scheme``: derived
    from the generation's watermark key secret, or the store's one k-gram key), so the rows
    are useless without the store. Written in the ledger entry's transaction."""

    __tablename__ = "ledger_kgrams"
    __table_args__ = (
        Index("ix_ledger_kgrams_key_digest", "key_id", "digest"),
        # Scheme 2's one look-up per text: every tenant (digest), or one (digest, tenant_id).
        Index("ix_ledger_kgrams_digest_tenant", "digest", "tenant_id"),
        # Which keys have scheme 1 rows (ledger.kgrams.KgramCache.v1_keys): empty on a store
        # that never recorded any, so the question costs nothing there. SQLite's predicate
        # only (partial_unique_index says why); migration 0010 gives PostgreSQL the same.
        Index("ix_ledger_kgrams_v1_key", "key_id", sqlite_where=text("scheme = 1")),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer(), "sqlite"),
                                    primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="RESTRICT"))
    generation_id: Mapped[str] = mapped_column(String(ID_LENGTH), index=True)
    key_id: Mapped[str] = mapped_column(ForeignKey("watermark_keys.id", ondelete="RESTRICT"))
    digest: Mapped[int] = mapped_column(BigInteger())
    """The first 63 bits of HMAC-SHA256(k-gram key, k token ids as 4-byte big-endian)."""
    scheme: Mapped[int] = mapped_column(SmallInteger(), default=1, server_default="1")
    """Which k-gram key: 1, the generation's watermark key's; 2, the store's (ledger.kgrams)."""
