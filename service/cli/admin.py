"""Admin commands: ``tenants``, ``keys``, ``tokens``, ``audit``, ``kek`` and ``db``.

Each command parses its options, opens the store from the environment
(``HALLMARK_DATABASE_URL``, ``HALLMARK_KEK`` / ``HALLMARK_KEK_FILE``), calls one domain
function of :mod:`keys` inside one transaction, and prints the result (``--json``: one
JSON document). A domain error becomes ``error: <one line>`` and a non-zero exit, and
the transaction is rolled back, so a failed command changes nothing. Only
``keys export --yes`` prints a secret, and ``tokens issue`` prints its new token once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import typer
from alembic.util.exc import CommandError
from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError

from keys import migrate
from keys.audit import default_actor, list_audit
from keys.db import Store, display_url, open_store, parse_url, translate_error
from keys.errors import NotMigrated
from keys.importing import read_secret_file, read_vllm_config
from keys.kek import generate_kek_file, read_kek_file
from keys.kek_rotation import rotate_kek
from keys.lifecycle import (
    KeyInfo,
    build_spec,
    create_key,
    get_key,
    import_key,
    list_keys,
    revoke_key,
    rotate_key,
)
from keys.material import export_key
from keys.settings import StoreSettings
from keys.tenants import create_tenant, list_tenants
from keys.tokens import issue_token, list_tokens, revoke_token
from service.cli.app import (JSON_OPTION, CliError, audit_app, db_app, emit, kek_app, keys_app, one_line_errors,
                             tenants_app, tokens_app)

_domain_errors = one_line_errors()


def _settings() -> StoreSettings:
    try:
        return StoreSettings()
    except ValidationError as exc:
        first = exc.errors()[0]
        name = "HALLMARK_" + "_".join(str(p) for p in first["loc"]).upper()
        raise CliError(f"{name}: {first['msg']}") from None


@contextmanager
def _store(*, require_kek: bool = False) -> Iterator[Store]:
    store = open_store(_settings(), require_kek=require_kek)
    try:
        yield store
    finally:
        store.close()


def _table(rows: list[list[Any]], headers: list[str]) -> str:
    if not rows:
        return "(none)"
    cells = [headers] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells)


def _spec_changes(algorithm: str | None, context_width: int | None, alpha: float | None,
                  dedup: str | None, dedup_max_history: str | None, coin: str | None) -> dict[str, Any]:
    """The spec fields given on the command line (absent options are left out)."""
    changes: dict[str, Any] = {}
    for name, value in (("algorithm", algorithm), ("context_width", context_width), ("alpha", alpha),
                        ("dedup", dedup), ("coin", coin)):
        if value is not None:
            changes[name] = value
    if dedup_max_history is not None:
        if dedup_max_history.strip().lower() in ("all", "none", "unlimited"):
            changes["dedup_max_history"] = None
        else:
            try:
                changes["dedup_max_history"] = int(dedup_max_history)
            except ValueError:
                raise CliError("--dedup-max-history takes a positive integer or 'all'") from None
    return changes


def _plain(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def _key_line(info: KeyInfo) -> str:
    return (f"key {info.key_id}: tenant {info.tenant}, version {info.version}, {info.state}, "
            f"fingerprint {info.fingerprint}, {info.spec.algorithm} w={info.spec.context_width}")


def _key_rows(keys: list[KeyInfo]) -> str:
    return _table([[k.key_id, k.tenant, k.version, k.state, k.fingerprint, k.spec.algorithm,
                    k.spec.context_width, "yes" if k.imported else "no", k.created_at.isoformat(timespec="seconds")]
                   for k in keys],
                  ["KEY_ID", "TENANT", "VERSION", "STATE", "FINGERPRINT", "ALGORITHM", "WIDTH",
                   "IMPORTED", "CREATED"])


# Spec options shared by create, import and rotate.
ALGORITHM = typer.Option(None, "--algorithm", help="gumbel or dual_key_gumbel.")
CONTEXT_WIDTH = typer.Option(None, "--context-width", help="Previous generated tokens seeding each token (1-16).")
ALPHA = typer.Option(None, "--alpha", help="dual_key_gumbel: share of key-B tokens without speculation.")
DEDUP = typer.Option(None, "--dedup", help="Context deduplication: none, single_turn or all.")
DEDUP_MAX_HISTORY = typer.Option(None, "--dedup-max-history", help="Positions searched for a repeat, or 'all'.")
COIN = typer.Option(None, "--coin", help="Speculative acceptance coin: ordinary or keyed (dual key only).")


# --- tenants ---------------------------------------------------------------------------


@tenants_app.command("create")
@_domain_errors
def tenants_create(name: str = typer.Argument(..., help="Tenant name (letters, digits, . _ -)."),
                   as_json: bool = JSON_OPTION) -> None:
    """Create a tenant."""
    with _store() as store, store.transaction() as session:
        info = create_tenant(session, name=name, actor=default_actor())
    emit(info.to_dict(), as_json, f"created tenant {info.name} ({info.id})")


@tenants_app.command("list")
@_domain_errors
def tenants_list(as_json: bool = JSON_OPTION) -> None:
    """List tenants."""
    with _store() as store, store.transaction(write=False) as session:
        tenants = list_tenants(session)
    emit([t.to_dict() for t in tenants], as_json,
         _table([[t.name, t.id, t.created_at.isoformat(timespec="seconds")] for t in tenants],
                ["NAME", "ID", "CREATED"]))


# --- keys ------------------------------------------------------------------------------


@keys_app.command("create")
@_domain_errors
def keys_create(tenant: str = typer.Option(..., "--tenant", help="Tenant name."),
                algorithm: Optional[str] = ALGORITHM, context_width: Optional[int] = CONTEXT_WIDTH,
                alpha: Optional[float] = ALPHA, dedup: Optional[str] = DEDUP,
                dedup_max_history: Optional[str] = DEDUP_MAX_HISTORY, coin: Optional[str] = COIN,
                as_json: bool = JSON_OPTION) -> None:
    """Create a random key: active if the tenant has none, else verify-only."""
    spec = build_spec(**_spec_changes(algorithm, context_width, alpha, dedup, dedup_max_history, coin))
    with _store(require_kek=True) as store, store.transaction() as session:
        info = create_key(session, store.keyring, tenant=tenant, spec=spec, actor=default_actor())
    note = "" if info.state == "active" else " (the tenant already has an active key; use `keys rotate` to replace it)"
    emit(info.to_dict(), as_json, f"created {_key_line(info)}{note}")


@keys_app.command("import")
@_domain_errors
def keys_import(tenant: str = typer.Option(..., "--tenant", help="Tenant name."),
                secret_file: Optional[Path] = typer.Option(
                    None, "--secret-file", help="File holding the 64-bit key (decimal or 0x hex)."),
                vllm_config: Optional[Path] = typer.Option(
                    None, "--vllm-config", help="JSON/YAML file with vLLM's --watermark-config (key included)."),
                algorithm: Optional[str] = ALGORITHM, context_width: Optional[int] = CONTEXT_WIDTH,
                alpha: Optional[float] = ALPHA, dedup: Optional[str] = DEDUP,
                dedup_max_history: Optional[str] = DEDUP_MAX_HISTORY, coin: Optional[str] = COIN,
                source: Optional[str] = typer.Option(None, "--source", help="Where the key comes from (recorded)."),
                as_json: bool = JSON_OPTION) -> None:
    """Import an existing deployment's key (for example vLLM's) so its text is detected."""
    changes = _spec_changes(algorithm, context_width, alpha, dedup, dedup_max_history, coin)
    if (secret_file is None) == (vllm_config is None):
        raise CliError("give exactly one of --secret-file F (with --algorithm and --context-width) "
                       "or --vllm-config F")
    if vllm_config is not None:
        if changes:
            raise CliError("--vllm-config carries the spec; leave out --algorithm, --context-width "
                           "and the other spec options")
        secret, spec = read_vllm_config(vllm_config)
        source = source or f"vllm-config:{vllm_config.name}"
    else:
        if algorithm is None or context_width is None:
            raise CliError("--secret-file needs --algorithm and --context-width, exactly as the "
                           "deployment used them (a wrong spec detects nothing)")
        spec = build_spec(**changes)
        secret = read_secret_file(secret_file)
    with _store(require_kek=True) as store, store.transaction() as session:
        info = import_key(session, store.keyring, tenant=tenant, secret=secret, spec=spec,
                          source=source, actor=default_actor())
    emit(info.to_dict(), as_json, f"imported {_key_line(info)}")


@keys_app.command("rotate")
@_domain_errors
def keys_rotate(tenant: str = typer.Option(..., "--tenant", help="Tenant name."),
                algorithm: Optional[str] = ALGORITHM, context_width: Optional[int] = CONTEXT_WIDTH,
                alpha: Optional[float] = ALPHA, dedup: Optional[str] = DEDUP,
                dedup_max_history: Optional[str] = DEDUP_MAX_HISTORY, coin: Optional[str] = COIN,
                as_json: bool = JSON_OPTION) -> None:
    """New active key (same spec unless options change it); the old one becomes verify-only."""
    changes = _spec_changes(algorithm, context_width, alpha, dedup, dedup_max_history, coin)
    with _store(require_kek=True) as store, store.transaction() as session:
        rotation = rotate_key(session, store.keyring, tenant=tenant, spec_changes=changes,
                              actor=default_actor())
    emit({"new": rotation.new.to_dict(), "previous": rotation.previous.to_dict()}, as_json,
         f"rotated tenant {tenant}: {rotation.new.key_id} (version {rotation.new.version}) is active, "
         f"{rotation.previous.key_id} (version {rotation.previous.version}) is verify-only")


@keys_app.command("list")
@_domain_errors
def keys_list(tenant: Optional[str] = typer.Option(None, "--tenant", help="Only this tenant's keys."),
              as_json: bool = JSON_OPTION) -> None:
    """List keys (never their secrets)."""
    with _store() as store, store.transaction(write=False) as session:
        keys = list_keys(session, tenant=tenant)
    emit([k.to_dict() for k in keys], as_json, _key_rows(keys))


@keys_app.command("show")
@_domain_errors
def keys_show(key_id: str = typer.Argument(..., help="Key id (see `keys list`)."),
              as_json: bool = JSON_OPTION) -> None:
    """Show one key's record (never its secret)."""
    with _store() as store, store.transaction(write=False) as session:
        info = get_key(session, key_id=key_id)
    data = info.to_dict()
    emit(data, as_json, "\n".join(f"{name}: {_plain(value)}" for name, value in data.items()))


