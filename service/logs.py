"""The serving process's log: one format for every logger in it (Hallmark's, uvicorn's, the
libraries'), plain text by default or one JSON object a line (``HALLMARK_LOG_FORMAT=json``)
for a log shipper, and the id of the request each line was written for.

The request id lives in a context variable that :mod:`service.request_log` sets per
request (each request runs in its own task, so its context is its own); a filter copies it
onto every record, so a traceback logged deep inside a route carries the id the client got
in its ``x-request-id`` header.
"""

from __future__ import annotations

import contextvars
import json
import logging
from datetime import datetime, timezone
from typing import Any

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("hallmark_request_id", default=None)

# Attributes every LogRecord has; anything else on a record came from ``extra=`` (or a
# filter) and is a field of its own in JSON lines.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
# uvicorn passes a coloured copy of some messages; it is noise in a log file.
_DROPPED = {"color_message"}


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` (None outside a request) to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = REQUEST_ID.get()
        return True


def _timestamp(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC, RFC 3339), ``level``, ``logger``, ``message``,
    ``request_id`` when the line belongs to a request, the record's extra fields (an access
    line's ``method``, ``route``, ``status``, ``duration_ms``), and ``exception`` (the
    traceback as one string) when there is one. Newlines inside values are escaped, so a
    multi-line traceback is still one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"ts": _timestamp(record), "level": record.levelname.lower(),
                                "logger": record.name, "message": record.getMessage()}
        for name, value in vars(record).items():
            if name in _STANDARD or name in _DROPPED or name in line:
                continue
            if name == "request_id" and value is None:
                continue
            line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``2026-12-02T10:00:00.123Z INFO hallmark.access: POST /v1/detect 401 2.1 ms id=…``."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        request_id = getattr(record, "request_id", None)
        if request_id and "id=" not in record.getMessage():
            text += f" id={request_id}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


FORMATTERS = {"text": TextFormatter, "json": JsonFormatter}


def logging_config(log_format: str = "text", level: str = "info") -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` dictionary (what uvicorn's ``log_config`` takes):
    every line to stderr in ``log_format``; Hallmark's and uvicorn's loggers at ``level``,
    other libraries' at warning or above."""
    if log_format not in FORMATTERS:
        raise ValueError(f"unknown log format {log_format!r}; expected one of {sorted(FORMATTERS)}")
    level = level.upper()
    handler = ["stderr"]
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": RequestIdFilter}},
        "formatters": {"hallmark": {"()": FORMATTERS[log_format]}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr",
                                "formatter": "hallmark", "filters": ["request_id"]}},
        "loggers": {
            "hallmark": {"handlers": handler, "level": level, "propagate": False},
            "uvicorn": {"handlers": handler, "level": level, "propagate": False},
            # The request log (service.request_log) replaces uvicorn's access log, which
            # writes the raw path with its query string.
            "uvicorn.access": {"handlers": handler, "level": "WARNING", "propagate": False},
        },
        "root": {"handlers": handler, "level": "WARNING"},
    }
