"""``hallmark tokens``: issue, revoke and list API tokens."""

from __future__ import annotations

from typing import Optional

import typer

from service.cli.app import JSON_OPTION, CliError, emit, one_line_errors, tokens_app
from service.cli.store import cli_store, store_settings
from service.cli.tables import table

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
TTL_HELP = ("How long the token works: e.g. 90d, 12h, 30m; 'never' for no expiry "
            "(default: HALLMARK_TOKEN_TTL_DAYS, 90 days).")


def parse_ttl(text: Optional[str]):
    """A ``--ttl`` as a timedelta (None: never), or the operator's default when not given."""
    from datetime import timedelta

    if text is None:
        days = store_settings().token_ttl_days
        return timedelta(days=days) if days > 0 else None
    if text.strip().lower() in ("never", "none", "0"):
        return None
    value, unit = text.strip()[:-1], text.strip()[-1:].lower()
    try:
        amount = float(value)
    except ValueError:
        amount = -1.0
    if unit not in _UNITS or amount <= 0:
        raise CliError(f"--ttl {text!r}: give a positive number and a unit (s, m, h, d), e.g. 90d, or 'never'")
    return timedelta(seconds=amount * _UNITS[unit])


@tokens_app.command("issue")
@one_line_errors()
def tokens_issue(tenant: Optional[str] = typer.Option(None, "--tenant", help="Tenant the token acts for."),
                 admin: bool = typer.Option(False, "--admin", help="Admin token (global without --tenant)."),
                 expert: bool = typer.Option(False, "--expert", help="A verified expert's detection token "
                                             "(every tenant's keys, the full result, each request audited)."),
                 scope_names: list[str] = typer.Option([], "--scope", help="Extra scope: 'evidence' (per-token "
                                                       "evidence, audited, its own daily budget)."),
                 ttl: Optional[str] = typer.Option(None, "--ttl", help=TTL_HELP),
                 as_json: bool = JSON_OPTION) -> None:
    """Issue an API token; it is printed once and stored only as a hash."""
    from keys.audit import default_actor
    from keys.tokens import issue_token

    lifetime = parse_ttl(ttl)
    with cli_store() as store, store.transaction() as session:
        issued = issue_token(session, tenant=tenant, admin=admin, expert=expert, scopes=scope_names,
                             actor=default_actor(), ttl=lifetime)
    scope = f"tenant {issued.info.tenant}" if issued.info.tenant else "all tenants"
    if expert:
        scope = "expert detection, all tenants"
    if issued.info.scopes:
        scope += "; scopes: " + ", ".join(issued.info.scopes)
    expires = issued.info.expires_at.isoformat(timespec="seconds") if issued.info.expires_at else "never"
    emit({**issued.info.to_dict(), "token": issued.raw_token}, as_json,
         f"{issued.raw_token}\n(token {issued.info.token_id}, {'admin, ' if admin else ''}{scope}; expires {expires}; "
         "shown once, store it now)")


@tokens_app.command("rotate")
@one_line_errors()
def tokens_rotate(token_id: str = typer.Argument(..., help="Token id (see `tokens list`)."),
                  overlap: str = typer.Option("1d", "--overlap", help="How long the old token keeps working "
                                              "(e.g. 1d, 2h; never past its own expiry)."),
                  ttl: Optional[str] = typer.Option(None, "--ttl", help="The new token's lifetime (default: the "
                                                    "old one's; 'never' for no expiry)."),
                  as_json: bool = JSON_OPTION) -> None:
    """Rotate a token without downtime: a new token with the same reach, printed once; the old
    one works until the overlap ends (or its own expiry, or its revocation), then stops."""
    from keys.audit import default_actor
    from keys.tokens import rotate_token

    span = parse_ttl(overlap)
    if span is None:
        raise CliError("--overlap must be a time span, e.g. 1d")
    lifetime = parse_ttl(ttl) if ttl is not None else None
    with cli_store() as store, store.transaction() as session:
        issued, old = rotate_token(session, token_id=token_id, actor=default_actor(), overlap=span, ttl=lifetime)
    expires = issued.info.expires_at.isoformat(timespec="seconds") if issued.info.expires_at else "never"
    emit({"new": {**issued.info.to_dict(), "token": issued.raw_token}, "old": old.to_dict()}, as_json,
         f"{issued.raw_token}\n(token {issued.info.token_id} replaces {old.token_id}, which works until "
         f"{old.expires_at.isoformat(timespec='seconds')}; this one expires {expires}; shown once, store it now)")


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
                 t.revoked_at.isoformat(timespec="seconds") if t.revoked_at else None,
                 t.expires_at.isoformat(timespec="seconds") if t.expires_at else "never",
                 t.last_used_at.isoformat(timespec="seconds") if t.last_used_at else None] for t in tokens],
               ["TOKEN_ID", "PREFIX", "TENANT", "ADMIN", "KIND", "SCOPES", "CREATED", "REVOKED", "EXPIRES",
                "LAST_USED"]))
