"""The HTTP gateway: ``create_app(settings)`` builds a FastAPI app over the domain functions.

Routes parse, call :mod:`service.generation` / :mod:`service.detection`, and map results
to responses. Errors are JSON ``{"error": {"message", "type", "code"}}`` (OpenAI's shape)
with the right 4xx/5xx status.
"""


import gc
import json
import logging
import time
from contextlib import asynccontextmanager
from typing import Annotated, Any, AsyncIterator

from fastapi import Depends, FastAPI, Header
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from keys.db import Store, open_store
from keys.ledger import get_generation
from keys.settings import StoreSettings
from service import detection, generation, http_errors
from service.admin_api import router as admin_router
from service.auth import Identity, authenticate
from service.chat import chat_prompt_ids
from service.engines.base import Delta, Engine
from service.body_limit import BodyLimit
from service.errors import NotFound, ServiceError, Unavailable
from service.http_errors import service_error_payload
from service.generation import GenerateParams, Outcome
from service.schemas import ChatBody, CompletionBody, DetectBody, GenerateBody
from service.settings import ServiceSettings
from service.state import Services
from service.ui import mount_ui

log = logging.getLogger("hallmark.app")


class RequestMetrics:
    """Requests and latency by route template (a plain ASGI middleware: Starlette's
    BaseHTTPMiddleware costs more per request than a whole detection)."""

    def __init__(self, app: ASGIApp, services: dict) -> None:
        self.app = app
        self.services = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def recording_send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            services = self.services.get("services")
            if services is not None:
                path = getattr(scope.get("route"), "path", "unmatched")
                services.metrics.requests.labels(path, scope["method"], str(status)).inc()
                services.metrics.latency.labels(path).observe(time.perf_counter() - start)


