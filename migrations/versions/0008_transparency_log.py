"""The ledger as a transparency log (ledger/log/tlog.py): the log key, the log's head, leaves,
complete subtrees and published checkpoints; revocation of signing keys.

Revision ID: 0008_transparency_log
Revises: 0007_tenant_name_case
Create Date: 2026-12-04

The log starts empty. Existing ledger entries and signing keys become its first leaves when
a process holding the KEK first opens it (``hallmark ledger init``, or a gateway starting
on a store its role may write): sealing the log key needs the KEK, which a migration does
not hold.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_transparency_log"
down_revision: str | None = "0007_tenant_name_case"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BIGINT = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
APPEND_ONLY = ("log_leaves", "log_nodes", "log_checkpoints")


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _append_only(table: str) -> None:
    message = f"{table} is append-only"
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"CREATE FUNCTION hallmark_{table}_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
                   f"BEGIN RAISE EXCEPTION '{message}' USING ERRCODE = 'insufficient_privilege'; END $$")
        op.execute(f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                   f"FOR EACH ROW EXECUTE FUNCTION hallmark_{table}_append_only()")
        op.execute(f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                   f"FOR EACH STATEMENT EXECUTE FUNCTION hallmark_{table}_append_only()")
    else:
        for verb in ("UPDATE", "DELETE"):
            op.execute(f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
                       f"BEGIN SELECT RAISE(ABORT, '{message}'); END")


def upgrade() -> None:
    op.create_table(
        "log_keys",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("origin", sa.String(200), nullable=False),
        sa.Column("public_key", sa.LargeBinary(), nullable=False),
        sa.Column("wrapped_private", sa.LargeBinary(), nullable=False),
        sa.Column("nonce", sa.LargeBinary(), nullable=False),
        sa.Column("kek_id", sa.String(32), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_log_keys")),
        sa.CheckConstraint("id = 1", name=op.f("ck_log_keys_single_row")),
    )
    op.create_index(op.f("ix_log_keys_kek_id"), "log_keys", ["kek_id"])
    op.create_table(
        "log_head",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("size", _BIGINT, nullable=False),
        sa.Column("border", sa.LargeBinary(), nullable=False),
        sa.Column("mac", sa.LargeBinary(), nullable=True),
        _ts("updated_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_log_head")),
        sa.CheckConstraint("id = 1", name=op.f("ck_log_head_single_row")),
    )
    op.execute("INSERT INTO log_head (id, size, border, mac, updated_at) VALUES (1, 0, '', NULL, NULL)")
    op.create_table(
        "log_leaves",
        sa.Column("idx", _BIGINT, autoincrement=False, nullable=False),
        sa.Column("leaf_hash", sa.LargeBinary(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("entry_id", _BIGINT, nullable=True),
        sa.Column("tenant_id", sa.String(32), nullable=True),
        sa.Column("kgrams_sha256", sa.String(64), nullable=True),
        sa.Column("kid", sa.String(32), nullable=True),
        sa.Column("data", sa.LargeBinary(), nullable=True),
        sa.Column("mac", sa.LargeBinary(), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("idx", name=op.f("pk_log_leaves")),
        sa.CheckConstraint("kind IN ('entry', 'signing_key')", name=op.f("ck_log_leaves_kind_known")),
        sa.UniqueConstraint("entry_id", name=op.f("uq_log_leaves_entry_id")),
    )
    op.create_index(op.f("ix_log_leaves_kid"), "log_leaves", ["kid"])
    op.create_table(
        "log_nodes",
        sa.Column("level", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("idx", _BIGINT, autoincrement=False, nullable=False),
        sa.Column("hash", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("level", "idx", name=op.f("pk_log_nodes")),
    )
    op.create_table(
        "log_checkpoints",
        sa.Column("size", _BIGINT, autoincrement=False, nullable=False),
        sa.Column("root", sa.LargeBinary(), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        _ts("published_at"),
        sa.PrimaryKeyConstraint("size", name=op.f("pk_log_checkpoints")),
    )
    for table in APPEND_ONLY:
        _append_only(table)
    op.add_column("signing_keys", _ts("revoked_at", nullable=True))
    op.add_column("signing_keys", sa.Column("revocation_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("signing_keys") as batch:
        batch.drop_column("revocation_reason")
        batch.drop_column("revoked_at")
    for table in ("log_checkpoints", "log_nodes", "log_leaves", "log_head", "log_keys"):
        op.drop_table(table)
    if op.get_context().dialect.name == "postgresql":
        for table in APPEND_ONLY:
            op.execute(f"DROP FUNCTION IF EXISTS hallmark_{table}_append_only()")
