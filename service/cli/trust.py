"""What a verifying command trusts: the log key the verifier pinned, given as a file
(``--trust-log-key``) or pinned once per log on first use (``hallmark ledger pin``).

Pins live in one file, one verifier key line a log (``origin+keyid+key``, as ``hallmark
ledger checkpoint --json`` prints ``log_key``): ``$HALLMARK_KNOWN_LOGS``, else
``$XDG_CONFIG_HOME/hallmark/known-logs`` (``~/.config/hallmark/known-logs``). Like ssh's
``known_hosts``: the first contact is trusted explicitly, and a log that later offers another
key for the same origin is refused, never re-pinned silently.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from service.cli.app import CliError

if TYPE_CHECKING:
    from ledger.log.note import Verifier


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


def known_logs() -> Path:
    """The file of log keys pinned on first use (module docstring)."""
    explicit = os.environ.get("HALLMARK_KNOWN_LOGS")
    if explicit:
        return Path(explicit).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "hallmark" / "known-logs"


def _pins() -> list["Verifier"]:
    from ledger.log.note import NoteError, Verifier

    path = known_logs()
    if not path.exists():
        return []
    pins = []
    for number, line in enumerate(read_text(path, "pinned log keys file").splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                pins.append(Verifier.parse(line))
            except NoteError as exc:
                raise CliError(f"{path}, line {number}: {exc}") from None
    return pins


def pinned_log_key(origin: str) -> Optional["Verifier"]:
    return next((pin for pin in _pins() if pin.name == origin), None)


def pin_log_key(verifier: "Verifier") -> bool:
    """Pin ``verifier`` for its origin: True when newly pinned, False when already pinned;
    :class:`CliError` when another key is pinned for that origin."""
    found = pinned_log_key(verifier.name)
    if found is not None:
        if found.vkey != verifier.vkey:
            raise CliError(f"the log {verifier.name} now offers another key than the one pinned in {known_logs()} "
                           f"({found.vkey}): another log under its name, or its key was replaced; change the pin "
                           "only if its operator confirms the new key out of band")
        return False
    path = known_logs()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a", encoding="utf-8") as out:
        out.write(verifier.vkey + "\n")
    return True


def log_origin(keyset: Any) -> Optional[str]:
    """The origin of the log a key set names (its checkpoint's first line), None if none."""
    log = keyset.get("log") if isinstance(keyset, dict) else None
    if not isinstance(log, dict):
        return None
    if isinstance(log.get("origin"), str):
        return log["origin"]
    checkpoint = log.get("checkpoint")
    return checkpoint.split("\n", 1)[0] if isinstance(checkpoint, str) else None


def log_key_for(keyset: Any, url: Optional[str]) -> "Verifier":
    """The key pinned for the log ``keyset`` names, or a one-line error saying how to pin it."""
    origin = log_origin(keyset)
    found = pinned_log_key(origin) if origin else None
    if found is None:
        where = f"--url {url}" if url else "--url https://gateway"
        raise CliError(f"no log key pinned for the log {origin or 'this key set names'}: pin it once with `hallmark ledger pin "
                       f"{where}` (trust on first use; compare the key it prints with the one the operator "
                       "publishes), or give --trust-log-key FILE")
    return found
