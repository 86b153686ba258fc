"""Detection access tiers (service/access): expert tokens and the ``evidence`` scope on API
tokens, a tenant's opt-in to be named by the public check, and the probe guard's keyed
k-gram hashes (never text; rows older than 24 h are deleted by the gateway).

Revision ID: 0009_access_tiers
Revises: 0008_transparency_log
Create Date: 2026-12-04
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from contextlib import contextmanager

import sqlalchemy as sa
from alembic import op

revision: str = "0009_access_tiers"
down_revision: str | None = "0008_transparency_log"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_CHECK = "admin OR tenant_id IS NOT NULL"
NEW_CHECK = "admin OR tenant_id IS NOT NULL OR kind = 'expert'"


def _api_tokens(upgraded: bool) -> sa.Table:
    """The table as it stands before this revision (or after it): offline (``--sql``) batch
    mode on SQLite cannot reflect it."""
    columns = [
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("tenant_id", sa.String(32), nullable=True),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="RESTRICT",
                                name=op.f("fk_api_tokens_tenant_id_tenants")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
        sa.CheckConstraint(NEW_CHECK if upgraded else OLD_CHECK, name=op.f("ck_api_tokens_tenant_or_admin")),
        sa.Index(op.f("ix_api_tokens_tenant_id"), "tenant_id"),
    ]
    if upgraded:
        columns += [sa.Column("kind", sa.String(16), nullable=False, server_default="standard"),
                    sa.Column("scopes", sa.String(200), nullable=False),
                    sa.CheckConstraint("kind IN ('standard', 'expert')", name=op.f("ck_api_tokens_kind"))]
    return sa.Table("api_tokens", sa.MetaData(), *columns)


@contextmanager
def _batch(upgraded: bool):
    copy = {"copy_from": _api_tokens(upgraded)} if op.get_context().as_sql else {}
    # Reflecting api_tokens reflects the tenants table it references, whose unique index on
    # lower(name) SQLAlchemy cannot reflect: a warning on stderr (it broke JSON logs at a
    # first start) about a table this batch neither copies nor changes.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Skipped unsupported reflection of expression-based index",
                                category=sa.exc.SAWarning)
        with op.batch_alter_table("api_tokens", **copy) as batch:
            yield batch


def upgrade() -> None:
    with _batch(False) as batch:
        batch.add_column(sa.Column("kind", sa.String(16), nullable=False, server_default="standard"))
        batch.add_column(sa.Column("scopes", sa.String(200), nullable=False, server_default=""))
        batch.drop_constraint(op.f("ck_api_tokens_tenant_or_admin"), type_="check")
        batch.create_check_constraint("tenant_or_admin", NEW_CHECK)
        batch.create_check_constraint("kind", "kind IN ('standard', 'expert')")
    with _batch(True) as batch:  # existing rows got '', new ones set it
        batch.alter_column("scopes", existing_type=sa.String(200), existing_nullable=False, server_default=None)
    # Plain ALTERs (no batch copy on SQLite, which would lose the expression index on names).
    op.add_column("tenants", sa.Column("public_attribution", sa.Boolean(), nullable=False,
                                       server_default=sa.false()))
    op.create_table(
        "probe_queries",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("principal", sa.String(64), nullable=False),
        sa.Column("family", sa.String(32), nullable=False),
        sa.Column("created", sa.Double(), nullable=False),
        sa.Column("hashes", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_probe_queries")),
    )
    op.create_index(op.f("ix_probe_queries_principal_created"), "probe_queries", ["principal", "created"])
    op.create_index(op.f("ix_probe_queries_created"), "probe_queries", ["created"])


def downgrade() -> None:
    op.drop_index(op.f("ix_probe_queries_created"), table_name="probe_queries")
    op.drop_index(op.f("ix_probe_queries_principal_created"), table_name="probe_queries")
    op.drop_table("probe_queries")
    op.drop_column("tenants", "public_attribution")
    op.execute("DELETE FROM api_tokens WHERE kind = 'expert'")
    with _batch(True) as batch:
        batch.drop_constraint(op.f("ck_api_tokens_kind"), type_="check")
        batch.drop_constraint(op.f("ck_api_tokens_tenant_or_admin"), type_="check")
        batch.create_check_constraint("tenant_or_admin", OLD_CHECK)
        batch.drop_column("scopes")
        batch.drop_column("kind")
