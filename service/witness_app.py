"""`hallmark witness serve`'s HTTP face: tlog-witness v1.0.0's ``POST /add-checkpoint`` and
the monitoring ``GET /<origin hash>/checkpoint``, thin over ledger.log.cosigning_witness.
No token, as the spec says: a request is authenticated by the log's signature on it."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from ledger.log.cosigning_witness import CosigningWitness

MAX_BODY = 64 * 1024


def create_witness_app(witness: CosigningWitness) -> FastAPI:
    app = FastAPI(title="Hallmark witness (c2sp.org/tlog-witness)", docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/add-checkpoint")
    async def add_checkpoint(request: Request) -> Response:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                return Response("request too large\n", status_code=413, media_type="text/plain")
        answer = await run_in_threadpool(witness.add_checkpoint, body)
        return Response(answer.body, status_code=answer.status, media_type=answer.content_type)

    @app.get("/{origin_hash}/checkpoint")
    async def checkpoint(origin_hash: str) -> Response:
        answer = await run_in_threadpool(witness.checkpoint, origin_hash)
        return Response(answer.body, status_code=answer.status, media_type=answer.content_type,
                        headers={"Cache-Control": "no-cache"})

    return app
