"""``POST /v1/detect``: score text or token ids against the caller's keys."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service import detection
from service.routes.deps import IdentityDep, ServicesDep
from service.schemas import DetectBody

router = APIRouter()


@router.post("/v1/detect")
async def detect_route(body: DetectBody, services: ServicesDep, identity: IdentityDep):
    # In a worker thread: the shared rate limit and the ledger look-up may query the database,
    # which must never stall the event loop (a restarting database would stall every request).
    return JSONResponse(await asyncio.to_thread(detection.detect, services, identity, body))
