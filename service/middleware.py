"""Request metrics middleware of the gateway (plain ASGI: Starlette's BaseHTTPMiddleware
costs more per request than a whole detection)."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Receive, Scope, Send


class RequestMetrics:
    """Requests and latency by route template."""

    def __init__(self, app: ASGIApp, services: dict) -> None:
        self.app = app
        self.services = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def recording_send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            services = self.services.get("services")
            if services is not None:
                path = getattr(scope.get("route"), "path", "unmatched")
                services.metrics.requests.labels(path, scope["method"], str(status)).inc()
                services.metrics.latency.labels(path).observe(time.perf_counter() - start)
