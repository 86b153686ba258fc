"""``POST /v1/detect``: score text or token ids against the caller's keys."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service import detection
from service.routes.deps import IdentityDep, ServicesDep
from service.schemas import DetectBody

router = APIRouter()


# Async on purpose: detection is short and CPU-bound (see service.routes.deps).
@router.post("/v1/detect")
async def detect_route(body: DetectBody, services: ServicesDep, identity: IdentityDep):
    params = detection.DetectParams(text=body.text, token_ids=tuple(body.token_ids) if body.token_ids is not None
                                    else None, tenant=body.tenant, threshold=body.threshold,
                                    statistic=body.statistic, spans=body.spans, evidence=body.evidence)
    return JSONResponse(detection.detect(services, identity, params))
