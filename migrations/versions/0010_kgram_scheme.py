"""One k-gram key per store (ledger/kgrams.py scheme 2): a ``scheme`` column on ledger_kgrams
(1, the per-watermark-key digests every row so far holds) and the indexes scheme 2's one
look-up per text needs: by digest (and tenant), and which keys still have scheme 1 rows.

Revision ID: 0010_kgram_scheme
Revises: 0009_access_tiers
Create Date: 2026-12-04
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_kgram_scheme"
down_revision: str | None = "0009_access_tiers"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # ADD COLUMN with a constant default: no table rewrite on PostgreSQL (11+) nor SQLite, and
    # the append-only triggers (0005) see no UPDATE. Existing rows are scheme 1.
    op.add_column("ledger_kgrams", sa.Column("scheme", sa.SmallInteger(), nullable=False, server_default="1"))
    op.create_index("ix_ledger_kgrams_digest_tenant", "ledger_kgrams", ["digest", "tenant_id"])
    op.create_index("ix_ledger_kgrams_v1_key", "ledger_kgrams", ["key_id"],
                    sqlite_where=sa.text("scheme = 1"), postgresql_where=sa.text("scheme = 1"))


def downgrade() -> None:
    # Scheme 2 rows would read as scheme 1 without the column: refuse rather than mislabel them.
    bind = op.get_bind()
    if not op.get_context().as_sql and bind.execute(sa.text(
            "SELECT 1 FROM ledger_kgrams WHERE scheme <> 1 LIMIT 1")).first() is not None:
        raise RuntimeError("ledger_kgrams holds scheme 2 rows (recorded after 0010); they cannot be downgraded")
    op.drop_index("ix_ledger_kgrams_v1_key", table_name="ledger_kgrams")
    op.drop_index("ix_ledger_kgrams_digest_tenant", table_name="ledger_kgrams")
    # Reflecting ledger_kgrams reflects tenants, whose lower(name) index SQLAlchemy cannot
    # reflect (0009 says why the warning is silenced).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Skipped unsupported reflection of expression-based index")
        with op.batch_alter_table("ledger_kgrams") as batch:
            batch.drop_column("scheme")
