"""Errors the HTTP layer turns into 4xx/5xx responses with a message a client can act on."""

from __future__ import annotations


class ServiceError(Exception):
    status = 400
    kind = "invalid_request_error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class BadRequest(ServiceError):
    status = 400


class Unauthorized(ServiceError):
    status = 401
    kind = "authentication_error"


class Forbidden(ServiceError):
    status = 403
    kind = "permission_error"


class NotFound(ServiceError):
    status = 404
    kind = "not_found_error"


class TooLarge(ServiceError):
    status = 413


class Unprocessable(ServiceError):
    status = 422


class RateLimited(ServiceError):
    status = 429
    kind = "rate_limit_error"


class Unavailable(ServiceError):
    status = 503
    kind = "service_unavailable"
