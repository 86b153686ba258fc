"""Alembic environment and versions of the key store's schema (driven by keys.migrate, which finds this directory without importing it)."""
