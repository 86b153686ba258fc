"""The ledger's tests run on the key store's databases: real SQLite files and the real
PostgreSQL server, with the same fixtures (tests/keys/conftest.py says how)."""

from tests.keys.conftest import (  # noqa: F401  (fixtures, found by name)
    _clean_environment,
    cli,
    database_url,
    empty_database_url,
    kek,
    keyring,
    pg_database,
    pg_server,
    postgres_url,
    settings,
    sqlite_template,
    sqlite_url,
    store,
    two_tenants,
)
