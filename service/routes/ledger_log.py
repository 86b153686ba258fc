"""The transparency log's public routes: ``GET /v1/ledger/checkpoint`` (a C2SP checkpoint,
text/plain), ``GET /v1/ledger/proof/inclusion`` and ``GET /v1/ledger/proof/consistency``.
No token: anyone may witness the log. Plain functions: :mod:`service.ledger_log`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse

from service import ledger_log
from service.routes.deps import ServicesDep

router = APIRouter(tags=["transparency log"])
_SIZE = Query(ge=0, le=2**62)


@router.get("/v1/ledger/checkpoint", response_class=PlainTextResponse)
async def checkpoint_route(services: ServicesDep):
    note = await run_in_threadpool(ledger_log.checkpoint, services)
    return PlainTextResponse(note, headers={"Cache-Control": "no-cache"})


@router.get("/v1/ledger/proof/inclusion")
async def inclusion_route(services: ServicesDep, leaf_index: Annotated[int | None, _SIZE] = None,
                          leaf_hash: Annotated[str | None, Query(max_length=100)] = None,
                          tree_size: Annotated[int | None, _SIZE] = None):
    return await run_in_threadpool(ledger_log.inclusion, services, leaf_index=leaf_index, leaf_hash=leaf_hash,
                                   tree_size=tree_size)


@router.get("/v1/ledger/proof/consistency")
async def consistency_route(services: ServicesDep, first: Annotated[int, Query(alias="from", ge=0, le=2**62)],
                            second: Annotated[int | None, Query(alias="to", ge=0, le=2**62)] = None):
    return await run_in_threadpool(ledger_log.consistency, services, first=first, second=second)
