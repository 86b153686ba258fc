"""Opening the key store from a command: one way for every command that needs it.

The settings come from the environment (``HALLMARK_DATABASE_URL``, ``HALLMARK_KEK`` /
``HALLMARK_KEK_FILE``); a bad variable, and any database fault while the store is open,
become the CLI's one-line errors. Imports of the store happen on first use, so that
``hallmark --help`` never loads SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from service.cli.app import CliError

if TYPE_CHECKING:
    from keys.db import Store
    from keys.settings import StoreSettings


def store_settings() -> "StoreSettings":
    """:class:`~keys.settings.StoreSettings` from the environment, or a one-line error
    naming the variable."""
    from pydantic import ValidationError

    from keys.settings import StoreSettings
    from watermark.validation import first_error

    try:
        return StoreSettings()
    except ValidationError as exc:
        where, message = first_error(exc)
        raise CliError(f"HALLMARK_{where.replace('.', '_').upper()}: {message}") from None


def missing_store(settings: "StoreSettings", cwd: Path | None = None) -> tuple[str, str] | None:
    """(what is wrong, what to do) when the store is a SQLite file that does not exist, None
    otherwise (or in a Hallmark checkout without one yet, where `make run` or `hallmark db
    upgrade` is the right advice).

    The default database is ``./var/hallmark.db`` in the working directory, where `make run`
    keeps it: from another directory a command finds no store, and `hallmark db upgrade`
    there would create a second, empty one beside the real one (issue 34, item 10)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from keys.settings import DEFAULT_DATABASE_URL

    try:
        url = make_url(settings.database_url)
    except ArgumentError:
        return None
    if not url.drivername.startswith("sqlite") or not url.database or url.database == ":memory:":
        return None
    cwd = cwd or Path.cwd()
    path = cwd / url.database
    if path.exists():
        return None
    if settings.database_url != DEFAULT_DATABASE_URL:
        return (f"HALLMARK_DATABASE_URL names {url.database}, which does not exist",
                "check the path (`hallmark db upgrade` would create a new, empty store there)")
    default = Path(url.database)
    found = next((parent for parent in cwd.parents if (parent / default).exists()), None)
    if found is not None:
        return (f"no store in {cwd} (no {default}); there is one in {found}",
                f"run hallmark from {found} (`cd {found}`), where `make run` keeps it, or set "
                f"HALLMARK_DATABASE_URL=sqlite:///{found / default} (and HALLMARK_KEK_FILE)")
    pyproject = cwd / "pyproject.toml"
    if pyproject.exists() and 'name = "hallmark"' in pyproject.read_text(encoding="utf-8", errors="replace"):
        return None  # a checkout without a store yet: `make run` makes it here
    return (f"no store in {cwd} (no {default})",
            "if you ran `make run`, run hallmark from that directory (it keeps the store in ./var there) or set "
            "HALLMARK_DATABASE_URL; `hallmark db upgrade` here would start a new, empty store")


@contextmanager
def cli_store(*, require_kek: bool = False, check_schema: bool = True, create: bool = False) -> Iterator["Store"]:
    """The store, closed afterwards (see :func:`keys.db.open_store` for the flags)."""
    from sqlalchemy.exc import DBAPIError

    from keys.db import open_store, translate_error
    from keys.settings import DEFAULT_DATABASE_URL

    settings = store_settings()
    missing = missing_store(settings) if not create and settings.database_url == DEFAULT_DATABASE_URL else None
    if missing is not None:
        raise CliError(f"{missing[0]}: {missing[1]}")
    store = open_store(settings, require_kek=require_kek, check_schema=check_schema, create=create)
    try:
        yield store
    except DBAPIError as exc:
        mapped = translate_error(exc, store.url)
        if mapped is None:
            raise
        raise mapped from None
    finally:
        store.close()