@keys_app.command("revoke")
@_domain_errors
def keys_revoke(key_id: str = typer.Argument(..., help="Key id."),
                reason: str = typer.Option(..., "--reason", help="Why (recorded and audited)."),
                as_json: bool = JSON_OPTION) -> None:
    """Revoke a compromised key: detections under it are reported as revoked."""
    with _store() as store, store.transaction() as session:
        previous_state = get_key(session, key_id=key_id).state
        info = revoke_key(session, key_id=key_id, reason=reason, actor=default_actor())
    note = ""
    if previous_state == "active":
        note = (f"; tenant {info.tenant} has no active key now, create one with "
                f"`hallmark keys create --tenant {info.tenant}`")
    emit(info.to_dict(), as_json, f"revoked {info.key_id} (tenant {info.tenant}, version {info.version}){note}")


@keys_app.command("export")
@_domain_errors
def keys_export(key_id: str = typer.Argument(..., help="Key id."),
                yes: bool = typer.Option(False, "--yes", help="Confirm printing the secret."),
                as_json: bool = JSON_OPTION) -> None:
    """Print a key WITH its secret (audited). Anyone holding it can forge or strip watermarks."""
    if not yes:
        raise CliError("keys export prints the secret key; add --yes to confirm")
    with _store(require_kek=True) as store, store.transaction() as session:
        exported = export_key(session, store.keyring, key_id=key_id, actor=default_actor())
    vllm = exported.vllm_watermark_config()
    payload = {"key_id": exported.key_id, "tenant": exported.tenant, "version": exported.version,
               "state": exported.state, "fingerprint": exported.fingerprint,
               "spec": exported.spec.public_dict(), "secret": exported.secret,
               "secret_hex": f"0x{exported.secret:016x}", "vllm_watermark_config": vllm}
    text = "\n".join([
        f"key {exported.key_id} (tenant {exported.tenant}, version {exported.version}, {exported.state})",
        f"fingerprint: {exported.fingerprint}",
        f"secret: {exported.secret} (0x{exported.secret:016x})",
        f"vllm --watermark-config: {json.dumps(vllm) if vllm else '(not expressible: keyed coin)'}",
    ])
    emit(payload, as_json, text)


