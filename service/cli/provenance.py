"""Provenance commands: ``receipt verify``, ``signing-keys``, ``kek status``, ``db
grant-service-role`` (the ``ledger`` commands are in :mod:`service.cli.ledger_cmds`).

``receipt verify`` needs no database and no KEK: only the receipt, the public keys (a
``hallmark-keys.json`` file or a gateway's https URL), the log key the verifier pinned and,
optionally, the text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from service.cli.app import JSON_OPTION, CliError, app, db_app, emit, kek_app, one_line_errors
from service.cli.store import cli_store

ledger_app = typer.Typer(no_args_is_help=True, help="The provenance ledger.")
receipt_app = typer.Typer(no_args_is_help=True, help="Signed generation receipts.")
signing_app = typer.Typer(no_args_is_help=True, help="Keys that sign receipts and detection reports.")
app.add_typer(ledger_app, name="ledger")
app.add_typer(receipt_app, name="receipt")
app.add_typer(signing_app, name="signing-keys")

_domain_errors = one_line_errors()


def _actor() -> str:
    from keys.audit import default_actor

    return default_actor()


# --- ledger ------------------------------------------------------------------------------


# --- receipts ----------------------------------------------------------------------------


def _load_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CliError(f"{what} file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CliError(f"{what} file {path} is not JSON: {type(exc).__name__}") from None


def signed_type(document: Any) -> Any:
    """The ``type`` a signed document's statement declares (receipt or detection report)."""
    statement = document.get("statement") if isinstance(document, dict) else None
    return statement.get("type") if isinstance(statement, dict) else None


def _keyset(keys: Optional[Path], url: Optional[str]) -> dict[str, Any]:
    if (keys is None) == (url is None):
        raise CliError("give the public keys: --keys hallmark-keys.json or --url https://gateway")
    if keys is not None:
        return _load_json(keys, "key set")
    from service.cli.remote import fetch

    return fetch(url, "/.well-known/hallmark-keys.json")


def trusted_keyset(keys: Optional[Path], url: Optional[str], trust_log_key: Optional[Path], policy: Any = None):
    """The key set's keys that the pinned log holds (ledger.keyset.trusted_keys); what every
    verifying command (receipts, reports) checks signatures with. With a tlog-policy and no
    pinned key, the log is the policy's (its one ``log`` line)."""
    from ledger.keyset import trusted_keys
    from ledger.receipts import ReceiptInvalid
    from service.cli.trust import log_key_for, trusted_log_key

    if url is not None:  # checked before the log key, so a bad URL fails first whatever else is given
        from service.cli.remote import base_url

        base_url(url)
    log_key = trusted_log_key(trust_log_key)
    if log_key is None and policy is not None:
        if len(policy.logs) != 1:
            raise CliError("the policy lists no log or several: give --trust-log-key for the one that signed the keys")
        log_key = policy.logs[0][0]
    keyset = _keyset(keys, url)
    if log_key is None:  # the key pinned for this key set's log (`hallmark ledger pin`)
        log_key = log_key_for(keyset, url)
    try:
        return trusted_keys(keyset, log_key)
    except ReceiptInvalid as exc:
        raise CliError(f"key set rejected: {exc}") from None


