"""Alembic environment of the key store.

The URL comes from the Alembic config (``sqlalchemy.url``) or else from
``HALLMARK_DATABASE_URL`` via :class:`keys.settings.StoreSettings`. A caller that already
holds a connection (``keys.migrate``, the tests) passes it in
``config.attributes["connection"]``; the migration then runs inside that connection's
transaction.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from keys.models import Base
from keys.settings import StoreSettings

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or StoreSettings().database_url


def _configure_and_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        # SQLite cannot ALTER most things; later migrations get copy-and-move batches.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True,
                      dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection)
        return
    from keys.db import create_store_engine  # the store's SQLite pragmas apply here too

    engine = create_store_engine(_url())
    try:
        with engine.begin() as connection:
            _configure_and_run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
