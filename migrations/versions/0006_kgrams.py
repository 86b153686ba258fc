"""Ledger retrieval: keyed hashes of each generation's token k-grams (ledger/kgrams.py).

Revision ID: 0006_kgrams
Revises: 0005_ledger_chain
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_kgrams"
down_revision: str | None = "0005_ledger_chain"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BIGINT = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "ledger_kgrams",
        sa.Column("id", _BIGINT, autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(32), nullable=False),
        sa.Column("generation_id", sa.String(32), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("digest", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_kgrams")),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="RESTRICT",
                                name=op.f("fk_ledger_kgrams_tenant_id_tenants")),
        sa.ForeignKeyConstraint(["key_id"], ["watermark_keys.id"], ondelete="RESTRICT",
                                name=op.f("fk_ledger_kgrams_key_id_watermark_keys")),
    )
    op.create_index(op.f("ix_ledger_kgrams_generation_id"), "ledger_kgrams", ["generation_id"])
    op.create_index("ix_ledger_kgrams_key_digest", "ledger_kgrams", ["key_id", "digest"])


def downgrade() -> None:
    op.drop_index("ix_ledger_kgrams_key_digest", table_name="ledger_kgrams")
    op.drop_index(op.f("ix_ledger_kgrams_generation_id"), table_name="ledger_kgrams")
    op.drop_table("ledger_kgrams")
