"""OpenAI-compatible endpoints: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``.

The routes shape :class:`service.generation.Outcome` (or its stream) into OpenAI's
response and chunk objects; Hallmark's extras ride in a ``hallmark`` field.
"""

from __future__ import annotations

import time
from typing import Any, AsyncIterator

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from service import generation
from service.auth import Identity
from service.chat import chat_prompt_ids
from service.engines.base import Delta
from service.errors import ServiceError, Unprocessable
from service.generation import GenerateParams, Outcome
from service.http import SSE_DONE, sse
from service.http_errors import service_error_payload
from service.routes.deps import IdentityDep, ServicesDep
from service.schemas import ChatBody, CompletionBody
from service.state import Services

router = APIRouter()


def _openai_params(body: CompletionBody | ChatBody, services: Services, prompt_ids: tuple[int, ...]) -> GenerateParams:
    cap = services.settings.max_tokens_cap
    for name in ("max_tokens", "max_completion_tokens"):  # both are bounded, whichever one is used
        value = getattr(body, name)
        if value is not None and value > cap:
            raise Unprocessable(f"{name} {value} exceeds this server's cap of {cap}")
    return GenerateParams(prompt_ids=prompt_ids, max_tokens=body.token_limit,
                          temperature=1.0 if body.temperature is None else body.temperature,
                          top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k or 0,
                          seed=body.seed, stop=body.stops, watermark=body.watermark)


def _usage(outcome: Outcome) -> dict[str, int]:
    return {"prompt_tokens": outcome.prompt_tokens, "completion_tokens": len(outcome.token_ids),
            "total_tokens": outcome.prompt_tokens + len(outcome.token_ids)}


def _hallmark(outcome: Outcome) -> dict[str, Any]:
    return {"generation_id": outcome.generation_id, "watermark": outcome.watermark,
            "token_ids": list(outcome.token_ids), "ledger": outcome.ledger,
            "receipt": outcome.receipt}


def _finish(reason: str) -> str:
    return "length" if reason == "length" else "stop"


async def _openai(services: Services, identity: Identity, params: GenerateParams, stream: bool, *, chat: bool):
    created = int(time.time())
    kind = "chat.completion" if chat else "text_completion"
    if not stream:
        outcome = await generation.generate(services, identity, params)
        choice: dict[str, Any] = {"index": 0, "finish_reason": _finish(outcome.finish_reason), "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": outcome.text}
        else:
            choice["text"] = outcome.text
        prefix = "chatcmpl-" if chat else "cmpl-"
        return {"id": prefix + outcome.generation_id, "object": kind, "created": created,
                "model": outcome.model, "choices": [choice], "usage": _usage(outcome),
                "hallmark": _hallmark(outcome)}
    events = await generation.stream(services, identity, params)
    chunk_kind = "chat.completion.chunk" if chat else "text_completion"
    # The generation id is known (and recorded) before the first chunk: every chunk carries it.
    stream_id = ("chatcmpl-" if chat else "cmpl-") + events.generation_id

    def chunk(delta_text: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
        if chat:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if delta_text:
                delta["content"] = delta_text
            body = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        else:
            body = {"index": 0, "text": delta_text or "", "finish_reason": finish, "logprobs": None}
        return {"id": stream_id, "object": chunk_kind, "created": created, "model": services.engine.model_name,
                "choices": [body], "hallmark": {"generation_id": events.generation_id}}

    async def stream_events() -> AsyncIterator[bytes]:
        first = True
        try:
            async for event in events:
                if isinstance(event, Delta):
                    if event.text or first:
                        yield sse(chunk(event.text, None, first))
                        first = False
                else:
                    final = chunk(None, _finish(event.finish_reason), first)
                    final["usage"] = _usage(event)
                    final["hallmark"] = _hallmark(event)
                    yield sse(final)
        except ServiceError as exc:
            payload = service_error_payload(exc)
            payload["hallmark"] = {"generation_id": events.generation_id}
            yield sse(payload)
        finally:
            await events.aclose()
        yield SSE_DONE

    return StreamingResponse(stream_events(), media_type="text/event-stream")


@router.post("/v1/completions")
async def completions_route(body: CompletionBody, services: ServicesDep, identity: IdentityDep):
    prompt_ids = body.prompt_ids
    if prompt_ids is None:
        prompt_ids = tuple(services.engine.tokenizer().encode(body.prompt_text))
    return await _openai(services, identity, _openai_params(body, services, prompt_ids), body.stream, chat=False)


@router.post("/v1/chat/completions")
async def chat_route(body: ChatBody, services: ServicesDep, identity: IdentityDep):
    prompt_ids = tuple(chat_prompt_ids(services.engine.tokenizer(), [(m.role, m.text) for m in body.messages]))
    return await _openai(services, identity, _openai_params(body, services, prompt_ids), body.stream, chat=True)


_STARTED = int(time.time())
"""The Model object's ``created`` (OpenAI's schema requires an integer; typed clients reject a
missing one): when this process loaded the routes."""


@router.get("/v1/models")
def models_route(services: ServicesDep, identity: IdentityDep):
    return {"object": "list", "data": [{"id": services.engine.model_name, "object": "model",
                                        "created": _STARTED, "owned_by": "hallmark"}]}