# --- tokens ----------------------------------------------------------------------------


@tokens_app.command("issue")
@_domain_errors
def tokens_issue(tenant: Optional[str] = typer.Option(None, "--tenant", help="Tenant the token acts for."),
                 admin: bool = typer.Option(False, "--admin", help="Admin token (global without --tenant)."),
                 as_json: bool = JSON_OPTION) -> None:
    """Issue an API token; it is printed once and stored only as a hash."""
    with _store() as store, store.transaction() as session:
        issued = issue_token(session, tenant=tenant, admin=admin, actor=default_actor())
    scope = f"tenant {issued.info.tenant}" if issued.info.tenant else "all tenants"
    emit({**issued.info.to_dict(), "token": issued.raw_token}, as_json,
         f"{issued.raw_token}\n(token {issued.info.token_id}, {'admin, ' if admin else ''}{scope}; "
         "shown once, store it now)")


@tokens_app.command("revoke")
@_domain_errors
def tokens_revoke(token_id: str = typer.Argument(..., help="Token id (see `tokens list`)."),
                  as_json: bool = JSON_OPTION) -> None:
    """Revoke an API token."""
    with _store() as store, store.transaction() as session:
        info = revoke_token(session, token_id=token_id, actor=default_actor())
    emit(info.to_dict(), as_json, f"revoked token {info.token_id} ({info.prefix}...)")


