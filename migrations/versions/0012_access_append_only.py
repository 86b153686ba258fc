"""Detection budgets and probe families the service role cannot reset (issue 31 item 6,
issue 35 item 6): budgets become insert-only spend rows (``access_spend``), summed over the
last 24 hours; on PostgreSQL a trigger stamps each row with the database's clock and admits
a negative row only as a once-only refund of part of a reservation of the last ten minutes,
and ``hallmark_prune_access()`` (SECURITY DEFINER, owned by the migrating role) is the only
way rows are deleted: rows older than the window, nothing else. ``hallmark db
grant-service-role`` then gives the service role SELECT, INSERT on ``access_spend`` and
``probe_queries`` and EXECUTE on that function (keys/roles.py).

Revision ID: 0012_access_append_only
Revises: 0011_token_expiry
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_access_append_only"
down_revision: str | None = "0011_token_expiry"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WINDOW_S = 86_400
REFUND_WITHIN_S = 600

_PG_UP = f"""
CREATE FUNCTION hallmark_access_spend_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    reserved double precision;
    reserved_at double precision;
BEGIN
    NEW.created := EXTRACT(EPOCH FROM clock_timestamp());
    IF NEW.amount < 0 THEN
        SELECT amount, created INTO reserved, reserved_at FROM access_spend
            WHERE id = NEW.settles AND name = NEW.name;
        IF reserved IS NULL OR reserved < -NEW.amount OR reserved_at < NEW.created - {REFUND_WITHIN_S} THEN
            RAISE EXCEPTION 'access_spend: a refund must give back part of a reservation of the last {REFUND_WITHIN_S} s';
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER access_spend_insert BEFORE INSERT ON access_spend
    FOR EACH ROW EXECUTE FUNCTION hallmark_access_spend_insert();
CREATE FUNCTION hallmark_prune_access() RETURNS void LANGUAGE sql SECURITY DEFINER
    SET search_path = public, pg_temp AS $$
    DELETE FROM access_spend WHERE created < EXTRACT(EPOCH FROM clock_timestamp()) - {WINDOW_S + REFUND_WITHIN_S};
    DELETE FROM probe_queries WHERE created < EXTRACT(EPOCH FROM clock_timestamp()) - {WINDOW_S};
$$;
REVOKE ALL ON FUNCTION hallmark_prune_access() FROM PUBLIC;
"""

_PG_DOWN = """
DROP FUNCTION IF EXISTS hallmark_prune_access();
DROP TRIGGER IF EXISTS access_spend_insert ON access_spend;
DROP FUNCTION IF EXISTS hallmark_access_spend_insert();
"""


def upgrade() -> None:
    op.create_table(
        "access_spend",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("amount", sa.Double(), nullable=False),
        sa.Column("created", sa.Double(), nullable=False),
        sa.Column("settles", sa.String(32), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_access_spend")),
        sa.UniqueConstraint("settles", name=op.f("uq_access_spend_settles")),
        sa.CheckConstraint("amount >= 0 OR settles IS NOT NULL", name=op.f("ck_access_spend_refund_settles")),
    )
    op.create_index("ix_access_spend_name_created", "access_spend", ["name", "created"])
    op.create_index(op.f("ix_access_spend_created"), "access_spend", ["created"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_UP)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_DOWN)
    op.drop_index(op.f("ix_access_spend_created"), table_name="access_spend")
    op.drop_index("ix_access_spend_name_created", table_name="access_spend")
    op.drop_table("access_spend")
