"""``POST /v1/detect``: score text or token ids against the caller's keys."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service import detection
from service.routes.deps import IdentityDep, ServicesDep
from service.schemas import DetectBody

router = APIRouter()


@router.post("/v1/detect")
async def detect_route(body: DetectBody, services: ServicesDep, identity: IdentityDep):
    # On the event loop, not in a worker thread: detection is CPU-bound Python, so threads
    # only contend for the GIL (measured: 1.6-1.85x the requests/s inline; issue 23). Its
    # database reads are a few short indexed queries; a gateway uses its cores through
    # worker processes (`hallmark serve --workers N`).
    return JSONResponse(detection.detect(services, identity, body))