@tokens_app.command("list")
@_domain_errors
def tokens_list(tenant: Optional[str] = typer.Option(None, "--tenant", help="Only this tenant's tokens."),
                as_json: bool = JSON_OPTION) -> None:
    """List API tokens (ids and prefixes, never the tokens)."""
    with _store() as store, store.transaction(write=False) as session:
        tokens = list_tokens(session, tenant=tenant)
    emit([t.to_dict() for t in tokens], as_json,
         _table([[t.token_id, t.prefix + "...", t.tenant or "(all)", "yes" if t.admin else "no",
                  t.created_at.isoformat(timespec="seconds"),
                  t.revoked_at.isoformat(timespec="seconds") if t.revoked_at else None] for t in tokens],
                ["TOKEN_ID", "PREFIX", "TENANT", "ADMIN", "CREATED", "REVOKED"]))


# --- audit -----------------------------------------------------------------------------


@audit_app.command("list")
@_domain_errors
def audit_list(tenant: Optional[str] = typer.Option(None, "--tenant", help="Only this tenant's events."),
               action: Optional[str] = typer.Option(None, "--action", help="Only this action, e.g. key.rotated."),
               key_id: Optional[str] = typer.Option(None, "--key", help="Only events about this key."),
               limit: Optional[int] = typer.Option(None, "--limit", help="Only the most recent N events."),
               as_json: bool = JSON_OPTION) -> None:
    """The audit log, oldest first: every change, import, export, KEK rotation, token event."""
    with _store() as store, store.transaction(write=False) as session:
        events = list_audit(session, tenant=tenant, action=action, key_id=key_id, limit=limit)
    emit([e.to_dict() for e in events], as_json,
         _table([[e.id, e.occurred_at.isoformat(timespec="seconds"), e.actor, e.action, e.tenant,
                  e.key_id, json.dumps(e.details, sort_keys=True)] for e in events],
                ["ID", "TIME", "ACTOR", "ACTION", "TENANT", "KEY_ID", "DETAILS"]))


# --- kek -------------------------------------------------------------------------------


