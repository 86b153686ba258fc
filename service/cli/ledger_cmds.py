"""Ledger commands: ``ledger verify`` (the chains and the transparency log), ``ledger
checkpoint``, ``ledger witness``, ``ledger init``."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any, Optional

import typer

from service.cli.app import JSON_OPTION, CliError, emit, one_line_errors
from service.cli.provenance import ledger_app
from service.cli.store import cli_store
from service.cli.trust import read_text as _read_text, trusted_log_key

_domain_errors = one_line_errors()


def _pinned_checkpoint(path: Path) -> str:
    """A checkpoint note from a file: the note itself, a witness state, or a receipt."""
    raw = _read_text(path, "checkpoint file")
    if raw.lstrip().startswith("{"):
        try:
            document = json.loads(raw)
            note = document.get("checkpoint") or (document.get("receipt") or document).get("log", {}).get("checkpoint")
        except (ValueError, AttributeError):
            note = None
        if not isinstance(note, str):
            raise CliError(f"{path} holds no checkpoint (a checkpoint note, a witness state or a receipt)")
        return note
    return raw


@ledger_app.command("verify")
@_domain_errors
def ledger_verify(tenant: Optional[str] = typer.Option(None, "--tenant", help="Only this tenant's chain (the log is checked whole)."),
                  checkpoint: list[Path] = typer.Option([], "--checkpoint", help="A checkpoint you hold (note, witness state or receipt): the log must still hold it. Repeatable."),
                  trust_log_key: Optional[Path] = typer.Option(None, "--trust-log-key", help="The log key you pinned (default: the store's, opened with the KEK)."),
                  as_json: bool = JSON_OPTION) -> None:
    """Walk the hash chain(s) and audit the transparency log against the ledger; exit 1
    naming what was modified, deleted, inserted, reordered or cut off."""
    from keys.errors import KekError
    from ledger.entries import verify_chain
    from ledger.log.audit import audit_log
    from ledger.log.key import store_log_key
    from keys.tenants import get_tenant

    pinned = [(f"checkpoint {path}", _pinned_checkpoint(path)) for path in checkpoint]
    log_key = trusted_log_key(trust_log_key)
    with cli_store() as store, store.transaction(write=False) as session:
        tenant_id = get_tenant(session, name=tenant).id if tenant is not None else None
        report = verify_chain(session, tenant_id=tenant_id)
        try:
            auth = store_log_key(store, session)
        except KekError:
            auth = None
        log = audit_log(session, auth, pinned=pinned, log_key=log_key)
    if as_json:
        emit({**report.to_dict(), "ok": report.ok and log.ok, "log": log.to_dict()}, True)
    else:
        for head in report.heads:
            logged = log.tenant_leaves.get(head.tenant, 0)
            typer.echo(f"tenant {head.tenant}: {head.entries} entries ({logged} in the log), head seq "
                       f"{head.head_seq} hash {head.head_hash}")
        typer.echo(f"log: {log.size} leaves, root {log.root}, {log.checkpoints} published checkpoint(s)"
                   + ("" if log.macs_checked else " (leaf MACs not checked: no KEK)"))
    if not (report.ok and log.ok):
        if not as_json:
            for problem in report.problems:
                typer.echo(f"error: ledger chain broken at {problem}", err=True)
            for problem in log.problems:
                typer.echo(f"error: transparency log: {problem}", err=True)
        raise typer.Exit(1)
    if not as_json:
        typer.echo(f"ok: {len(report.heads)} chain(s) intact; the log holds every entry as written")


@ledger_app.command("init")
@_domain_errors
def ledger_init(origin: Optional[str] = typer.Option(None, "--origin", help="The log's name in its checkpoints, e.g. example.com/hallmark (default: derived from its key)."),
                as_json: bool = JSON_OPTION) -> None:
    """Create the transparency log's key (as the database owner, with the KEK), adopt the
    ledger's existing entries and signing keys as its first leaves, publish a checkpoint."""
    from ledger.log import tlog
    from keys.audit import default_actor

    with cli_store(require_kek=True) as store, store.transaction() as session:
        auth, adopted = tlog.ensure_log(session, store.keyring, actor=default_actor(), origin=origin)
        tlog.publish(session, auth)
        size, _ = tlog.read_head(session, auth)
    emit({"origin": auth.origin, "log_key": auth.verifier.vkey, "size": size, "adopted": adopted}, as_json,
         f"log {auth.origin}: {size} leaves ({adopted} adopted now); its key, for verifiers to pin:\n"
         f"{auth.verifier.vkey}")


def _checkpoint_json(note: str, log_key: Any) -> dict[str, Any]:
    from ledger.log.note import open_checkpoint

    checkpoint = open_checkpoint(note, log_key)
    return {"origin": checkpoint.origin, "size": checkpoint.size, "root": base64.b64encode(checkpoint.root).decode(),
            "timestamp_ns": checkpoint.timestamp_ns, "log_key": log_key.vkey, "checkpoint": note}


