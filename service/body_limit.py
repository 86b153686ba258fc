"""Request bodies: a size limit every client can read, and JSON only (a pure ASGI middleware).

The middleware reads the body itself, counting bytes as they arrive, whether the client
declared a Content-Length or sent it chunked. Over ``limit`` it answers 413 in the
gateway's error shape. It first drains what the client is still sending (up to
``drain_limit`` bytes): a client that writes its whole body before reading, like Python's
urllib, otherwise sees a connection reset instead of the 413. A body with a Content-Type
that is not JSON gets 415; a body without one is read as JSON (curl's ``-d`` without
``-H`` sends form encoding, which gets 415 with the header to use).

Routes then read the buffered body; later ``receive()`` calls (a streaming response
watching for the client to leave) go to the server as usual.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.http_errors import error_payload

_BODY_METHODS = {"POST", "PUT", "PATCH"}


def _is_json(content_type: bytes) -> bool:
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


async def _send_error(send: Send, status: int, message: str, close: bool = False) -> None:
    body = json.dumps(error_payload(status, message)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """Refuse request bodies above ``limit`` bytes with a readable 413, and non-JSON bodies with 415."""

    def __init__(self, app: ASGIApp, limit: int, drain_limit: int | None = None) -> None:
        self.app = app
        self.limit = limit
        self.drain_limit = drain_limit if drain_limit is not None else max(8 * limit, 8 * 2**20)

    async def _drain(self, receive: Receive, seen: int, more: bool) -> None:
        while more and seen <= self.drain_limit:
            message = await receive()
            if message["type"] != "http.request":
                return
            seen += len(message.get("body", b""))
            more = message.get("more_body", False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        too_large = f"the request body exceeds this server's limit of {self.limit} bytes"
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._drain(receive, 0, True)
            await _send_error(send, 413, f"the request body is {int(declared)} bytes; this server's limit is "
                                         f"{self.limit} bytes", close=True)
            return
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its body
            body = message.get("body", b"")
            seen += len(body)
            more = message.get("more_body", False)
            if seen > self.limit:
                await self._drain(receive, seen, more)
                await _send_error(send, 413, too_large, close=True)
                return
            chunks.append(body)
            if not more:
                break
        content_type = headers.get(b"content-type")
        if seen and content_type is not None and not _is_json(content_type):
            shown = content_type.decode("latin-1").split(";", 1)[0]
            await _send_error(send, 415, f"the request body must be JSON: send 'Content-Type: application/json' "
                                         f"(got {shown!r})")
            return
        if seen and content_type is None:  # read as JSON (FastAPI would hand the route raw bytes)
            scope = {**scope, "headers": [*scope.get("headers", []), (b"content-type", b"application/json")]}
        replayed = False

        async def buffered() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, buffered, send)
