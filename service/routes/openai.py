"""OpenAI-compatible endpoints: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``.

The routes shape :class:`service.generation.Outcome` (or its stream) into OpenAI's
response and chunk objects; Hallmark's extras ride in a ``hallmark`` field. Like OpenAI and
vLLM they answer a model they do not serve with 404 ``model_not_found``, and a parameter
they do not implement (:data:`service.schemas.UNSUPPORTED`) with 400 ``unsupported_parameter``
whose ``param`` names it, instead of ignoring it.
"""

from __future__ import annotations

import json
import time
from typing import Any, AsyncIterator

from fastapi import APIRouter
from fastapi.responses import JSONResponse, StreamingResponse

from service import generation
from service.auth import Identity
from service.chat import chat_prompt_ids
from service.engines.base import Delta
from service.errors import NotFound, ServiceError, Unprocessable
from service.generation import GenerateParams, Outcome
from service.http import SSE_DONE, sse
from service.http_errors import error_payload, error_response, service_error_payload
from service.responses import CompletionResponse, ModelList, ok
from service.routes.deps import IdentityDep, ServicesDep
from service.schemas import NATIVE_ONLY, UNSUPPORTED, ChatBody, CompletionBody
from service.state import Services

router = APIRouter(tags=["OpenAI-compatible"])

ALIAS = "hallmark"
"""A model id every deployment accepts for the model it serves, so that a client written
against one gateway (the README's examples) works against another."""


def served_models(services: Services) -> tuple[str, ...]:
    """The model ids the OpenAI routes accept, as /v1/models lists them: the served model's
    name first, then :data:`ALIAS`."""
    name = services.engine.model_name
    return (name,) if name == ALIAS else (name, ALIAS)


def _refusal(body: CompletionBody | ChatBody, services: Services) -> JSONResponse | None:
    """None for a request these routes can honour, else its error response: 404 for a model
    not served, 400 (with OpenAI's ``param``) for an unsupported parameter."""
    served = served_models(services)
    if body.model is not None and body.model not in served:
        also = f" (also as {ALIAS!r}, or omit 'model')" if len(served) > 1 else " (or omit 'model')"
        return error_response(NotFound(f"the model {body.model!r} does not exist on this server; it serves "
                                       f"{served[0]!r}{also}; see /v1/models", code="model_not_found"))
    name = body.unsupported_parameter()
    if name is None and body.stream and (body.n or 1) > 1:
        name = "n"
    if name is None:
        return None
    if name == "n":
        message = ("n > 1 is supported without streaming only; send 'stream': false, or n separate "
                   "streaming requests")
    elif name in NATIVE_ONLY:
        message = f"the parameter {name!r} is not accepted on the OpenAI routes: {NATIVE_ONLY[name]}"
    elif name in UNSUPPORTED:
        message = (f"the parameter {name!r} is not supported by this server with the value sent; omit it "
                   f"(accepted without effect: {' or '.join(json.dumps(v) for v in UNSUPPORTED[name])})")
    else:  # messages holding tool or function calls
        message = (f"the parameter {name!r} holds tool or function calls, which this server does not support "
                   f"(it declares no tools); send the conversation without them")
    payload = error_payload(400, message, code="unsupported_parameter")
    payload["error"]["param"] = name
    return JSONResponse(payload, status_code=400)


_REFUSED = {400: {"description": "An unsupported parameter (`param` names it; `code`: `unsupported_parameter`).",
                  "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}}


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


def _choice(outcome: Outcome, index: int, chat: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "finish_reason": _finish(outcome.finish_reason), "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": outcome.text}
    else:
        choice["text"] = outcome.text
    return choice


async def _openai(services: Services, identity: Identity, params: GenerateParams, stream: bool, *, chat: bool,
                  n: int = 1):
    created = int(time.time())
    kind = "chat.completion" if chat else "text_completion"
    if not stream:
        outcomes = await generation.generate_choices(services, identity, params, n)
        first = outcomes[0]
        prefix = "chatcmpl-" if chat else "cmpl-"
        hallmark = _hallmark(first)
        usage = _usage(first)
        if n > 1:  # each choice is its own generation; the prompt is counted once, as OpenAI does
            hallmark["choices"] = [_hallmark(o) for o in outcomes]
            completion = sum(len(o.token_ids) for o in outcomes)
            usage = {"prompt_tokens": first.prompt_tokens, "completion_tokens": completion,
                     "total_tokens": first.prompt_tokens + completion}
        return {"id": prefix + first.generation_id, "object": kind, "created": created,
                "model": first.model, "choices": [_choice(o, i, chat) for i, o in enumerate(outcomes)],
                "usage": usage, "hallmark": hallmark}
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


@router.post("/v1/completions", summary="Create a completion (OpenAI-compatible)",
             responses={**_REFUSED, **ok(CompletionResponse)})
async def completions_route(body: CompletionBody, services: ServicesDep, identity: IdentityDep):
    """OpenAI's legacy completions, watermarked and recorded as `/v1/generate` does; the response
    adds `hallmark` (generation id, watermark, ledger position, receipt). Parameters that would
    change the output but are not supported get 400 `unsupported_parameter`."""
    if (refused := _refusal(body, services)) is not None:
        return refused
    prompt_ids = body.prompt_ids
    if prompt_ids is None:
        prompt_ids = tuple(services.engine.tokenizer().encode(body.prompt_text))
    return await _openai(services, identity, _openai_params(body, services, prompt_ids), body.stream, chat=False,
                         n=body.n or 1)


@router.post("/v1/chat/completions", summary="Create a chat completion (OpenAI-compatible)",
             responses={**_REFUSED, **ok(CompletionResponse)})
async def chat_route(body: ChatBody, services: ServicesDep, identity: IdentityDep):
    """OpenAI's chat completions over the model's chat template, watermarked and recorded as
    `/v1/generate` does; the response adds `hallmark`. Text parts only; no tools."""
    if (refused := _refusal(body, services)) is not None:
        return refused
    prompt_ids = tuple(chat_prompt_ids(services.engine.tokenizer(), [(m.role, m.text) for m in body.messages]))
    return await _openai(services, identity, _openai_params(body, services, prompt_ids), body.stream, chat=True,
                         n=body.n or 1)


_STARTED = int(time.time())
"""The Model object's ``created`` (OpenAI's schema requires an integer; typed clients reject a
missing one): when this process loaded the routes."""


@router.get("/v1/models", summary="List the served models", responses=ok(ModelList))
def models_route(services: ServicesDep, identity: IdentityDep):
    """The model ids `model` may name (OpenAI's model list)."""
    return {"object": "list", "data": [{"id": name, "object": "model", "created": _STARTED, "owned_by": "hallmark"}
                                       for name in served_models(services)]}
