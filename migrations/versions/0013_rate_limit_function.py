"""The shared rate limits' buckets written only through an owner function (issue 31, third
round): the service role could UPDATE or DELETE ``rate_limit_buckets`` and so refill any
per-minute limit (a detection token's rate among them). On PostgreSQL the service role now
has SELECT only on the table, and ``hallmark_take_bucket(name, cost, rate, burst)`` (SECURITY
DEFINER, owned by the migrating role) is its one write path:

- a bucket's rate and burst are pinned when it is created (later calls are held to the
  smaller of what they pass and what is pinned), so passing a huge rate or burst refills
  nothing;
- a negative cost (a refund) is refused except for generation token buckets (``gen:``),
  whose unused reservation a finished generation gives back, and even there the level never
  rises above the pinned burst; a detection's rate bucket can only be taken from;
- the time is the database's clock.

An operator who raises a limit deletes the buckets as the owner (``DELETE FROM
rate_limit_buckets``) for the new figures to be pinned.

Revision ID: 0013_rate_limit_function
Revises: 0012_access_append_only
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_rate_limit_function"
down_revision: str | None = "0012_access_append_only"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PG_UP = """
CREATE FUNCTION hallmark_take_bucket(p_name text, p_cost double precision, p_rate double precision,
                                     p_burst double precision) RETURNS double precision
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    b rate_limit_buckets%ROWTYPE;
    now_s double precision := EXTRACT(EPOCH FROM clock_timestamp());
    r double precision;
    cap double precision;
    lvl double precision;
    wait double precision := 0;
BEGIN
    IF p_rate IS NULL OR p_burst IS NULL OR p_cost IS NULL OR p_rate <= 0 OR p_burst <= 0 THEN
        RAISE EXCEPTION 'hallmark_take_bucket: rate and burst must be positive';
    END IF;
    IF p_cost < 0 AND left(p_name, 4) <> 'gen:' THEN
        RAISE EXCEPTION 'hallmark_take_bucket: only a generation token bucket takes a refund';
    END IF;
    INSERT INTO rate_limit_buckets (name, level, updated, rate, burst)
        VALUES (p_name, p_burst, now_s, p_rate, p_burst) ON CONFLICT (name) DO NOTHING;
    SELECT * INTO b FROM rate_limit_buckets WHERE name = p_name FOR UPDATE;
    r := LEAST(p_rate, COALESCE(b.rate, p_rate));
    cap := LEAST(p_burst, COALESCE(b.burst, p_burst));
    lvl := LEAST(cap, b.level + GREATEST(0, now_s - b.updated) * r);
    IF p_cost <= 0 THEN
        lvl := LEAST(cap, lvl - p_cost);
    ELSIF lvl >= p_cost THEN
        lvl := lvl - p_cost;
    ELSIF p_cost > cap THEN
        wait := -1;
    ELSE
        wait := (p_cost - lvl) / r;
    END IF;
    UPDATE rate_limit_buckets SET level = lvl, updated = now_s, rate = r, burst = cap WHERE name = p_name;
    RETURN wait;
END $$;
REVOKE ALL ON FUNCTION hallmark_take_bucket(text, double precision, double precision, double precision) FROM PUBLIC;
"""

_PG_DOWN = "DROP FUNCTION IF EXISTS hallmark_take_bucket(text, double precision, double precision, double precision);"


def upgrade() -> None:
    op.add_column("rate_limit_buckets", sa.Column("rate", sa.Double(), nullable=True))
    op.add_column("rate_limit_buckets", sa.Column("burst", sa.Double(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_UP)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_DOWN)
    with op.batch_alter_table("rate_limit_buckets") as batch:
        batch.drop_column("burst")
        batch.drop_column("rate")
