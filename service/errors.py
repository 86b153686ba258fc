"""Errors the HTTP layer turns into 4xx/5xx responses with a message a client can act on.

Each carries an HTTP ``status``, an OpenAI-style ``kind`` (the body's ``type``) and a
snake_case ``code`` a client can branch on; :mod:`service.http_errors` renders them as
``{"error": {"message", "type", "code"}}``.
"""

from __future__ import annotations

import logging
import uuid


class ServiceError(Exception):
    status = 400
    kind = "invalid_request_error"
    default_code = "bad_request"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}
        self.code = code or self.default_code


class BadRequest(ServiceError):
    status = 400


class Unauthorized(ServiceError):
    status = 401
    kind = "authentication_error"
    default_code = "unauthorized"


class Forbidden(ServiceError):
    status = 403
    kind = "permission_error"
    default_code = "forbidden"


class NotFound(ServiceError):
    status = 404
    kind = "not_found_error"
    default_code = "not_found"


class Conflict(ServiceError):
    """The request is well formed but the server's state does not allow it (for example a
    tenant without an active key): retrying does not help until an operator acts."""

    status = 409
    kind = "conflict_error"
    default_code = "conflict"


class TooLarge(ServiceError):
    status = 413
    default_code = "too_large"


class UnsupportedMediaType(ServiceError):
    status = 415
    default_code = "unsupported_media_type"


class Unprocessable(ServiceError):
    status = 422
    default_code = "invalid_request"


class RateLimited(ServiceError):
    status = 429
    kind = "rate_limit_error"
    default_code = "rate_limited"


class Unavailable(ServiceError):
    status = 503
    kind = "service_unavailable"
    default_code = "unavailable"
