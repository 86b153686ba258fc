"""Alembic environment and versions of the key store's schema (see keys.migrate)."""