@ledger_app.command("checkpoint")
@_domain_errors
def ledger_checkpoint(as_json: bool = JSON_OPTION) -> None:
    """Print the latest published checkpoint (a C2SP signed note; --json adds its fields
    and the log key to pin)."""
    from ledger.log import tlog
    from ledger.log.key import log_verifier

    with cli_store() as store, store.transaction(write=False) as session:
        found = tlog.latest_checkpoint(session)
        log_key = log_verifier(session)
    if found is None or log_key is None:
        raise CliError("the log has published no checkpoint yet: start the gateway or run `hallmark ledger init`")
    if as_json:
        emit(_checkpoint_json(found.note, log_key), True)
    else:
        typer.echo(found.note, nl=False)


def _log_source(url: Optional[str]):
    """(checkpoint note, consistency fetcher, the server's own log key) from a gateway
    (``url``) or from the database."""
    from ledger.log.note import Verifier

    if url is not None:
        from service.cli.remote import fetch

        note = fetch(url, "/v1/ledger/checkpoint", as_json=False)
        keyset = fetch(url, "/.well-known/hallmark-keys.json")

        def consistency(old: int, new: int) -> list[bytes]:
            body = fetch(url, "/v1/ledger/proof/consistency", params={"from": old, "to": new})
            return [base64.b64decode(h) for h in body["consistency_proof"]]

        offered = (keyset.get("log") or {}).get("vkey") if isinstance(keyset, dict) else None
        return note, consistency, Verifier.parse(offered) if isinstance(offered, str) else None

    from ledger.log import tlog
    from ledger.log.key import log_verifier

    def consistency_db(old: int, new: int) -> list[bytes]:
        with cli_store() as store, store.transaction(write=False) as session:
            return tlog.consistency_proof(session, old, new)

    with cli_store() as store, store.transaction(write=False) as session:
        found = tlog.latest_checkpoint(session)
        offered = log_verifier(session)
    if found is None:
        raise CliError("the log has published no checkpoint yet")
    return found.note, consistency_db, offered


@ledger_app.command("pin")
def ledger_pin(url: str = typer.Option(..., "--url", help="The gateway (https://; http only to this machine)."),
               as_json: bool = JSON_OPTION) -> None:
    """Pin a gateway's transparency-log key on first use, so that `receipt verify` and `report
    verify` need no --trust-log-key for its receipts and reports. Compare the key it prints with
    the one the operator publishes (`hallmark ledger checkpoint --json` prints it as log_key)."""
    from ledger.log.note import NoteError, Verifier, open_checkpoint
    from service.cli.remote import fetch
    from service.cli.trust import known_logs, pin_log_key

    keyset = fetch(url, "/.well-known/hallmark-keys.json")
    log = keyset.get("log") if isinstance(keyset, dict) else None
    try:
        offered = Verifier.parse(log["vkey"])
        open_checkpoint(log["checkpoint"], offered)  # the key signs the log the gateway serves
    except (TypeError, KeyError, NoteError) as exc:
        raise CliError(f"{url} offers no usable transparency-log key ({exc})") from None
    first = pin_log_key(offered)
    emit({"origin": offered.name, "log_key": offered.vkey, "pinned_now": first, "file": str(known_logs())}, as_json,
         (f"pinned on first use, in {known_logs()}: the log {offered.name}, key\n{offered.vkey}\n"
          "compare it with the key its operator publishes; `receipt verify` and `report verify` use it from now on")
         if first else f"already pinned: the log {offered.name}, key {offered.vkey} ({known_logs()})")


@ledger_app.command("witness")
def ledger_witness(state: Path = typer.Option(..., "--state", help="This witness's state file (created on the first run)."),
                   url: Optional[str] = typer.Option(None, "--url", help="The gateway (https://); default: the database."),
                   trust_log_key: Optional[Path] = typer.Option(None, "--trust-log-key", help="The log key to pin on the first run (default: trust the log's own on first use)."),
                   peer: list[Path] = typer.Option([], "--peer", help="Another witness's state (or checkpoint): must be the same history (gossip). Repeatable."),
                   as_json: bool = JSON_OPTION) -> None:
    """Fetch the log's checkpoint and the consistency proof from the one this witness saw
    last; keep the new one only if both verify. Exit 1 with one line on a rollback, a fork,
    a bad signature or a failed proof (the state is kept)."""
    from ledger.log.witness import WitnessError, advance, compare, load_state, save_state

    try:
        old = load_state(state)
        pinned = trusted_log_key(trust_log_key)
        note, consistency, offered = _log_source(url)
        log_key = old.log_key if old is not None else (pinned or offered)
        if log_key is None:
            raise CliError("no log key to trust: give --trust-log-key")
        if old is not None and pinned is not None and pinned != old.log_key:
            raise CliError("--trust-log-key differs from the log key this witness pinned on its first run")
        new = advance(old, log_key, note, consistency)
        gossip = [compare(new, _pinned_checkpoint(path), consistency) for path in peer]
    except WitnessError as exc:
        raise CliError(str(exc)) from None
    save_state(state, new)
    first = old is None
    summary = (f"{'pinned the log key on first use: ' + log_key.vkey + chr(10) if first and pinned is None else ''}"
               f"ok: {log_key.name} at size {new.checkpoint.size}"
               + (" (first checkpoint stored)" if first else f" (from {old.checkpoint.size}, consistent)")
               + "".join(f"\nok: {line}" for line in gossip))
    emit({"ok": True, "first_run": first, "previous_size": None if first else old.checkpoint.size,
          **new.to_dict(), "gossip": gossip}, as_json, summary)
