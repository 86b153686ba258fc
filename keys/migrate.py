"""Alembic, driven from code: the ``migrations`` package's script directory, and
upgrade/downgrade/current on an engine of the store (so SQLite's pragmas and transaction
handling from :mod:`keys.db` apply to migrations too).

The scripts are data to this module: it finds their directory without importing the
``migrations`` package, whose environment imports :mod:`keys.models` (dependencies point
from the migrations to the store's models, never back)."""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine


def _migrations_dir() -> Path:
    spec = importlib.util.find_spec("migrations")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - installed with keys
        raise RuntimeError("the migrations package is not installed beside keys")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


MIGRATIONS_DIR = _migrations_dir()


def alembic_config(url: str | None = None) -> Config:
    """A Config without an ini file: script location is the installed ``migrations`` package."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        # ConfigParser interpolation would eat a '%' in a password.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


@lru_cache(maxsize=1)
def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:  # pragma: no cover - the package ships its versions
        raise RuntimeError(f"no migrations found in {MIGRATIONS_DIR}")
    return head


def known_revisions() -> set[str]:
    return {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade in one transaction (PostgreSQL and, through keys.db, SQLite have transactional DDL)."""
    with engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def downgrade(engine: Engine, revision: str) -> None:
    with engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, revision)
