"""``hallmark ledger list``: one's generations, newest first, page by page (the CLI twin of
``GET /v1/generations``)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Optional

import typer

from service.cli.app import JSON_OPTION, CliError, emit, one_line_errors
from service.cli.provenance import ledger_app
from service.cli.store import cli_store
from service.cli.tables import table


def _when(value: Optional[str], option: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise CliError(f"{option} takes an ISO 8601 time such as 2026-12-02 or 2026-12-02T18:00:00Z") from None
    return parsed.replace(tzinfo=timezone.utc) if parsed.tzinfo is None else parsed


@ledger_app.command("list")
@one_line_errors()
def ledger_list(tenant: Optional[str] = typer.Option(None, "--tenant", help="Only this tenant's generations."),
                key_id: Optional[str] = typer.Option(None, "--key", help="Only generations under this key id."),
                since: Optional[str] = typer.Option(None, "--since", help="Started at or after (ISO 8601; UTC if no zone)."),
                until: Optional[str] = typer.Option(None, "--until", help="Started before (ISO 8601; UTC if no zone)."),
                limit: int = typer.Option(50, "--limit", min=1, max=1000, help="At most this many."),
                offset: int = typer.Option(0, "--offset", min=0, help="Skip the newest N (the next page)."),
                as_json: bool = JSON_OPTION) -> None:
    """Generations in the ledger, newest first (never their text: the ledger holds hashes)."""
    from keys.key_states import with_key_states
    from ledger.entries import MAX_OFFSET, list_generations
    from keys.tenants import get_tenant

    if offset > MAX_OFFSET:
        raise CliError(f"--offset is at most {MAX_OFFSET}")

    start, end = _when(since, "--since"), _when(until, "--until")
    with cli_store() as store, store.transaction(write=False) as session:
        tenant_id = get_tenant(session, name=tenant).id if tenant is not None else None
        found = list_generations(session, tenant_id=tenant_id, limit=limit, offset=offset, since=start, until=end,
                                 key_id=key_id)
        records = with_key_states(session, [g.to_dict() for g in found])
    rows = [[g.created_at.isoformat(timespec="seconds"), g.id, g.tenant, g.key_version, g.output_tokens,
             g.watermarked_tokens, getattr(g, "status", None) or "-"] for g in found]
    emit(records, as_json,
         table(rows, ["CREATED", "GENERATION", "TENANT", "KEY_VERSION", "TOKENS", "WATERMARKED", "STATUS"]))
