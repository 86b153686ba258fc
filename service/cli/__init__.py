"""The ``hallmark`` command line. Each command module registers itself on :data:`app`."""

from __future__ import annotations

from service.cli.app import app, main  # noqa: F401
from service.cli import watermark_cmds  # noqa: F401,E402  (registers prf, detect)

for _optional in ("admin", "serve", "generate", "deploy"):
    try:
        __import__(f"service.cli.{_optional}")
    except ModuleNotFoundError as exc:  # a module not written yet, not a missing dependency
        if exc.name != f"service.cli.{_optional}":
            raise
