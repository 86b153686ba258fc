"""Opening the key store from a command: one way for every command that needs it.

The settings come from the environment (``HALLMARK_DATABASE_URL``, ``HALLMARK_KEK`` /
``HALLMARK_KEK_FILE``); a bad variable, and any database fault while the store is open,
become the CLI's one-line errors. Imports of the store happen on first use, so that
``hallmark --help`` never loads SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def cli_store(*, require_kek: bool = False, check_schema: bool = True, create: bool = False) -> Iterator["Store"]:
    """The store, closed afterwards (see :func:`keys.db.open_store` for the flags)."""
    from sqlalchemy.exc import DBAPIError

    from keys.db import open_store, translate_error

    store = open_store(store_settings(), require_kek=require_kek, check_schema=check_schema, create=create)
    try:
        yield store
    except DBAPIError as exc:
        mapped = translate_error(exc, store.url)
        if mapped is None:
            raise
        raise mapped from None
    finally:
        store.close()
