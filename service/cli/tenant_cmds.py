"""``hallmark tenants``: create and list tenants."""

from __future__ import annotations

import typer

from service.cli.app import JSON_OPTION, emit, one_line_errors, tenants_app
from service.cli.store import cli_store
from service.cli.tables import table


@tenants_app.command("create")
@one_line_errors()
def tenants_create(name: str = typer.Argument(..., help="Tenant name (letters, digits, . _ -)."),
                   as_json: bool = JSON_OPTION) -> None:
    """Create a tenant."""
    from keys.audit import default_actor
    from keys.tenants import create_tenant

    with cli_store() as store, store.transaction() as session:
        info = create_tenant(session, name=name, actor=default_actor())
    emit(info.to_dict(), as_json, f"created tenant {info.name} ({info.id})")


@tenants_app.command("list")
@one_line_errors()
def tenants_list(as_json: bool = JSON_OPTION) -> None:
    """List tenants."""
    from keys.tenants import list_tenants

    with cli_store() as store, store.transaction(write=False) as session:
        tenants = list_tenants(session)
    emit([t.to_dict() for t in tenants], as_json,
         table([[t.name, t.id, t.created_at.isoformat(timespec="seconds")] for t in tenants],
               ["NAME", "ID", "CREATED"]))


@tenants_app.command("attribution")
@one_line_errors()
def tenants_attribution(name: str = typer.Argument(..., help="Tenant name."),
                        state: str = typer.Argument(..., help="'on': the public check may name this tenant; "
                                                               "'off': it names the provider only."),
                        as_json: bool = JSON_OPTION) -> None:
    """Opt a tenant in to (or out of) being named by the public detection check."""
    from keys.audit import default_actor
    from keys.errors import InvalidInput
    from keys.tenants import set_public_attribution

    if state not in ("on", "off"):
        raise InvalidInput(f"state must be 'on' or 'off', not {state!r}")
    with cli_store() as store, store.transaction() as session:
        info = set_public_attribution(session, name=name, on=state == "on", actor=default_actor())
    emit({**info.to_dict(), "public_attribution": state == "on"}, as_json,
         f"tenant {info.name}: the public check {'names' if state == 'on' else 'does not name'} it")
