"""Tenant names are unique without regard to case: a unique index on lower(name).

``Acme`` beside ``acme`` reads as one tenant to a person (on the page, in the audit log, in
an admin's ``--tenant`` option), so the store refuses the second one (keys/tenants.py) and
this index makes that hold under concurrent creation too. Names keep the case they were
created with. Tenant names are ASCII (keys.tenants.NAME_PATTERN), so SQLite's and
PostgreSQL's ``lower()`` agree.

A database that already holds names differing only in case cannot get the index: the
upgrade stops (nothing changes) and names them, so that the operator renames all but one
of each group and upgrades again. Renaming is safe: everything refers to tenants by id.

Revision ID: 0007_tenant_name_case
Revises: 0006_kgrams
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from alembic.util import CommandError

revision: str = "0007_tenant_name_case"
down_revision: str | None = "0006_kgrams"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "uq_tenants_name_lower"


def _case_duplicates() -> list[list[tuple[str, str]]]:
    """Groups of (name, id) whose names differ only in case, each sorted by name (sorted here:
    the databases' collations order case differently)."""
    rows = op.get_bind().execute(sa.text(
        "SELECT name, id FROM tenants WHERE lower(name) IN "
        "(SELECT lower(name) FROM tenants GROUP BY lower(name) HAVING count(*) > 1)"))
    groups: dict[str, list[tuple[str, str]]] = {}
    for name, tenant_id in sorted(rows):
        groups.setdefault(name.lower(), []).append((name, tenant_id))
    return [groups[key] for key in sorted(groups)]


def upgrade() -> None:
    # Offline (--sql) there is no data to check: the CREATE INDEX itself fails on duplicates.
    duplicates = [] if op.get_context().as_sql else _case_duplicates()
    if duplicates:
        listed = "; ".join(", ".join(f"{name!r} (id {tenant_id})" for name, tenant_id in group)
                           for group in duplicates)
        raise CommandError(
            f"tenant names must be unique without regard to case, and these differ only in case: {listed}. "
            "Nothing was changed. Rename all but one of each group (tenants are referred to by id, so "
            "for example: UPDATE tenants SET name = 'acme-2' WHERE id = '<id>'), then run `hallmark db "
            "upgrade` again.")
    op.create_index(INDEX, "tenants", [sa.text("lower(name)")], unique=True)


def downgrade() -> None:
    op.drop_index(INDEX, table_name="tenants")
