"""``POST /v1/detect`` (a token's tier: tenant, expert or operator) and ``POST
/v1/public/detect`` (no token: the public tier), both over one detection core through
:mod:`service.access.gate`."""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import ValidationError

from service.access import gate, offload
from service.access.addresses import client_address, parse_networks
from service.auth import authenticate_async
from service.errors import NotFound
from service.responses import DetectResponse, PublicDetectResponse, ok
from service.routes.deps import DetectIdentityDep, ServicesDep
from service.schemas import DetectBody, PublicDetectBody

router = APIRouter(tags=["Detection"])


INLINE_MAX = 2_000
"""Bodies up to this many characters (or token ids) are detected on the event loop: a few
milliseconds of CPU-bound Python, where a worker thread only adds GIL contention (measured
1.6-1.85x the requests/s inline; issue 23). Larger ones go to a worker thread under the
principal's concurrency slots, so one client's huge bodies cannot hold the loop while another
client's check waits (issue 22). 8,000 before issue 31: an 8,000-id body held the loop about
0.1 s at a time, and another principal's check waited behind it."""


async def _answer(services, identity, body: DetectBody, client: str | None) -> JSONResponse:
    who = gate.principal(services, identity, client)
    gate.check_size(services.settings, who.tier, body)  # before a slot, a thread or a token
    size = len(body.text) if body.text is not None else len(body.token_ids or ())
    access = gate.access_of(services)
    access.audits.enter()  # in flight: audit events held meanwhile wait for this one's (group_commit.Held)
    try:
        async with access.lanes.turn(who.name) as inline:  # one at a time per principal (service.access.lanes)
            # A principal over its share (a stream of checks back to back) is detected off the
            # loop whatever its size: a stream of bodies just under INLINE_MAX would otherwise
            # hold the loop another principal's check waits on, one body after the other.
            if size <= INLINE_MAX and inline:
                # The core on the loop (under a slot, gate._core); the gate's writes are awaited
                # (service.access.group_commit), so the loop serves other requests meanwhile.
                answer = await gate.answer(services, identity, body, who, inline=True)
            else:
                with access.slots.hold(who.name):  # before any tokenising, hashing or query
                    answer = await gate.answer(services, identity, body, who, inline=False)
    finally:
        access.audits.leave()
    # Its audit event committed before the answer leaves, awaited out of the lane: the
    # principal's next detection runs meanwhile and its event shares the commit (gate.answered).
    shown = await gate.answered(answer)
    return JSONResponse(shown, headers={"X-Hallmark-Access-Tier": who.tier})


async def detect_route(body: DetectBody, services: ServicesDep, identity: DetectIdentityDep):
    """Score a text (or token ids) against every key of the caller's tenant (an admin or expert
    token: of one tenant, or of all): the verdict, the winning key, watermarked spans, the
    ledger's exact and edited copies, and a signed detection report. A tenant token gets the
    tenant tier's answer (p-values to a whole power of ten; per-token evidence only with the
    `evidence` scope); admin and expert tokens the full result (docs/concepts/detection-access.md).
    The tier is in the `X-Hallmark-Access-Tier` header."""
    return await _answer(services, identity, body, None)


class _DetectRoute(APIRoute):
    """``POST /v1/detect`` with a lean path for a well-formed request: a JSON object that
    :class:`DetectBody` accepts as FastAPI would (``json.loads``, then the model's strict
    validation), then the token, and the route's body. Anything else (no body, another
    content type, invalid JSON, a refused field) goes to FastAPI's own handler, which answers
    exactly as before (the documented 4xx shapes); its OpenAPI operation is FastAPI's too.
    FastAPI's dependency solving cost more than the rest of the gateway around the core
    (bench.detect_asgi --stub-core --profile: ~35 % of the route's CPU outside the core)."""

    def get_route_handler(self):
        standard = super().get_route_handler()

        async def handler(request: Request) -> Response:
            services = request.app.state.services
            body = await _parsed(services, await request.body(), request.headers.get("content-type"))
            if body is None:
                return await standard(request)
            return await _answer(services, await authenticate_async(services, request.headers.get("authorization")),
                                 body, None)

        return handler


PARSE_THREADS = 2
"""Large bodies parsed in worker threads at once (``detect_workers`` 0): more wait their turn."""


async def _parsed(services, raw: bytes, content_type: str | None) -> DetectBody | None:
    """:func:`_well_formed`, on the event loop up to ``detect_parse_inline_bytes``; a larger
    body in a detection worker (service.access.offload), else a worker thread. An 8,000-id
    body's JSON parse and validation is about 3 ms of one C call each: on the loop, another
    principal's check that arrived meanwhile waited behind every such body of a flood (a
    third of the gateway's interpreter time under one tenant's flood of them, py-spy
    --gil; issue 31 item 5). In a thread the interpreter is still held for each call; in a
    worker process only the validated body's unpickling (~0.2 ms) stays here."""
    if len(raw) <= services.settings.detect_parse_inline_bytes or not _is_json(content_type):
        return _well_formed(raw, content_type)
    pool = offload.offload_of(services)
    if pool is not None:
        return await pool.call(services, _well_formed, raw, content_type)
    threads = getattr(services, "_parse_threads", None)
    if threads is None:
        threads = services._parse_threads = asyncio.Semaphore(PARSE_THREADS)
    async with threads:
        return await asyncio.to_thread(_well_formed, raw, content_type)


def _is_json(content_type: str | None) -> bool:
    return content_type is not None and content_type.split(";", 1)[0].strip().lower() == "application/json"


def _well_formed(raw: bytes, content_type: str | None) -> DetectBody | None:
    """The body as FastAPI would validate it, or None for its handler to answer."""
    if not raw or not _is_json(content_type):
        return None
    try:
        value = json.loads(raw)
        return DetectBody.model_validate(value) if isinstance(value, dict) else None
    except (ValueError, ValidationError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None


router.add_api_route("/v1/detect", detect_route, methods=["POST"], summary="Check a text for a watermark",
                     responses=ok(DetectResponse), route_class_override=_DetectRoute)


@router.post("/v1/public/detect", summary="Check a text without an account (public tier)",
             responses=ok(PublicDetectResponse))
async def public_detect_route(body: PublicDetectBody, services: ServicesDep, request: Request):
    """The public detection check, no token: the verdict in words, the provider, the tenant
    where it opted in, a confidence band, tokens scored, the basis and a signed report; no
    p-value digits, scores, spans or keys. Under 200 tokens: `too_short`. Budgets: tokens scored
    a day per client address and for all together, and the probe guard (429 `probe_guard`)."""
    if not services.settings.public_detect:
        raise NotFound("the public detection check is not offered by this gateway")
    return await _answer(services, None, DetectBody(text=body.text), public_client(services, request))


def public_client(services, request: Request) -> str | None:
    """The public caller's address: the peer, or X-Forwarded-For through trusted proxies only."""
    proxies = getattr(services, "_trusted_proxies", None)
    if proxies is None:
        proxies = services._trusted_proxies = parse_networks(services.settings.trusted_proxies)
    return client_address(request.client.host if request.client else None,
                          request.headers.get("x-forwarded-for"), proxies)
