"""``POST /v1/generate``: Hallmark's own generation endpoint (JSON, or server-sent events)."""

from __future__ import annotations

from typing import AsyncIterator

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from service import generation
from service.engines.base import Delta
from service.errors import ServiceError
from service.generation import GenerateParams
from service.http import SSE_DONE, sse
from service.http_errors import service_error_payload
from service.responses import GenerateResponse, ok
from service.routes.deps import IdentityDep, ServicesDep
from service.schemas import GenerateBody

router = APIRouter(tags=["Generation"])


def _params(body: GenerateBody) -> GenerateParams:
    return GenerateParams(prompt=body.prompt, max_tokens=body.max_tokens, temperature=body.temperature,
                          top_p=body.top_p, top_k=body.top_k, seed=body.seed, stop=body.stops,
                          watermark=body.watermark, tenant=body.tenant)


@router.post("/v1/generate", summary="Generate watermarked text", responses=ok(GenerateResponse))
async def generate_route(body: GenerateBody, services: ServicesDep, identity: IdentityDep):
    """Generate from a prompt with the tenant's active key: every sampled token carries its watermark,
    and the generation is recorded in the provenance ledger before the text is returned, with a
    signed receipt. `"stream": true` sends server-sent events: `started`, `delta`s (each sent only
    after the ledger covers it), then `done` with the summary and the receipt."""
    params = _params(body)
    if not body.stream:
        return (await generation.generate(services, identity, params)).to_dict()
    events = await generation.stream(services, identity, params)
    generation_id = events.generation_id

    async def stream() -> AsyncIterator[bytes]:
        # Every event names the generation (recorded before the first one), so a client
        # that leaves can find its record.
        try:
            yield sse({"type": "started", "generation_id": generation_id})
            async for event in events:
                if isinstance(event, Delta):
                    yield sse({"type": "delta", "generation_id": generation_id, "text": event.text,
                               "token_ids": list(event.token_ids)})
                else:
                    yield sse({"type": "done", **event.to_dict()})
        except ServiceError as exc:
            yield sse({"type": "error", "generation_id": generation_id, **service_error_payload(exc)})
        finally:
            await events.aclose()
        yield SSE_DONE

    return StreamingResponse(stream(), media_type="text/event-stream")
