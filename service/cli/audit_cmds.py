"""``hallmark audit``: the audit log."""

from __future__ import annotations

import json
from typing import Optional

import typer

from service.cli.app import JSON_OPTION, audit_app, emit, one_line_errors
from service.cli.store import cli_store
from service.cli.tables import table


@audit_app.command("list")
@one_line_errors()
def audit_list(tenant: Optional[str] = typer.Option(None, "--tenant", help="Only this tenant's events."),
               action: Optional[str] = typer.Option(None, "--action", help="Only this action, e.g. key.rotated."),
               key_id: Optional[str] = typer.Option(None, "--key", help="Only events about this key."),
               limit: Optional[int] = typer.Option(None, "--limit", help="Only the most recent N events."),
               as_json: bool = JSON_OPTION) -> None:
    """The audit log, oldest first: every change, import, export, KEK rotation, token event."""
    from keys.audit import list_audit

    with cli_store() as store, store.transaction(write=False) as session:
        events = list_audit(session, tenant=tenant, action=action, key_id=key_id, limit=limit)
    emit([e.to_dict() for e in events], as_json,
         table([[e.id, e.occurred_at.isoformat(timespec="seconds"), e.actor, e.action, e.tenant,
                 e.key_id, json.dumps(e.details, sort_keys=True)] for e in events],
               ["ID", "TIME", "ACTOR", "ACTION", "TENANT", "KEY_ID", "DETAILS"]))
