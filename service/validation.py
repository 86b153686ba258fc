"""Pydantic validation errors as one-line messages: the one formatter every HTTP error,
CLI error and profile check uses. A message names where (the field path) and what
(pydantic's message), never the offending input, which may be a secret."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError


def error_lines(errors: ValidationError | Iterable[Mapping[str, Any]], *, default: str = "value",
                skip: tuple[str, ...] = (), plain: bool = False) -> list[str]:
    """``where: message`` per error. ``default`` names an error without a location (empty:
    the message alone), ``skip``
    drops location parts (FastAPI's ``body``), ``plain`` removes pydantic's
    ``Value error, `` prefix from messages raised by validators."""
    if isinstance(errors, ValidationError):
        errors = errors.errors()
    lines = []
    for error in errors:
        where = ".".join(str(part) for part in error.get("loc", ()) if part not in skip)
        message = str(error.get("msg", "invalid"))
        if plain:
            message = message.removeprefix("Value error, ")
        where = where or default
        lines.append(f"{where}: {message}" if where else message)
    return lines


def first_error(exc: ValidationError) -> tuple[str, str]:
    """(where, message) of the first error, for a message that names one field."""
    first = exc.errors()[0]
    return ".".join(str(part) for part in first.get("loc", ())), str(first.get("msg", "invalid"))


def describe(exc: ValidationError, *, default: str = "value") -> str:
    """The first error as ``where: message``."""
    return error_lines(exc.errors()[:1], default=default)[0]
