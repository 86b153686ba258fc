"""``POST /v1/detect``: score text or token ids against the caller's keys."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service import detection
from service.responses import DetectResponse, ok
from service.routes.deps import IdentityDep, ServicesDep
from service.schemas import DetectBody

router = APIRouter(tags=["Detection"])


@router.post("/v1/detect", summary="Check a text for a watermark", responses=ok(DetectResponse))
async def detect_route(body: DetectBody, services: ServicesDep, identity: IdentityDep):
    """Score a text (or token ids) against every key of the caller's tenant (an admin token: of
    one tenant, or of all): an exact p-value corrected for the keys and tests, the winning key,
    watermarked spans, the ledger's exact and edited copies, and a signed detection report."""
    # On the event loop, not in a worker thread: detection is CPU-bound Python, so threads
    # only contend for the GIL (measured: 1.6-1.85x the requests/s inline; issue 23). Its
    # database reads are a few short indexed queries; a gateway uses its cores through
    # worker processes (`hallmark serve --workers N`).
    return JSONResponse(detection.detect(services, identity, body))
