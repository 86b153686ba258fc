"""One error shape for every response that is not a success.

Every error the gateway sends, whatever raised it (a domain error, request validation, an
unknown route or method, an oversized or non-JSON body, a database fault, a bug), is

    {"error": {"message": str, "type": str, "code": str}}

with ``type`` one of OpenAI's error types and ``code`` a stable snake_case identifier a
client can branch on. :func:`install` registers the handlers on an app.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from keys.errors import (ConcurrentChange, KekError, KeyStoreError, NoActiveKey, NotMigrated, ReadOnlyStore,
                         StoreBusy, StoreUnavailable, UnknownTenant)
from ledger.log.faults import LogBlocked
from service.errors import Conflict, NotFound, ServiceError, Unavailable
from service.request_log import request_id_of
from watermark.validation import summary

log = logging.getLogger("hallmark.http")

_STATUS_TYPES = {400: ("invalid_request_error", "bad_request"), 401: ("authentication_error", "unauthorized"),
                 403: ("permission_error", "forbidden"), 404: ("not_found_error", "not_found"),
                 405: ("invalid_request_error", "method_not_allowed"), 406: ("invalid_request_error", "not_acceptable"),
                 409: ("conflict_error", "conflict"), 413: ("invalid_request_error", "body_too_large"),
                 415: ("invalid_request_error", "unsupported_media_type"),
                 422: ("invalid_request_error", "invalid_request"), 429: ("rate_limit_error", "rate_limited"),
                 500: ("server_error", "internal_error"), 503: ("service_unavailable", "unavailable")}


def error_payload(status: int, message: str, *, kind: str | None = None, code: str | None = None) -> dict[str, Any]:
    default_kind, default_code = _STATUS_TYPES.get(status, ("server_error" if status >= 500 else
                                                            "invalid_request_error", f"http_{status}"))
    return {"error": {"message": message, "type": kind or default_kind, "code": code or default_code}}


def service_error_payload(exc: ServiceError) -> dict[str, Any]:
    return error_payload(exc.status, exc.message, kind=exc.kind, code=exc.code)


def error_response(exc: ServiceError) -> JSONResponse:
    return JSONResponse(service_error_payload(exc), status_code=exc.status, headers=exc.headers)


def _redacted(exc: KeyStoreError, what: str) -> str:
    """A client-safe message: never a database URL, driver message or KEK id. The detail
    goes to the log under a reference the client can quote."""
    reference = uuid.uuid4().hex[:16]
    log.error("store failure (reference %s, %s): %s", reference, type(exc).__name__, exc.user_message)
    return f"{what}; retry later (reference {reference}; the operator's log has the detail)"


def store_error(exc: KeyStoreError) -> ServiceError:
    """The HTTP error for a key-store failure: configuration problems are not retryable
    (4xx), a database that is down, busy or read-only is (503 with Retry-After). Database
    and KEK faults are redacted (:func:`_redacted`); domain errors keep their message."""
    if isinstance(exc, NoActiveKey):
        # 409, and `x-should-retry: false`: OpenAI's clients retry a bare 409 ("lock timeout"),
        # but a missing key needs an operator, not a retry.
        return Conflict(exc.user_message, code="no_active_key", headers={"x-should-retry": "false"})
    if isinstance(exc, UnknownTenant):
        return NotFound(exc.user_message, code="unknown_tenant")
    if isinstance(exc, LogBlocked):
        return Unavailable(exc.user_message, code="ledger_blocked", headers={"Retry-After": "30"})
    if isinstance(exc, ReadOnlyStore):
        return Unavailable(_redacted(exc, "the database is read-only"), code="database_read_only",
                           headers={"Retry-After": "30"})
    if isinstance(exc, (StoreUnavailable, StoreBusy, ConcurrentChange)):
        return Unavailable(_redacted(exc, "the database is unavailable"), code="database_unavailable",
                           headers={"Retry-After": "1"})
    if isinstance(exc, (NotMigrated, KekError)):
        return Unavailable(_redacted(exc, "the key store is misconfigured"), code="misconfigured")
    return Unavailable(_redacted(exc, "the key store failed"), code="store_error")


def _validation_message(exc: RequestValidationError) -> tuple[str, str]:
    errors = exc.errors()
    if errors and errors[0].get("type") == "json_invalid":
        ctx = errors[0].get("ctx") or {}
        return f"the request body is not valid JSON: {ctx.get('error', 'decode error')}", "invalid_json"
    return "invalid request: " + summary(errors, default="body", skip=("body",), limit=5), "invalid_request"


def install(app: FastAPI) -> None:
    """Register the handlers that give every error the one shape."""

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(KeyStoreError)
    async def _store_error(request: Request, exc: KeyStoreError) -> JSONResponse:
        return error_response(store_error(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, code = _validation_message(exc)
        return JSONResponse(error_payload(422, message, code=code), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 400 and message == "There was an error parsing the body":
            # FastAPI's answer to a body that is not UTF-8: the same 422 as any invalid JSON.
            return JSONResponse(error_payload(422, "the request body is not valid JSON (or not UTF-8 text)",
                                              code="invalid_json"), status_code=422)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.url.path}; see /docs for the API"
        elif exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow") or (exc.headers or {}).get("allow")
            message = f"method {request.method} is not allowed on {request.url.path}" + (
                f"; use {allowed}" if allowed else "")
        return JSONResponse(error_payload(exc.status_code, message), status_code=exc.status_code,
                            headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        # Sent from outside the request log's middleware: it adds the request id itself.
        request_id = request_id_of(request.scope)
        return JSONResponse(error_payload(500, "internal server error; the request was not completed"),
                            status_code=500, headers={"x-request-id": request_id} if request_id else None)
