"""Initial schema: tenants, watermark keys, API tokens, provenance ledger, audit log.

Revision ID: 0001
Revises:
Create Date: 2026-12-02

Written out in full rather than importing keys.models: a migration must keep describing
the schema of its day after the models move on. tests/keys/test_migrations.py proves the
result equals the models on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_APPEND_ONLY = "audit_events is append-only"


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )

    op.create_table(
        "watermark_keys",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("tenant_id", sa.String(32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("wrapped_secret", sa.LargeBinary(), nullable=False),
        sa.Column("nonce", sa.LargeBinary(), nullable=False),
        sa.Column("kek_id", sa.String(32), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("fingerprint", sa.String(32), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("imported", sa.Boolean(), nullable=False),
        sa.Column("import_source", sa.String(200), nullable=True),
        _ts("created_at"),
        _ts("activated_at", nullable=True),
        _ts("verify_only_at", nullable=True),
        _ts("revoked_at", nullable=True),
        sa.Column("revocation_reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_watermark_keys")),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="RESTRICT",
                                name=op.f("fk_watermark_keys_tenant_id_tenants")),
        sa.UniqueConstraint("tenant_id", "version", name=op.f("uq_watermark_keys_tenant_id_version")),
        sa.UniqueConstraint("fingerprint", name=op.f("uq_watermark_keys_fingerprint")),
        sa.CheckConstraint("version >= 1", name=op.f("ck_watermark_keys_version_positive")),
        sa.CheckConstraint("state IN ('active', 'verify-only', 'revoked')",
                           name=op.f("ck_watermark_keys_state_known")),
        sa.CheckConstraint("(state = 'revoked') = (revoked_at IS NOT NULL)",
                           name=op.f("ck_watermark_keys_revoked_iff_revoked_at")),
    )
    op.create_index(op.f("ix_watermark_keys_tenant_id"), "watermark_keys", ["tenant_id"])
    op.create_index(op.f("ix_watermark_keys_kek_id"), "watermark_keys", ["kek_id"])
    # One active key per tenant, enforced by the database even against a buggy writer.
    op.create_index("uq_watermark_keys_one_active_per_tenant", "watermark_keys", ["tenant_id"],
                    unique=True, sqlite_where=sa.text("state = 'active'"),
                    postgresql_where=sa.text("state = 'active'"))

    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("tenant_id", sa.String(32), nullable=True),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("admin", sa.Boolean(), nullable=False),
        _ts("created_at"),
        _ts("revoked_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="RESTRICT",
                                name=op.f("fk_api_tokens_tenant_id_tenants")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
        sa.CheckConstraint("admin OR tenant_id IS NOT NULL", name=op.f("ck_api_tokens_tenant_or_admin")),
    )
    op.create_index(op.f("ix_api_tokens_tenant_id"), "api_tokens", ["tenant_id"])

    op.create_table(
        "generation_records",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("tenant_id", sa.String(32), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("key_version", sa.Integer(), nullable=True),
        sa.Column("engine", sa.String(64), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("watermarked_tokens", sa.Integer(), nullable=False),
        sa.Column("unwatermarked_reason", sa.String(64), nullable=True),
        sa.Column("output_sha256", sa.String(64), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_generation_records")),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="RESTRICT",
                                name=op.f("fk_generation_records_tenant_id_tenants")),
        sa.ForeignKeyConstraint(["key_id"], ["watermark_keys.id"], ondelete="RESTRICT",
                                name=op.f("fk_generation_records_key_id_watermark_keys")),
        sa.CheckConstraint("(key_id IS NULL) = (key_version IS NULL)",
                           name=op.f("ck_generation_records_key_and_version")),
        sa.CheckConstraint("prompt_tokens >= 0 AND output_tokens >= 0 AND watermarked_tokens >= 0 "
                           "AND watermarked_tokens <= output_tokens",
                           name=op.f("ck_generation_records_token_counts")),
    )
    op.create_index(op.f("ix_generation_records_tenant_id_created_at"), "generation_records",
                    ["tenant_id", "created_at"])
    op.create_index(op.f("ix_generation_records_key_id"), "generation_records", ["key_id"])
    op.create_index(op.f("ix_generation_records_output_sha256"), "generation_records",
                    ["output_sha256"])

    op.create_table(
        "audit_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True,
                  nullable=False),
        _ts("occurred_at"),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("tenant_id", sa.String(32), nullable=True),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_events")),
    )
    for column in ("occurred_at", "action", "tenant_id", "key_id"):
        op.create_index(op.f(f"ix_audit_events_{column}"), "audit_events", [column])

    # Append-only below the ORM too: plain SQL cannot rewrite or erase the audit log.
    if op.get_context().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION hallmark_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN RAISE EXCEPTION '{_APPEND_ONLY}' USING ERRCODE = 'insufficient_privilege'; "
            "END $$"
        )
        op.execute("CREATE TRIGGER audit_events_append_only BEFORE UPDATE OR DELETE ON audit_events "
                   "FOR EACH ROW EXECUTE FUNCTION hallmark_audit_append_only()")
        op.execute("CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events "
                   "FOR EACH STATEMENT EXECUTE FUNCTION hallmark_audit_append_only()")
    else:
        for verb in ("UPDATE", "DELETE"):
            op.execute(f"CREATE TRIGGER audit_events_no_{verb.lower()} BEFORE {verb} ON audit_events "
                       f"BEGIN SELECT RAISE(ABORT, '{_APPEND_ONLY}'); END")


def downgrade() -> None:
    # Dropping the table drops its triggers; nothing fires on DROP TABLE.
    op.drop_table("audit_events")
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP FUNCTION hallmark_audit_append_only()")
    op.drop_table("generation_records")
    op.drop_table("api_tokens")
    op.drop_table("watermark_keys")
    op.drop_table("tenants")