@receipt_app.command("verify")
def receipt_verify(receipt: Path = typer.Argument(..., help="The receipt (JSON; a whole generation response works too)."),
                   text_file: Optional[Path] = typer.Option(None, "--text", help="Check that this file's text is the one attested."),
                   keys: Optional[Path] = typer.Option(None, "--keys", help="Public keys (hallmark-keys.json)."),
                   url: Optional[str] = typer.Option(None, "--url", help="Gateway base URL (https://) to fetch the public keys from."),
                   trust_log_key: Optional[Path] = typer.Option(None, "--trust-log-key", help="The log key you pinned (verifier key file or witness state)."),
                   policy_file: Optional[Path] = typer.Option(None, "--policy", help="A tlog-policy file: also check the receipt's tlog-proof against its log and witness quorum."),
                   as_json: bool = JSON_OPTION) -> None:
    """Verify a receipt offline: the signature by a key the pinned log holds, within its
    window; the entry's inclusion in the log; and (with --text) the text. With --policy, its
    c2sp.org/tlog-proof too: signed by a log the policy lists, cosigned by its witness quorum."""
    from ledger.receipts import ReceiptInvalid, verify_receipt, verify_tlog_proof

    from ledger.receipts import REPORT_TYPE

    document = _load_json(receipt, "receipt")
    if isinstance(document, dict) and "statement" not in document:
        # A whole response: REST (`receipt`), OpenAI (`hallmark.receipt`) or a `done` event.
        document = document.get("receipt") or (document.get("hallmark") or {}).get("receipt") or document
    if signed_type(document) == REPORT_TYPE or (isinstance(document, dict) and "report" in document):
        raise CliError(f"{receipt} holds a detection report, not a generation receipt: check it with "
                       f"`hallmark report verify {receipt}` (it takes the same --url/--keys and --trust-log-key)")
    text = None
    if text_file is not None:
        try:
            text = text_file.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"cannot read {text_file} as UTF-8 text: {type(exc).__name__}") from None
    policy = read_policy(policy_file) if policy_file is not None else None
    trusted = trusted_keyset(keys, url, trust_log_key, policy)
    witnessed = None
    try:
        statement = verify_receipt(document, trusted, text=text)
        if policy is not None:
            checkpoint, cosigned = verify_tlog_proof(document, statement, policy)
            witnessed = {"tree_size": checkpoint.size, "quorum": policy.quorum, "cosigned_by": sorted(cosigned)}
    except ReceiptInvalid as exc:
        raise CliError(f"receipt rejected: {exc}") from None
    summary = (f"ok: receipt of generation {statement['generation_id']} (tenant {statement['tenant']}, "
               f"ledger seq {statement['ledger']['seq']}, log leaf {statement['ledger'].get('leaf_index')}) "
               f"signed by {document['signature']['kid']}; in the log {trusted.log_key.name}"
               + (f"; witnessed at size {witnessed['tree_size']} by {', '.join(witnessed['cosigned_by']) or 'no one'}"
                  f" (quorum {policy.quorum} met)" if witnessed else "")
               + ("; the text matches" if text is not None else ""))
    signer = trusted.get(document["signature"]["kid"])
    if signer is not None and signer.revoked_at is not None:
        summary += (f"\nnote: its signing key was revoked as compromised at {signer.revoked_at}; the log, which held "
                    "this entry before then, vouches for what the receipt says (but for the tenant's name and the "
                    "key's fingerprint, which only the signature states)")
    emit({"valid": True, "text_matches": True if text is not None else None, "statement": statement,
          "log": {"origin": trusted.log_key.name, "leaf_index": statement["ledger"].get("leaf_index")},
          "witnessed": witnessed}, as_json, summary)


def read_policy(path: Path):
    """A tlog-policy file (ledger.log.policy), or the CLI's one-line error."""
    from ledger.log.policy import PolicyError, parse

    try:
        return parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read the policy {path}: {type(exc).__name__}") from None
    except PolicyError as exc:
        raise CliError(f"{path}: {exc}") from None


# --- signing keys ------------------------------------------------------------------------


def _signing_line(info: Any) -> str:
    window = f"{info.created_at.isoformat()} .. {info.retired_at.isoformat() if info.retired_at else ''}"
    flags = ("" if info.logged else "  NOT IN THE LOG") + ("" if info.consistent or not info.logged else
                                                            "  ROW DIFFERS FROM THE LOG")
    return f"{info.kid}  {info.state:<8} kek {info.kek_id}  valid {window}{flags}"


@signing_app.command("create")
@_domain_errors
def signing_create(as_json: bool = JSON_OPTION) -> None:
    """Create the first signing key (the gateway also creates one at start if none exists)."""
    from ledger.signing import create_signing_key

    with cli_store(require_kek=True) as store, store.transaction() as session:
        info = create_signing_key(session, store.keyring, actor=_actor())
    emit(info.to_dict(), as_json, f"created signing key {info.kid}")


@signing_app.command("rotate")
@_domain_errors
def signing_rotate(as_json: bool = JSON_OPTION) -> None:
    """Retire the active signing key (it stays published) and make a new one active."""
    from ledger.signing import rotate_signing_key

    with cli_store(require_kek=True) as store, store.transaction() as session:
        new, retired = rotate_signing_key(session, store.keyring, actor=_actor())
    emit({"new": new.to_dict(), "retired": retired.to_dict() if retired else None}, as_json,
         f"signing key {new.kid} active" + (f"; {retired.kid} retired (still published)" if retired else ""))


