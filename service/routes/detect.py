"""``POST /v1/detect`` (a token's tier: tenant, expert or operator) and ``POST
/v1/public/detect`` (no token: the public tier), both over one detection core through
:mod:`service.access.gate`."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.access import gate
from service.errors import NotFound
from service.routes.deps import DetectIdentityDep, ServicesDep
from service.schemas import DetectBody, PublicDetectBody

router = APIRouter()


async def _answer(services, identity, body: DetectBody, client: str | None) -> JSONResponse:
    who = gate.principal(services, identity, client)
    gate.check_size(services.settings, who.tier, body)  # before a slot, a thread or a token
    with gate.access_of(services).slots.hold(who.name):
        # In a worker thread: budgets, the probe guard and the ledger look-up query the
        # database, which must never stall the event loop.
        shown = await asyncio.to_thread(gate.run, services, identity, body, who)
    return JSONResponse(shown, headers={"X-Hallmark-Access-Tier": who.tier})


@router.post("/v1/detect")
async def detect_route(body: DetectBody, services: ServicesDep, identity: DetectIdentityDep):
    return await _answer(services, identity, body, None)


@router.post("/v1/public/detect")
async def public_detect_route(body: PublicDetectBody, services: ServicesDep, request: Request):
    if not services.settings.public_detect:
        raise NotFound("the public detection check is not offered by this gateway")
    return await _answer(services, None, DetectBody(text=body.text), request.client.host if request.client else None)
