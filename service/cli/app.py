"""Root Typer app, its sub-command groups and the one-line error convention.

Every command raises :class:`CliError` (or a domain error mapped to it) for anything a
user got wrong; :func:`main` prints ``error: <what is wrong and what to do>`` on stderr
and exits non-zero. No traceback, and never a secret, reaches the terminal.
"""

from __future__ import annotations

import functools
import gc
import json
import sys
from typing import Any, Callable, TypeVar

import typer

# rich_markup_mode=None: click's plain help. Typer's rich help shows every flag with a
# "<bool>" value (`--json <bool>`), which the flag refuses (`--json true` is a usage error).
app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  help="Hallmark: watermarked generation, detection and key management.")
tenants_app = typer.Typer(no_args_is_help=True, help="Tenants.")
keys_app = typer.Typer(no_args_is_help=True, help="Watermark keys: create, import, rotate, revoke, export.")
tokens_app = typer.Typer(no_args_is_help=True, help="API tokens.")
audit_app = typer.Typer(no_args_is_help=True, help="The audit log.")
kek_app = typer.Typer(no_args_is_help=True, help="The key-encryption key.")
db_app = typer.Typer(no_args_is_help=True, help="Database migrations.")
deploy_app = typer.Typer(no_args_is_help=True, help="vLLM deployment profiles.")
for _name, _sub in [("tenants", tenants_app), ("keys", keys_app), ("tokens", tokens_app),
                    ("audit", audit_app), ("kek", kek_app), ("db", db_app), ("deploy", deploy_app)]:
    app.add_typer(_sub, name=_name)


class CliError(Exception):
    """A user-facing failure: one line saying what is wrong and what to do."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


F = TypeVar("F", bound=Callable[..., Any])

JSON_OPTION = typer.Option(False, "--json", help="Print one JSON document instead of text.")


def one_line_errors(*also: type[BaseException]) -> Callable[[F], F]:
    """Decorator: the key store's errors (and ``also``, whose messages never hold secrets)
    become the CLI's one-line errors, also when a command is invoked without :func:`main`."""
    from keys.errors import KeyStoreError

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except KeyStoreError as exc:
                raise CliError(exc.user_message) from None
            except also as exc:  # type: ignore[misc]
                raise CliError(str(exc)) from None

        return wrapper  # type: ignore[return-value]

    return decorate


def emit(payload: Any, as_json: bool, text: str | None = None) -> None:
    """Print a result: JSON (one document) or a human line."""
    if as_json:
        typer.echo(json.dumps(payload, sort_keys=False, default=str))
    else:
        typer.echo(text if text is not None else json.dumps(payload, indent=2, default=str))


def _click_classes(name: str) -> tuple[type[BaseException], ...]:
    """``name`` (ClickException, Exit, Abort) from click and from the copy of click that
    Typer vendors (``typer._click``, whose classes are not click's).

    Only copies already imported count (no module that was never imported raised one), so
    that a command that never needs click does not import it; :func:`main` asks only once
    something was raised, after the command had the chance to import click (``serve``'s
    uvicorn does)."""
    found = []
    for module in ("click.exceptions", "typer._click.exceptions"):
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None:
            found.append(cls)
    return tuple(found)


def _usage_line(argv: list[str]) -> str | None:
    """The usage line of the deepest (sub)command named in ``argv``."""
    try:
        command = typer.main.get_command(app)
        names = ["hallmark"]
        for word in argv:
            sub = getattr(command, "commands", {}).get(word)
            if sub is None:
                break
            command, names = sub, names + [word]
        ctx = command.make_context(" ".join(names), [], resilient_parsing=True)
        return ctx.get_usage()
    except Exception:  # best effort: the error line alone is still printed
        return None


def main() -> None:
    # A command is a short process that creates ~200,000 long-lived objects while importing
    # (SQLAlchemy, pydantic, typer) and little garbage: with the default thresholds the
    # cyclic collector scans them ~180 times during `hallmark keys list`. Collect as rarely
    # as the server does (service/app.py) while a command runs. (Freezing the heap at exit
    # would also skip the interpreter's final collection, but then triton's nanobind reports
    # its objects as leaked on stderr.)
    thresholds = gc.get_threshold()
    gc.set_threshold(50_000, 50, 100)
    try:
        _run()
    finally:
        gc.set_threshold(*thresholds)


def _run() -> None:
    # The except clauses' expressions run only when something was raised.
    try:
        code = app(standalone_mode=False, prog_name="hallmark")
        if isinstance(code, int) and code:
            sys.exit(code)
    except CliError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except (typer.Abort, *_click_classes("Abort")):
        typer.echo("error: aborted", err=True)
        sys.exit(1)
    except _click_classes("Exit") as exc:
        sys.exit(getattr(exc, "exit_code", 0))
    except _click_classes("ClickException") as exc:
        # A usage error (unknown command, missing option value): click's usage line and one
        # error line, exit 2; never a traceback.
        if isinstance(getattr(exc, "message", None), str):
            # Typer checks choices with pydantic, whose messages start "Value error, ".
            exc.message = exc.message.removeprefix("Value error, ")
        if getattr(exc, "ctx", True) is None:  # the option parser's errors carry no context
            usage = _usage_line(sys.argv[1:])
            if usage:
                typer.echo(usage, err=True)
        exc.show()
        sys.exit(getattr(exc, "exit_code", 2))
    except Exception as exc:  # domain errors with safe messages
        mapped = getattr(exc, "user_message", None)
        if mapped:
            typer.echo(f"error: {mapped}", err=True)
            sys.exit(1)
        raise
