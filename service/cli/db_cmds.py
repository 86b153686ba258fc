"""``hallmark db``: schema migrations (upgrade, downgrade, current)."""

from __future__ import annotations

import typer

from service.cli.app import JSON_OPTION, CliError, db_app, emit, one_line_errors
from service.cli.store import cli_store, store_settings


@db_app.command("upgrade")
@one_line_errors()
def db_upgrade(revision: str = typer.Option("head", "--revision", help="Target revision."),
               as_json: bool = JSON_OPTION) -> None:
    """Create or migrate the database schema."""
    before, after, shown = _migrate("upgrade", revision, create=True)
    emit({"database": shown, "from": before, "to": after}, as_json,
         f"database {shown}: " + (f"already at {after}" if before == after
                                  else f"upgraded {before or '(empty)'} -> {after}"))


def _migrate(direction: str, revision: str, *, create: bool = False) -> tuple[str | None, str | None, str]:
    """Run ``migrate.upgrade`` or ``migrate.downgrade`` to ``revision``: (before, after, shown URL)."""
    from alembic.util.exc import CommandError

    from keys import migrate
    from keys.db import display_url

    with cli_store(check_schema=False, create=create) as store:
        before = migrate.current_revision(store.engine)
        try:
            getattr(migrate, direction)(store.engine, revision)
        except CommandError as exc:
            raise CliError(f"cannot {direction} to {revision!r}: {exc}") from None
        after = migrate.current_revision(store.engine)
    return before, after, display_url(store.url)


@db_app.command("downgrade")
@one_line_errors()
def db_downgrade(revision: str = typer.Option("-1", "--revision", help="Target revision (base drops everything)."),
                 yes: bool = typer.Option(False, "--yes", help="Confirm: a downgrade drops tables and their data."),
                 as_json: bool = JSON_OPTION) -> None:
    """Migrate the schema down (destroys the data of dropped tables, keys included)."""
    if not yes:
        raise CliError("a downgrade drops tables and the data in them (keys included); add --yes to confirm")
    before, after, shown = _migrate("downgrade", revision)
    emit({"database": shown, "from": before, "to": after}, as_json,
         f"database {shown}: downgraded {before or '(empty)'} -> {after or '(empty)'}")


@db_app.command("current")
@one_line_errors()
def db_current(as_json: bool = JSON_OPTION) -> None:
    """Show the database's schema revision and the one this Hallmark needs."""
    from keys import migrate
    from keys.db import display_url, parse_url
    from keys.errors import NotMigrated

    settings = store_settings()
    try:
        with cli_store(check_schema=False) as store:
            current = migrate.current_revision(store.engine)
    except NotMigrated:
        current = None  # a SQLite file not created yet: reported as empty, and not created
    head = migrate.head_revision()
    shown = display_url(parse_url(settings.database_url))
    emit({"database": shown, "current": current, "head": head}, as_json,
         f"database {shown}: at {current or '(empty)'}, this Hallmark needs {head}")
