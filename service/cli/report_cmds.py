"""``hallmark report verify``: check a signed detection report offline, as ``receipt verify``
checks a receipt (the format: :mod:`ledger.reports`).

No database and no KEK: only the report, the public keys (a ``hallmark-keys.json`` file or
a gateway's https URL), the log key the verifier pinned and, optionally, the text or token
ids it should be about.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from service.cli.app import JSON_OPTION, CliError, app, emit
from service.cli.provenance import _load_json, signed_type, trusted_keyset

report_app = typer.Typer(no_args_is_help=True, help="Signed detection reports.")
app.add_typer(report_app, name="report")


def _report_of(document: Any) -> Any:
    """The report in ``document``: the report itself or a whole ``/v1/detect`` response."""
    if isinstance(document, dict) and "statement" not in document and isinstance(document.get("report"), dict):
        return document["report"]
    return document


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {path} as UTF-8 text: {type(exc).__name__}") from None


def _read_token_ids(path: Path) -> list[int]:
    ids = _load_json(path, "token ids")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32
                                            for t in ids):
        raise CliError(f"token ids file {path} is not a JSON array of integers in [0, 2**32)")
    return ids


@report_app.command("verify")
def report_verify(
    report: Path = typer.Argument(..., help="The report (JSON; a whole /v1/detect response works too)."),
    text_file: Optional[Path] = typer.Option(None, "--text-file", "--text",
                                             help="Check that the report is about this file's text (UTF-8, as sent)."),
    token_ids_file: Optional[Path] = typer.Option(None, "--token-ids-file",
                                                  help="Check that the report is about these token ids (a JSON array)."),
    keys: Optional[Path] = typer.Option(None, "--keys", help="Public keys (hallmark-keys.json)."),
    url: Optional[str] = typer.Option(None, "--url", help="Gateway base URL (https://) to fetch the public keys from."),
    trust_log_key: Optional[Path] = typer.Option(None, "--trust-log-key",
                                                 help="The log key you pinned (verifier key file or witness state)."),
    max_p: Optional[float] = typer.Option(None, "--max-p", min=0.0, max=1.0,
                                          help="Refuse a 'watermarked' verdict signed at a threshold above this "
                                               "(your policy maximum, e.g. 1e-6)."),
    policy_file: Optional[Path] = typer.Option(None, "--policy",
                                               help="A tlog-policy file: also check the tlog-proofs of the ledger "
                                                    "entries it cites (log signature, witness quorum, inclusion)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Verify a detection report offline: signature and signing key, the format's own
    consistency (detector id, verdict against threshold), and with --text-file or
    --token-ids-file that it is about that input. Prints what the report says was checked."""
    from ledger.reports import verify_report, verify_report_proofs
    from service.cli.provenance import read_policy
    from ledger.receipts import ReceiptInvalid

    from ledger.receipts import RECEIPT_TYPE
    from ledger.sigalg import COMPOSITE

    document = _report_of(_load_json(report, "report"))
    if signed_type(document) == RECEIPT_TYPE or (isinstance(document, dict) and "receipt" in document):
        raise CliError(f"{report} holds a generation receipt, not a detection report: check it with "
                       f"`hallmark receipt verify {report}` (it takes the same --url/--keys and --trust-log-key)")
    text = _read_text(text_file) if text_file is not None else None
    token_ids = _read_token_ids(token_ids_file) if token_ids_file is not None else None
    try:
        # Keys as the pinned log holds them: a key it does not hold, a revoked one, or a report
        # dated outside its key's window is refused (ledger.keyset, ledger.receipts.check_window).
        policy = read_policy(policy_file) if policy_file is not None else None
        check = verify_report(document, trusted_keyset(keys, url, trust_log_key, policy), text=text,
                              token_ids=token_ids, max_p=max_p)
        proved = verify_report_proofs(document, check.statement, policy) if policy is not None else None
    except ReceiptInvalid as exc:
        raise CliError(f"report rejected: {exc}") from None
    statement = check.statement
    kid = document["signature"]["kid"]
    if document["signature"].get("alg") == COMPOSITE:  # verify_signed required both to verify
        kid += " (Ed25519 and ML-DSA-44 signatures both verified)"
    matched = [what for what, ok in (("the text matches", check.text_matches),
                                     ("the token ids match", check.token_ids_match)) if ok]
    if check.version == 1:
        summary = (f"ok: detection report (version 1: it does not state the keys tested or the settings) of "
                   f"{statement.get('created_at')}, verdict {statement.get('verdict')}, signed by {kid}")
    else:
        summary = (f"ok: detection report of {statement['created_at']}: {statement['verdict_text']}; "
                   f"basis {', '.join(statement['basis']) or 'none'}; detector {statement['detector']['id']}; "
                   f"signed by {kid}")
    summary += "".join(f"; {what}" for what in matched)
    if proved is not None:
        summary += (f"; {len(proved)} cited ledger entr{'y' if len(proved) == 1 else 'ies'} proved in the log under "
                    f"the policy (quorum {policy.quorum})" if proved else "; it cites no ledger entry to prove")
    emit({"valid": True, "version": check.version, "text_matches": check.text_matches,
          "token_ids_match": check.token_ids_match, "statement": statement, "proved": proved}, as_json, summary)