def _sse(payload: Any) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def create_app(settings: ServiceSettings, *, engine: Engine | None = None,
               store_settings: StoreSettings | None = None, store: Store | None = None) -> FastAPI:
    """The gateway. ``engine``/``store`` may be given (tests, embedding); otherwise they are
    built from the settings and started with the app."""
    state: dict[str, Services] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own_store = store or open_store(store_settings or StoreSettings(), require_kek=True)
        own_engine = engine
        if own_engine is None:
            from service.engines.factory import create_engine

            own_engine = create_engine(settings)
        services = Services(settings=settings, store=own_store, engine=own_engine)
        state["services"] = services
        app.state.services = services
        await own_engine.start()
        # Models, tokenizers and modules are loaded now: move them out of the collector's
        # reach, and collect less often, so that no request waits behind a long collection
        # (measured: 60 ms p99 spikes on /v1/detect with the default thresholds).
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 50, 100)
        try:
            yield
        finally:
            await own_engine.stop()
            if store is None:
                own_store.close()

    app = FastAPI(title="Hallmark", version="0.1.0", lifespan=lifespan)

    # Dependencies and the detection route are async on purpose: they are short and CPU-bound,
    # and a thread-pool hop per call would cost more than the work.
    async def services_dep() -> Services:
        return state["services"]

    ServicesDep = Annotated[Services, Depends(services_dep)]

    async def identity_dep(services: ServicesDep, authorization: Annotated[str | None, Header()] = None) -> Identity:
        return authenticate(services, authorization)

    IdentityDep = Annotated[Identity, Depends(identity_dep)]

    http_errors.install(app)

    # ---------------------------------------------------------------- generation

    def _params(body: GenerateBody) -> GenerateParams:
        return GenerateParams(prompt=body.prompt, max_tokens=body.max_tokens, temperature=body.temperature,
                              top_p=body.top_p, top_k=body.top_k, seed=body.seed, stop=body.stops,
                              watermark=body.watermark, tenant=body.tenant)

    @app.post("/v1/generate")
    async def generate_route(body: GenerateBody, services: ServicesDep, identity: IdentityDep):
        params = _params(body)
        if not body.stream:
            return (await generation.generate(services, identity, params)).to_dict()
        events = await generation.stream(services, identity, params)

        async def sse() -> AsyncIterator[bytes]:
            try:
                async for event in events:
                    if isinstance(event, Delta):
                        yield _sse({"type": "delta", "text": event.text, "token_ids": list(event.token_ids)})
                    else:
                        yield _sse({"type": "done", **event.to_dict()})
            except ServiceError as exc:
                yield _sse({"type": "error", **service_error_payload(exc)})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    def _openai_params(body: CompletionBody | ChatBody, services: Services, prompt_ids: tuple[int, ...]) -> GenerateParams:
        return GenerateParams(prompt_ids=prompt_ids, max_tokens=body.token_limit,
                              temperature=1.0 if body.temperature is None else body.temperature,
                              top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k or 0,
                              seed=body.seed, stop=body.stops, watermark=body.watermark)

    def _usage(outcome: Outcome) -> dict[str, int]:
        return {"prompt_tokens": outcome.prompt_tokens, "completion_tokens": len(outcome.token_ids),
                "total_tokens": outcome.prompt_tokens + len(outcome.token_ids)}

    def _hallmark(outcome: Outcome) -> dict[str, Any]:
        return {"generation_id": outcome.generation_id, "watermark": outcome.watermark,
                "token_ids": list(outcome.token_ids)}

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
        # The id is known only at the end; chunks carry a per-stream id, the summary links it.
        stream_id = ("chatcmpl-" if chat else "cmpl-") + services.engine.name + hex(id(events))[2:]

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
                    "choices": [body]}

        async def sse() -> AsyncIterator[bytes]:
            first = True
            try:
                async for event in events:
                    if isinstance(event, Delta):
                        if event.text or first:
                            yield _sse(chunk(event.text, None, first))
                            first = False
                    else:
                        final = chunk(None, _finish(event.finish_reason), first)
                        final["usage"] = _usage(event)
                        final["hallmark"] = _hallmark(event)
                        yield _sse(final)
            except ServiceError as exc:
                yield _sse(service_error_payload(exc))
            yield b"data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions_route(body: CompletionBody, services: ServicesDep, identity: IdentityDep):
        prompt_ids = body.prompt_ids
        if prompt_ids is None:
            prompt_ids = tuple(services.engine.tokenizer().encode(body.prompt_text))
        return await _openai(services, identity, _openai_params(body, services, prompt_ids), body.stream, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_route(body: ChatBody, services: ServicesDep, identity: IdentityDep):
        prompt_ids = tuple(chat_prompt_ids(services.engine.tokenizer(), [(m.role, m.text) for m in body.messages]))
        return await _openai(services, identity, _openai_params(body, services, prompt_ids), body.stream, chat=True)

    @app.get("/v1/models")
    def models_route(services: ServicesDep, identity: IdentityDep):
        return {"object": "list", "data": [{"id": services.engine.model_name, "object": "model",
                                            "owned_by": "hallmark"}]}

    # ---------------------------------------------------------------- detection & ledger

    @app.post("/v1/detect")
    async def detect_route(body: DetectBody, services: ServicesDep, identity: IdentityDep):
        params = detection.DetectParams(text=body.text, token_ids=tuple(body.token_ids) if body.token_ids is not None
                                        else None, tenant=body.tenant, threshold=body.threshold,
                                        statistic=body.statistic, spans=body.spans,
                                        evidence=body.evidence)
        return JSONResponse(detection.detect(services, identity, params))

    @app.get("/v1/generations/{generation_id}")
    def generation_route(generation_id: str, services: ServicesDep, identity: IdentityDep):
        scope = None if identity.admin and identity.tenant_id is None else identity.tenant_id
        with services.store.transaction(write=False) as session:
            entry = get_generation(session, generation_id=generation_id, tenant_id=scope)
        if entry is None:
            raise NotFound(f"no generation {generation_id!r} for this token")
        return entry.to_dict()

    # ---------------------------------------------------------------- operations

    @app.get("/healthz")
    def healthz():
        return {"status": "ok"}

    @app.get("/readyz")
    def readyz(services: ServicesDep):
        problems = []
        if not services.engine.ready:
            problems.append("model not loaded")
        try:
            services.check_database()
        except Unavailable as exc:
            problems.append(exc.message)
        if problems:
            return JSONResponse({"status": "not ready", "problems": problems}, status_code=503)
        return {"status": "ready", "engine": services.engine.name, "model": services.engine.model_name}

    @app.get("/metrics")
    def metrics_route(services: ServicesDep):
        return Response(services.metrics.render(), media_type="text/plain; version=0.0.4")

    app.include_router(admin_router)
    mount_ui(app)

    app.add_middleware(RequestMetrics, services=state)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    return app
