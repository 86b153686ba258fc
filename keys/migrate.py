"""Alembic, driven from code: the ``migrations`` package's script directory, and
upgrade/downgrade/current on an engine of the store (so SQLite's pragmas and transaction
handling from :mod:`keys.db` apply to migrations too).

The scripts are data to this module: it finds their directory without importing the
``migrations`` package, whose environment imports :mod:`keys.models` (dependencies point
from the migrations to the store's models, never back)."""

from __future__ import annotations

import ast
import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, inspect, text

if TYPE_CHECKING:
    from alembic.config import Config

VERSION_TABLE = "alembic_version"


def _migrations_dir() -> Path:
    spec = importlib.util.find_spec("migrations")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - installed with keys
        raise RuntimeError("the migrations package is not installed beside keys")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


MIGRATIONS_DIR = _migrations_dir()


def alembic_config(url: str | None = None) -> "Config":
    """A Config without an ini file: script location is the installed ``migrations`` package."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        # ConfigParser interpolation would eat a '%' in a password.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


# Opening the store checks its schema revision on every command, so the check reads the
# version scripts' `revision`/`down_revision` as data and the version table with one SELECT,
# without importing Alembic (about a third of a store command's start-up otherwise).
# tests/keys/test_migrations.py checks these against Alembic's own answers.


def _literal(node: ast.stmt, name: str):
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
        return True, ast.literal_eval(node.value) if node.value is not None else None
    if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == name):
        return True, ast.literal_eval(node.value)
    return False, None


def _identifiers(source: str) -> dict[str, object]:
    try:
        body = ast.parse(source).body
    except SyntaxError:  # a header cut inside a string: the caller parses the whole file
        return {}
    found: dict[str, object] = {}
    for node in body:
        for name in ("revision", "down_revision"):
            hit, value = _literal(node, name)
            if hit:
                found[name] = value
    return found


@lru_cache(maxsize=1)
def script_revisions() -> dict[str, tuple[str, ...]]:
    """Every revision of the version scripts -> its down revisions."""
    revisions: dict[str, tuple[str, ...]] = {}
    for path in sorted((MIGRATIONS_DIR / "versions").glob("*.py")):
        source = path.read_text(encoding="utf-8")
        # The identifiers sit above the first top-level function: parsing only that header
        # saves most of this check (every store command runs it); the whole file is the
        # fallback.
        header = source.split("\ndef ", 1)[0]
        found = _identifiers(header) if header != source else {}
        if "revision" not in found or "down_revision" not in found:
            found = _identifiers(source)
        if "revision" not in found:  # pragma: no cover - not a version script
            continue
        down = found.get("down_revision")
        revisions[str(found["revision"])] = () if down is None else (down,) if isinstance(down, str) else tuple(down)
    return revisions


@lru_cache(maxsize=1)
def head_revision() -> str:
    revisions = script_revisions()
    below = {down for downs in revisions.values() for down in downs}
    heads = sorted(set(revisions) - below)
    if len(heads) != 1:  # pragma: no cover - the package ships one chain
        raise RuntimeError(f"expected one head revision in {MIGRATIONS_DIR}, found {heads or 'none'}")
    return heads[0]


def known_revisions() -> set[str]:
    return set(script_revisions())


def current_revision(engine: Engine) -> str | None:
    """The database's schema revision (None: not migrated); several heads read as a tuple
    of them joined by commas, which matches no script."""
    with engine.connect() as connection:
        if not inspect(connection).has_table(VERSION_TABLE):
            return None
        rows = sorted(row[0] for row in connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")))
    return ",".join(rows) if rows else None


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade in one transaction (PostgreSQL and, through keys.db, SQLite have transactional DDL)."""
    from alembic import command

    with engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    with engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, revision)
