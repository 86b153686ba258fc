"""Shared rate-limit buckets: one row per bucket, so that every gateway replica on the
database draws from the same budget (service/limits.py).

Revision ID: 0004_rate_limits
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_rate_limits"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rate_limit_buckets",
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("level", sa.Double(), nullable=False),
        sa.Column("updated", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_rate_limit_buckets")),
    )


def downgrade() -> None:
    op.drop_table("rate_limit_buckets")
