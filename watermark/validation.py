"""Pydantic validation errors as one-line messages: the one formatter for every layer's
config objects (the spec here, the key store's inputs, the service's settings, requests and
profiles). It sits at the bottom of the import graph because the key store may import
only ``watermark``.

A message names where (the field path) and what (pydantic's message), never the offending
input, which may be a secret.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError


def _where(loc: Iterable[Any], skip: tuple[str, ...]) -> str:
    # Pydantic puts the validator or union member that failed into the location
    # ("function-after[check(), str]"); it names no field, so it is left out.
    return ".".join(str(part) for part in loc
                    if part not in skip and not (isinstance(part, str) and "[" in part))


def error_lines(errors: ValidationError | Iterable[Mapping[str, Any]], *, default: str = "value",
                skip: tuple[str, ...] = (), plain: bool = False) -> list[str]:
    """``where: message`` per error. ``default`` names an error without a location (empty:
    the message alone), ``skip`` drops location parts (FastAPI's ``body``), ``plain``
    removes pydantic's ``Value error, `` prefix from messages raised by validators."""
    if isinstance(errors, ValidationError):
        errors = errors.errors()
    lines = []
    for error in errors:
        where = _where(error.get("loc", ()), skip) or default
        message = str(error.get("msg", "invalid"))
        if plain:
            message = message.removeprefix("Value error, ")
        lines.append(f"{where}: {message}" if where else message)
    return lines


def summary(errors: ValidationError | Iterable[Mapping[str, Any]], *, default: str = "value",
            skip: tuple[str, ...] = (), plain: bool = False, limit: int | None = None) -> str:
    """Every distinct :func:`error_lines` line (at most ``limit``), joined by ``; ``."""
    lines = list(dict.fromkeys(error_lines(errors, default=default, skip=skip, plain=plain)))
    return "; ".join(lines[:limit])


def first_error(exc: ValidationError) -> tuple[str, str]:
    """(where, message) of the first error, for a message that names one field."""
    first = exc.errors()[0]
    return _where(first.get("loc", ()), ()), str(first.get("msg", "invalid"))


def describe(exc: ValidationError, *, default: str = "value") -> str:
    """The first error as ``where: message``."""
    return error_lines(exc.errors()[:1], default=default)[0]
