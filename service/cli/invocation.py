"""How the user's shell runs this installation's ``hallmark``, for the lines that tell a
user what to type (the quick start's banner and restart hint).

``make run`` installs the command into ``.venv/bin``, which is on no one's PATH until the
virtual environment is activated: the README and every message say ``hallmark …``, so a
banner must say how to make that work in the user's shell, exactly, and a hint printed
for copy-paste must be a command that runs as it is.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path


def _script() -> Path:
    return Path(sysconfig.get_path("scripts")) / "hallmark"


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it (``.venv/bin/…``)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def on_path() -> bool:
    """Whether ``hallmark`` in this shell's PATH is this installation's."""
    found = shutil.which("hallmark")
    script = _script()
    try:
        return found is not None and script.exists() and os.path.samefile(found, script)
    except OSError:
        return False


def activation() -> str | None:
    """The shell command that puts this installation's ``hallmark`` on PATH, or None when it
    already is (or when no such command exists)."""
    if on_path():
        return None
    activate = Path(sys.prefix) / "bin" / "activate"
    if sys.prefix != sys.base_prefix and activate.exists():
        return f"source {_shown(activate)}"
    script = _script()
    if script.exists():
        return f'export PATH="{_shown(script.parent)}:$PATH"'
    return None


def command(arguments: str) -> str:
    """``hallmark <arguments>`` as this shell runs it now: the bare name when it is on PATH,
    else the script's path (``.venv/bin/hallmark …``)."""
    script = _script()
    if on_path() or not script.exists():
        return f"hallmark {arguments}"
    return f"{_shown(script)} {arguments}"


def banner_line() -> str:
    """The quick start's line about the CLI."""
    setup = activation()
    if setup is None:
        return "the CLI: `hallmark --help` (`hallmark doctor` checks the set-up)"
    return (f"the CLI: run `{setup}` once in your shell (it puts `hallmark` on PATH, as README's commands "
            f"assume), then `hallmark --help`; or call `{command('--help')}` as it is")
