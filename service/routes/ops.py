"""Operations: ``/healthz`` (alive), ``/readyz`` (model loaded, database reachable), ``/metrics``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header
from fastapi.responses import JSONResponse, Response

from keys.tokens import METRICS_SCOPE
from service.auth import authenticate_async
from service.errors import Forbidden, NotFound, Unavailable
from service.http_errors import error_payload
from service.responses import Health, Ready, ok
from service.routes.deps import ServicesDep

router = APIRouter(tags=["Operations"])


@router.get("/healthz", summary="Liveness", responses=ok(Health))
def healthz():
    """The process answers (a liveness probe). No token needed."""
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness", responses=ok(Ready))
def readyz(services: ServicesDep):
    """The model is loaded and the database answers (a readiness probe); 503 with the problems
    otherwise. No token needed."""
    problems = []
    if not services.engine.ready:
        problems.append("model not loaded")
    try:
        services.check_database()
    except Unavailable as exc:
        problems.append(exc.message)
    if problems:
        # The one error shape, with the probe's own fields beside it.
        return JSONResponse({**error_payload(503, "not ready: " + "; ".join(problems), code="not_ready"),
                             "status": "not ready", "problems": problems}, status_code=503)
    return {"status": "ready", "engine": services.engine.name, "model": services.engine.model_name}


@router.get("/metrics", summary="Prometheus metrics")
async def metrics_route(services: ServicesDep, authorization: Annotated[str | None, Header()] = None):
    """Prometheus text, for a token holding the ``metrics`` scope or a global admin token
    (Prometheus: ``authorization: {credentials_file: ...}``). Nothing here names a tenant, key,
    token, generation or text, but it does tell aggregate traffic across tenants (request
    counts, latencies, token volumes), so it is not public on the API's port. Or set
    HALLMARK_METRICS_LISTEN (e.g. 127.0.0.1:9464) to serve it, without a token, on a listener
    of its own (this port then answers 404). Detection counts are exported in whole tens and
    detection latencies not at all (service.metrics.CoarseDetections), and no series carries a
    creation time (which would date its first event)."""
    if services.settings.metrics_listen:
        raise NotFound(f"metrics are served on their own listener ({services.settings.metrics_listen}), not here")
    identity = await authenticate_async(services, authorization)
    if not (METRICS_SCOPE in identity.scopes or (identity.admin and identity.tenant_id is None)):
        raise Forbidden("/metrics needs a token with the 'metrics' scope (`hallmark tokens grant TOKEN_ID metrics`) "
                        "or a global admin token")
    return Response(services.metrics.render(), media_type="text/plain; version=0.0.4")
