"""Role separation on PostgreSQL: the owner migrates, the service runs as a lesser role.

The triggers that keep the ledger and the audit log append-only stop the application,
not the tables' owner, who can disable or drop them. So in production the migrations run
as the owner and the gateway connects as a separate role (``hallmark db
grant-service-role NAME``) that may only:

- SELECT and INSERT on ``ledger_entries``, ``ledger_kgrams``, ``audit_events``, the
  transparency log's ``log_leaves``, ``log_nodes`` and ``log_checkpoints``, and the detection
  access tables ``access_spend`` and ``probe_queries`` (append, never rewrite; the last two's
  old rows only through the owner's ``hallmark_prune_access()``, which it may EXECUTE); SELECT, UPDATE on ``log_head`` (each append moves it, under its row lock);
- SELECT on ``rate_limit_buckets``, written only through the owner's
  ``hallmark_take_bucket()`` (EXECUTE): it pins each bucket's rate and burst and takes refunds
  only for generation token buckets, so the role cannot refill a per-minute limit;
- SELECT on ``tenants``, ``watermark_keys``, ``api_tokens``, ``signing_keys``,
  ``log_keys`` and ``alembic_version``: key, signing-key and token changes are the admin
  CLI's, run as the owner (the gateway can neither add a signing key nor retire one);
- SELECT, UPDATE on ``store_kek`` (UPDATE is what PostgreSQL requires for the row lock
  that writers of wrapped secrets take);
- SELECT, INSERT, UPDATE, DELETE on any other table (later migrations' working tables),
  and the sequences behind them.

Not being the owner, the role cannot TRUNCATE, ALTER (disable triggers), or DROP
anything; being refused superuser and BYPASSRLS here, it cannot escape that either.
"""

from __future__ import annotations

import re

from sqlalchemy import text
from sqlalchemy.engine import Connection

from keys.errors import InvalidInput

APPEND_ONLY = ("ledger_entries", "ledger_kgrams", "audit_events", "log_leaves", "log_nodes", "log_checkpoints",
               "access_spend", "probe_queries")
"""``access_spend`` and ``probe_queries``: detection budgets and probe families, which the
service must not reset (issue 31); their old rows go through ``hallmark_prune_access()``."""
FUNCTIONS = ("hallmark_prune_access()",
             "hallmark_take_bucket(text, double precision, double precision, double precision)")
"""Owner-defined SECURITY DEFINER functions the service role may call."""
READ_ONLY = ("tenants", "watermark_keys", "api_tokens", "signing_keys", "log_keys", "alembic_version",
             "rate_limit_buckets")
"""``rate_limit_buckets``: written only through ``hallmark_take_bucket()`` (migration 0013), so
the service role cannot refill a per-minute limit (issue 31)."""
SPECIAL = {"store_kek": "SELECT, UPDATE", "log_head": "SELECT, UPDATE"}
_ROLE = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def privileges_for(table: str) -> str:
    if table in APPEND_ONLY:
        return "SELECT, INSERT"
    if table in READ_ONLY:
        return "SELECT"
    return SPECIAL.get(table, "SELECT, INSERT, UPDATE, DELETE")


def grant_service_role(connection: Connection, role: str) -> dict[str, str]:
    """Grant ``role`` exactly the service's privileges on every table of the current
    database's ``public`` schema (revoking anything else it had there). Returns table ->
    privileges. The role must exist, log in, and be neither superuser nor BYPASSRLS."""
    if connection.dialect.name != "postgresql":
        raise InvalidInput("role separation needs PostgreSQL; SQLite has no roles (protect the file instead)")
    if not isinstance(role, str) or _ROLE.fullmatch(role) is None:
        raise InvalidInput("the role name must be lowercase letters, digits and '_' (a plain PostgreSQL identifier)")
    found = connection.execute(text("SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = :r"),
                               {"r": role}).first()
    if found is None:
        raise InvalidInput(f"no PostgreSQL role {role!r}; create it first (CREATE ROLE {role} LOGIN PASSWORD '...')")
    if found[0] or found[1]:
        raise InvalidInput(f"role {role!r} is a superuser or bypasses row security; the service role must not be")
    owner = connection.execute(text("SELECT current_user")).scalar_one()
    if owner == role:
        raise InvalidInput("the service role must not be the role that owns the tables (the one migrating)")
    database = connection.execute(text("SELECT current_database()")).scalar_one()
    tables = list(connection.execute(text(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename")).scalars())
    connection.exec_driver_sql(f'GRANT CONNECT ON DATABASE "{database}" TO {role}')
    connection.exec_driver_sql(f"GRANT USAGE ON SCHEMA public TO {role}")
    connection.exec_driver_sql(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")
    granted = {}
    for table in tables:
        granted[table] = privileges_for(table)
        connection.exec_driver_sql(f'GRANT {granted[table]} ON "{table}" TO {role}')
    connection.exec_driver_sql(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role}")
    for function in FUNCTIONS:
        name = function.split("(")[0]
        if connection.execute(text("SELECT count(*) FROM pg_proc WHERE proname = :n"), {"n": name}).scalar():
            connection.exec_driver_sql(f"GRANT EXECUTE ON FUNCTION {function} TO {role}")
    return granted