@signing_app.command("revoke")
@_domain_errors
def signing_revoke(kid: str = typer.Argument(..., help="The signing key's id (sk_...)."),
                   reason: str = typer.Option(..., "--reason", help="Why (e.g. 'leaked'); logged and published."),
                   compromised_at: Optional[str] = typer.Option(None, "--compromised-at", help="When the key was compromised (ISO 8601, UTC if no zone; default: now). Receipts of entries the log shows were appended before then stay verifiable; everything else it signed is refused. Unsure? Give the key's creation time."),
                   as_json: bool = JSON_OPTION) -> None:
    """Revoke a signing key (its private key is compromised since --compromised-at): verifiers
    keep its receipts of entries the log held before then and refuse everything else it signed.
    Revoking the active key makes a new one active."""
    from datetime import datetime, timezone

    from ledger.signing import revoke_signing_key

    when = None
    if compromised_at is not None:
        try:
            when = datetime.fromisoformat(compromised_at.replace("Z", "+00:00"))
        except ValueError:
            raise CliError("--compromised-at must be an ISO 8601 time, e.g. 2026-12-07T10:00:00Z") from None
        when = when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
    with cli_store(require_kek=True) as store, store.transaction() as session:
        revoked, new = revoke_signing_key(session, store.keyring, kid=kid, reason=reason, actor=_actor(),
                                          compromised_at=when)
    emit({"revoked": revoked.to_dict(), "new": new.to_dict() if new else None}, as_json,
         f"signing key {revoked.kid} revoked as compromised at {revoked.revoked_at.isoformat()}"
         + (f"; {new.kid} active" if new else ""))


@signing_app.command("list")
@_domain_errors
def signing_list(as_json: bool = JSON_OPTION) -> None:
    """Every signing key, retired ones too."""
    from ledger.signing import list_signing_keys

    with cli_store() as store, store.transaction(write=False) as session:
        infos = list_signing_keys(session)
    emit([i.to_dict() for i in infos], as_json, "\n".join(_signing_line(i) for i in infos) or "no signing keys")


@signing_app.command("export-public")
@_domain_errors
def signing_export_public(
    as_json: bool = typer.Option(False, "--json", help="Accepted for uniformity: the output is always JSON."),
) -> None:
    """Print the public key set (what /.well-known/hallmark-keys.json serves)."""
    from ledger.signing import public_keyset

    with cli_store(require_kek=True) as store, store.transaction(write=False) as session:
        typer.echo(json.dumps(public_keyset(session), indent=2))


# --- kek status ----------------------------------------------------------------------------


@kek_app.command("status")
@_domain_errors
def kek_status_command(as_json: bool = JSON_OPTION) -> None:
    """Keys per KEK id (watermark and signing keys), and which KEKs this process holds.
    During a staged rollout: all keys under the new KEK means the previous one can go."""
    from keys.kek_rotation import kek_status
    from ledger.sealed import KEK_DEPENDANTS

    with cli_store(require_kek=True) as store, store.transaction(write=False) as session:
        status = kek_status(session, store.keyring, KEK_DEPENDANTS)
    lines = [f"configured KEKs: {', '.join(status.configured)} (first wraps)"]
    signing = status.sealed["signing_keys"]
    for kek_id in sorted({*status.watermark_keys, *signing}):
        where = "configured" if kek_id in status.configured else "NOT configured: cannot be opened"
        lines.append(f"KEK {kek_id}: {status.watermark_keys.get(kek_id, 0)} watermark key(s), "
                     f"{signing.get(kek_id, 0)} signing key(s) ({where})")
    emit(status.to_dict(), as_json, "\n".join(lines))


# --- db grant-service-role ---------------------------------------------------------------


@db_app.command("grant-service-role")
@_domain_errors
def db_grant_service_role(role: str = typer.Argument(..., help="Existing PostgreSQL role the gateway connects as."),
                          as_json: bool = JSON_OPTION) -> None:
    """PostgreSQL: grant ROLE only what the gateway needs (append-only ledger and audit log,
    read-only keys and tokens). Run as the owner that migrates."""
    from keys.roles import grant_service_role

    with cli_store() as store, store.engine.begin() as connection:
        granted = grant_service_role(connection, role)
    emit(granted, as_json, "\n".join(f"{table}: {privileges}" for table, privileges in granted.items()))
