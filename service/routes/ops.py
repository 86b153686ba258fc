"""Operations: ``/healthz`` (alive), ``/readyz`` (model loaded, database reachable), ``/metrics``."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from service.errors import NotFound, Unavailable
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
def metrics_route(services: ServicesDep):
    """Prometheus text, without a token on purpose: scrapers rarely carry per-target
    credentials, and nothing here names a tenant, key, token, generation or text (labels are
    engines, verdicts and route templates such as ``/v1/generations/{generation_id}``). What
    it does tell is aggregate traffic (request counts, latencies, token volumes) across
    tenants, so keep it off the public listener: expose only ``/v1/*`` and
    ``/.well-known/*`` through the proxy, or firewall the port to the scraper, or set
    HALLMARK_METRICS_LISTEN to serve it on its own listener. Detection counts are exported in
    whole tens and detection latencies not at all (service.metrics.CoarseDetections)."""
    if services.settings.metrics_listen:
        raise NotFound(f"metrics are served on their own listener ({services.settings.metrics_listen}), not here")
    return Response(services.metrics.render(), media_type="text/plain; version=0.0.4")
