"""API tokens expire, and their last use is kept (issue 35 item 5): ``api_tokens.expires_at``
(null: never; existing tokens keep working as before) and ``api_token_uses`` (one row per
token: when a gateway last saw it, written at most once a minute per process). Last use is a
table of its own because the gateway's database role may only read ``api_tokens`` (keys.roles):
it writes this one, and a forged time there misleads a listing, never authentication.

Revision ID: 0011_token_expiry
Revises: 0010_kgram_scheme
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_token_expiry"
down_revision: str | None = "0010_kgram_scheme"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "api_token_uses",
        sa.Column("token_id", sa.String(32), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("token_id", name=op.f("pk_api_token_uses")),
        sa.ForeignKeyConstraint(["token_id"], ["api_tokens.id"], name=op.f("fk_api_token_uses_token_id_api_tokens"),
                                ondelete="CASCADE"),
    )


def downgrade() -> None:
    op.drop_table("api_token_uses")
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("expires_at")