@kek_app.command("rotate")
@_domain_errors
def kek_rotate(new_kek_file: Path = typer.Option(..., "--new-kek-file", help="File with the new base64 KEK."),
               as_json: bool = JSON_OPTION) -> None:
    """Re-wrap every key under a new KEK in one transaction (the current KEK comes from the
    environment). Afterwards point HALLMARK_KEK_FILE at the new file."""
    new = read_kek_file(new_kek_file)
    with _store(require_kek=True) as store, store.transaction() as session:
        result = rotate_kek(session, current=store.keyring, new=new, actor=default_actor())
    emit({"previous_kek_ids": list(result.previous_kek_ids), "new_kek_id": result.new_kek_id,
          "rewrapped_keys": result.rewrapped}, as_json,
         f"re-wrapped {result.rewrapped} key(s) under KEK {result.new_kek_id}; set "
         f"HALLMARK_KEK_FILE={new_kek_file} now (the previous KEK opens nothing any more)")


@kek_app.command("generate")
@_domain_errors
def kek_generate(out: Path = typer.Option(..., "--out", help="New file to write (mode 0600; never overwritten)."),
                 as_json: bool = JSON_OPTION) -> None:
    """Write a new random KEK file."""
    kek = generate_kek_file(out)
    emit({"path": str(out), "kek_id": kek.id}, as_json, f"wrote a new KEK (id {kek.id}) to {out}")


# --- db --------------------------------------------------------------------------------


@contextmanager
def _unchecked_store(*, create: bool = False) -> Iterator[Store]:
    """The store without the schema check (for migrations), database faults made one-line."""
    store = open_store(_settings(), check_schema=False, create=create)
    try:
        yield store
    except DBAPIError as exc:
        mapped = translate_error(exc, store.url)
        if mapped is None:
            raise
        raise mapped from None
    finally:
        store.close()


@db_app.command("upgrade")
@_domain_errors
def db_upgrade(revision: str = typer.Option("head", "--revision", help="Target revision."),
               as_json: bool = JSON_OPTION) -> None:
    """Create or migrate the database schema."""
    with _unchecked_store(create=True) as store:
        before = migrate.current_revision(store.engine)
        try:
            migrate.upgrade(store.engine, revision)
        except CommandError as exc:
            raise CliError(f"cannot upgrade to {revision!r}: {exc}") from None
        after = migrate.current_revision(store.engine)
    shown = display_url(store.url)
    emit({"database": shown, "from": before, "to": after}, as_json,
         f"database {shown}: " + (f"already at {after}" if before == after
                                  else f"upgraded {before or '(empty)'} -> {after}"))


@db_app.command("downgrade")
@_domain_errors
def db_downgrade(revision: str = typer.Option("-1", "--revision", help="Target revision (base drops everything)."),
                 yes: bool = typer.Option(False, "--yes", help="Confirm: a downgrade drops tables and their data."),
                 as_json: bool = JSON_OPTION) -> None:
    """Migrate the schema down (destroys the data of dropped tables, keys included)."""
    if not yes:
        raise CliError("a downgrade drops tables and the data in them (keys included); add --yes to confirm")
    with _unchecked_store() as store:
        before = migrate.current_revision(store.engine)
        try:
            migrate.downgrade(store.engine, revision)
        except CommandError as exc:
            raise CliError(f"cannot downgrade to {revision!r}: {exc}") from None
        after = migrate.current_revision(store.engine)
    shown = display_url(store.url)
    emit({"database": shown, "from": before, "to": after}, as_json,
         f"database {shown}: downgraded {before or '(empty)'} -> {after or '(empty)'}")


@db_app.command("current")
@_domain_errors
def db_current(as_json: bool = JSON_OPTION) -> None:
    """Show the database's schema revision and the one this Hallmark needs."""
    settings = _settings()
    try:
        with _unchecked_store() as store:
            current = migrate.current_revision(store.engine)
    except NotMigrated:
        current = None  # a SQLite file not created yet: reported as empty, and not created
    head = migrate.head_revision()
    shown = display_url(parse_url(settings.database_url))
    emit({"database": shown, "current": current, "head": head}, as_json,
         f"database {shown}: at {current or '(empty)'}, this Hallmark needs {head}")
