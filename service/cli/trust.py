"""What a verifying command trusts: the log key the verifier pinned (``--trust-log-key``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from service.cli.app import CliError


def read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read the {what} {path}: {type(exc).__name__}") from None


def trusted_log_key(path: Optional[Path]):
    """The pinned log key from ``--trust-log-key`` (a verifier key line, a witness state, or
    ``ledger checkpoint --json`` output); None when not given."""
    if path is None:
        return None
    from ledger.keyset import read_log_key
    from ledger.receipts import ReceiptInvalid

    try:
        return read_log_key(read_text(path, "trusted log key file"))
    except ReceiptInvalid as exc:
        raise CliError(str(exc)) from None
