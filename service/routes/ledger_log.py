"""The transparency log's public routes: ``GET /v1/ledger/checkpoint`` (a C2SP checkpoint,
text/plain), ``GET /v1/ledger/proof/inclusion`` (by leaf index; ``/inclusion-by-hash`` by
leaf hash) and ``GET /v1/ledger/proof/consistency``.
No token: anyone may witness the log. Plain functions: :mod:`service.ledger_log`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, Response

from service import ledger_log
from service.responses import ConsistencyProof, InclusionProof, ok
from service.routes.deps import ServicesDep

router = APIRouter(tags=["Transparency log"])
_SIZE = Query(ge=0, le=2**62)


@router.get("/v1/ledger/checkpoint", response_class=PlainTextResponse, summary="The latest checkpoint")
async def checkpoint_route(services: ServicesDep):
    """The log's latest published checkpoint: a C2SP signed note (origin, tree size, root hash)
    for witnesses and auditors. No token needed."""
    note = await run_in_threadpool(ledger_log.checkpoint, services)
    return PlainTextResponse(note, headers={"Cache-Control": "no-cache"})


@router.get("/v1/ledger/proof/inclusion", summary="An inclusion proof by leaf index",
            responses=ok(InclusionProof))
async def inclusion_route(services: ServicesDep, leaf_index: Annotated[int, Query(ge=0, le=2**62)],
                          tree_size: Annotated[int | None, _SIZE] = None):
    """The proof that leaf `leaf_index` is in the tree of `tree_size` (default: the latest
    published checkpoint's), RFC 6962 / RFC 9162 style."""
    return await run_in_threadpool(ledger_log.inclusion, services, leaf_index=leaf_index, leaf_hash=None,
                                   tree_size=tree_size)


@router.get("/v1/ledger/proof/inclusion-by-hash", summary="An inclusion proof by leaf hash",
            responses=ok(InclusionProof))
async def inclusion_by_hash_route(services: ServicesDep,
                                  leaf_hash: Annotated[str, Query(pattern=r"^([0-9a-f]{64}|[A-Za-z0-9+/]{43}=)$")],
                                  tree_size: Annotated[int | None, _SIZE] = None):
    """A leaf's proof by its hash (hex or base64), as a receipt's holder computes it."""
    return await run_in_threadpool(ledger_log.inclusion, services, leaf_index=None, leaf_hash=leaf_hash,
                                   tree_size=tree_size)


@router.get("/v1/ledger/proof/consistency", summary="A consistency proof between two tree sizes",
            responses=ok(ConsistencyProof))
async def consistency_route(services: ServicesDep, first: Annotated[int, Query(alias="from", ge=0, le=2**62)],
                            second: Annotated[int | None, Query(alias="to", ge=0, le=2**62)] = None):
    """The proof that the tree of size `from` is a prefix of the tree of size `to` (default: the
    latest published checkpoint's): the log only appends."""
    return await run_in_threadpool(ledger_log.consistency, services, first=first, second=second)


# --- tlog-tiles: the log as static resources under one prefix ------------------------------

TILES_PREFIX = "/v1/ledger/log"
_IMMUTABLE = "public, max-age=31536000, immutable"


@router.get(TILES_PREFIX + "/checkpoint", response_class=PlainTextResponse,
            summary="The latest checkpoint (tlog-tiles)")
async def tiles_checkpoint_route(services: ServicesDep):
    """The latest published checkpoint (c2sp.org/tlog-tiles), with the witnesses'
    cosignatures when a witness policy is configured."""
    note = await run_in_threadpool(ledger_log.checkpoint, services)
    return PlainTextResponse(note, media_type="text/plain; charset=utf-8", headers={"Cache-Control": "no-cache"})


@router.get(TILES_PREFIX + "/tile/{path:path}", response_class=Response, summary="A tile or entry bundle (tlog-tiles)")
async def tile_route(services: ServicesDep, path: str):
    """`tile/<L>/<N>[.p/<W>]` (256 hashes a full tile) or `tile/entries/<N>[.p/<W>]`
    (uint16-length-prefixed leaf data). Full tiles are immutable and cached as such."""
    body, full = await run_in_threadpool(ledger_log.tile, services, "tile/" + path)
    cache = _IMMUTABLE if full else "public, max-age=60"
    return Response(body, media_type="application/octet-stream", headers={"Cache-Control": cache})
