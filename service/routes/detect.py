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
from service.schemas import DetectBody, PublicDetectBody, PublicDetection

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


@router.post("/v1/public/detect", tags=["detection"], summary="Check a text without an account (public tier)",
             description="The public detection check: no token. The verdict in words, the provider, the tenant where it "
                         "opted in, a confidence band, tokens scored, the basis and a signed report; no p-value digits, "
                         "scores, spans or keys. Under 200 tokens: `too_short`. Budgets: tokens scored per client "
                         "address and in all, a day; the probe guard (429 `probe_guard`). See README \"Detection access\".",
             responses={200: {"model": PublicDetection}})
async def public_detect_route(body: PublicDetectBody, services: ServicesDep, request: Request):
    if not services.settings.public_detect:
        raise NotFound("the public detection check is not offered by this gateway")
    return await _answer(services, None, DetectBody(text=body.text), request.client.host if request.client else None)
