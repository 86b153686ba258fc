"""The request log: one line per HTTP request, and the request id that ties a client's
answer to the server's lines (a plain ASGI middleware, the gateway's outermost).

Each line holds the method, the route template (``/v1/generations/{generation_id}``, never
the concrete path of a matched route, never a query string), the status, the duration
until the last byte was sent (a stream's whole length) and the request id. Never a body,
a header or a token. A request that matched no route (404, or a body refused before
routing) names the route it would have reached, else its path, cut to 200 characters.

The request id is the client's ``x-request-id`` when it is a plain identifier (letters,
digits and ``._:-``, at most 128 characters), else a new random one; every response
carries it back in ``x-request-id``, and every log line written while the request runs
has it (:mod:`service.logs`).
"""

from __future__ import annotations

import logging
import random
import re
import time
from typing import Any, Iterable

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.logs import REQUEST_ID

log = logging.getLogger("hallmark.access")

HEADER = b"x-request-id"
SCOPE_KEY = "hallmark.request_id"
_ACCEPTED_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
_MAX_PATH = 200


def request_id_of(scope: Scope) -> str | None:
    """The id :class:`RequestLog` gave this request (None outside one)."""
    return scope.get(SCOPE_KEY)


def _incoming_id(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == HEADER:
            return value.decode("ascii") if _ACCEPTED_ID.fullmatch(value) else None
    return None


def _new_id() -> str:
    """32 random hex digits, as ``uuid4().hex`` had: from the interpreter's generator, seeded
    from the OS and again in each forked worker, because an id ties lines together and keeps
    no secret; ``uuid4`` read os.urandom per request, a system call that let the writes'
    thread (service.access.group_commit) take the interpreter from the event loop (~1 ms a
    request under load, bench.detect_asgi --profile)."""
    return f"{random.getrandbits(128):032x}"


def _printable(path: str) -> str:
    cut = path[:_MAX_PATH] + ("…" if len(path) > _MAX_PATH else "")
    return cut.encode("unicode_escape").decode("ascii") if not cut.isprintable() else cut


class RequestLog:
    """Logs every HTTP request once it is answered, and sets ``x-request-id``. ``routes``:
    the app's routes, to name the route of a request refused before routing."""

    def __init__(self, app: ASGIApp, routes: list[BaseRoute] | None = None) -> None:
        self.app = app
        self.routes = routes or []

    def _template(self, scope: Scope) -> str | None:
        route = scope.get("route")
        if route is None:
            for candidate in self.routes:
                if candidate.matches(scope)[0] == Match.FULL:
                    route = candidate
                    break
        return getattr(route, "path", None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request_id = _incoming_id(scope.get("headers") or ()) or _new_id()
        scope[SCOPE_KEY] = request_id
        # Not reset afterwards: the server runs each request in a task of its own, whose
        # context ends with it; the 500 handler outside this middleware still reads it.
        REQUEST_ID.set(request_id)
        status: int | None = None

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), (HEADER, request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except BaseException:
            status = status or 500  # what the server's error middleware answers
            raise
        finally:
            self._log(scope, status, time.perf_counter() - start, request_id)

    def _log(self, scope: Scope, status: int | None, seconds: float, request_id: str) -> None:
        route = self._template(scope)
        fields: dict[str, Any] = {"method": scope["method"][:16], "route": route, "status": status,
                                  "duration_ms": round(seconds * 1000, 1), "request_id": request_id}
        shown = route
        if route is None:
            fields["path"] = shown = _printable(scope.get("path", ""))
        # No status: the client left before an answer started (or the app sent none).
        level = logging.WARNING if status is None else logging.ERROR if status >= 500 else logging.INFO
        log.log(level, "%s %s %s %.1f ms id=%s", fields["method"], shown, status if status is not None else "-",
                fields["duration_ms"], request_id, extra=fields)
