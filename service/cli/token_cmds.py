"""``hallmark tokens``: issue, revoke and list API tokens."""

from __future__ import annotations

from typing import Optional

import typer

from service.cli.app import JSON_OPTION, emit, one_line_errors, tokens_app
from service.cli.store import cli_store
from service.cli.tables import table


@tokens_app.command("issue")
@one_line_errors()
def tokens_issue(tenant: Optional[str] = typer.Option(None, "--tenant", help="Tenant the token acts for."),
                 admin: bool = typer.Option(False, "--admin", help="Admin token (global without --tenant)."),
                 expert: bool = typer.Option(False, "--expert", help="A verified expert's detection token "
                                             "(every tenant's keys, the full result, each request audited)."),
                 scope_names: list[str] = typer.Option([], "--scope", help="Extra scope: 'evidence' (per-token "
                                                       "evidence, audited, its own daily budget)."),
                 as_json: bool = JSON_OPTION) -> None:
    """Issue an API token; it is printed once and stored only as a hash."""
    from keys.audit import default_actor
    from keys.tokens import issue_token

    with cli_store() as store, store.transaction() as session:
        issued = issue_token(session, tenant=tenant, admin=admin, expert=expert, scopes=scope_names,
                             actor=default_actor())
    scope = f"tenant {issued.info.tenant}" if issued.info.tenant else "all tenants"
    if expert:
        scope = "expert detection, all tenants"
    if issued.info.scopes:
        scope += "; scopes: " + ", ".join(issued.info.scopes)
    emit({**issued.info.to_dict(), "token": issued.raw_token}, as_json,
         f"{issued.raw_token}\n(token {issued.info.token_id}, {'admin, ' if admin else ''}{scope}; "
         "shown once, store it now)")


@tokens_app.command("grant")
@one_line_errors()
def tokens_grant(token_id: str = typer.Argument(..., help="Token id (see `tokens list`)."),
                 scope: str = typer.Argument(..., help="Scope: 'evidence'."),
                 withdraw: bool = typer.Option(False, "--withdraw", help="Withdraw the scope instead."),
                 as_json: bool = JSON_OPTION) -> None:
    """Grant a token an extra scope (audited), or withdraw it."""
    from keys.audit import default_actor
    from keys.tokens import grant_scope

    with cli_store() as store, store.transaction() as session:
        info = grant_scope(session, token_id=token_id, scope=scope, grant=not withdraw, actor=default_actor())
    emit(info.to_dict(), as_json, f"token {info.token_id}: scopes {', '.join(info.scopes) or '(none)'}")


@tokens_app.command("revoke")
@one_line_errors()
def tokens_revoke(token_id: str = typer.Argument(..., help="Token id (see `tokens list`)."),
                  as_json: bool = JSON_OPTION) -> None:
    """Revoke an API token."""
    from keys.audit import default_actor
    from keys.tokens import revoke_token

    with cli_store() as store, store.transaction() as session:
        info = revoke_token(session, token_id=token_id, actor=default_actor())
    emit(info.to_dict(), as_json, f"revoked token {info.token_id} ({info.prefix}...)")


@tokens_app.command("list")
@one_line_errors()
def tokens_list(tenant: Optional[str] = typer.Option(None, "--tenant", help="Only this tenant's tokens."),
                as_json: bool = JSON_OPTION) -> None:
    """List API tokens (ids and prefixes, never the tokens)."""
    from keys.tokens import list_tokens

    with cli_store() as store, store.transaction(write=False) as session:
        tokens = list_tokens(session, tenant=tenant)
    emit([t.to_dict() for t in tokens], as_json,
         table([[t.token_id, t.prefix + "...", t.tenant or "(all)", "yes" if t.admin else "no", t.kind,
                 " ".join(t.scopes) or None, t.created_at.isoformat(timespec="seconds"),
                 t.revoked_at.isoformat(timespec="seconds") if t.revoked_at else None] for t in tokens],
               ["TOKEN_ID", "PREFIX", "TENANT", "ADMIN", "KIND", "SCOPES", "CREATED", "REVOKED"]))
