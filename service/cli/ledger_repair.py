"""``hallmark ledger repair``: remove rows that block the transparency log (ledger.log.faults).

Run as the database owner (the gateway's role may not delete from the log's tables) with the
KEK: the head must authenticate under the log key first, since it decides what lies beyond
it. Every entry and leaf the log holds stays; what is removed is listed (and audited).
"""

from __future__ import annotations

import typer

from service.cli.app import JSON_OPTION, CliError, emit, one_line_errors
from service.cli.provenance import ledger_app
from service.cli.store import cli_store

_domain_errors = one_line_errors()


@ledger_app.command("repair")
@_domain_errors
def ledger_repair(dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be removed."),
                  as_json: bool = JSON_OPTION) -> None:
    """Remove rows of the log's tables that lie beyond its authenticated head (a leaf, subtree
    or checkpoint inserted without the log key, which blocks every append) and checkpoints the
    log key did not sign; as the database owner, with the KEK. Nothing the log holds is lost;
    the removal is audited."""
    from keys.audit import default_actor
    from ledger.log import faults, tlog

    with cli_store(require_kek=True) as store, store.transaction(write=not dry_run) as session:
        auth = tlog.required_authority(session)
        try:
            size, _ = tlog.read_head(session, auth, lock=not dry_run)
        except tlog.LogTampered as exc:
            raise CliError(f"{exc.user_message}; repair removes rows beyond an authentic head only: restore the "
                           "log_head row from a backup") from None
        found = (faults.foreign_rows(session, size, auth.verifier) if dry_run
                 else faults.repair(session, size, actor=default_actor(), verifier=auth.verifier))
    lines = found.describe()
    verb = "would remove" if dry_run else "removed"
    emit({"size": size, "dry_run": dry_run, "removed": found.to_dict(), "count": len(lines)}, as_json,
         "\n".join([f"{verb}: {line.split(':', 1)[0]}" for line in lines]
                   + [f"ok: the log holds {size} leaves; {len(lines)} row(s) beyond its head "
                      f"{'found' if dry_run else 'removed'}"]))
