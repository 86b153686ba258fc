"""Generation as a plain function: pick the tenant's key, run the engine, record provenance.

The key is always chosen here, from the authenticated tenant; a client never supplies
key material. Every generation writes its ledger record before the response is complete:
a non-streaming request whose record fails gets an error instead of the text; a streaming
request whose record fails ends with an error event instead of its final summary.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from keys.errors import KeyStoreError
from keys.ledger import record_generation
from service.auth import Identity, resolve_tenant
from service.engines.base import (Delta, EngineBusy, EngineFailure, Finished, GenerationRequest, RouteCounts,
                                  WatermarkPlan)
from service.errors import BadRequest, Forbidden, Unavailable, Unprocessable
from service.http_errors import store_error
from service.limits import GenerationLease
from service.state import Services
from watermark.processing import validate_sampling

log = logging.getLogger("hallmark.generation")


@dataclass(frozen=True)
class GenerateParams:
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    watermark: bool = True
    tenant: str | None = None


@dataclass(frozen=True)
class Outcome:
    generation_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int
    watermark: dict[str, Any] | None
    model: str
    routes: RouteCounts = field(default_factory=RouteCounts)
    """How many tokens each route produced (key A, key B, plain, greedy)."""
    unwatermarked_reason: str | None = None
    """Why the output is not (fully) watermarked, in the ledger's words (None: it is)."""

    def to_dict(self) -> dict[str, Any]:
        return {"generation_id": self.generation_id, "text": self.text, "token_ids": list(self.token_ids),
                "finish_reason": self.finish_reason, "model": self.model,
                "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": len(self.token_ids),
                          "total_tokens": self.prompt_tokens + len(self.token_ids)},
                "watermark": self.watermark}


@dataclass(frozen=True)
class _Prepared:
    request: GenerationRequest
    tenant_id: str
    plan: WatermarkPlan | None
    spec: Any
    reason: str | None


def _prepare(services: Services, identity: Identity, params: GenerateParams) -> _Prepared:
    settings = services.settings
    try:
        validate_sampling(params.temperature, params.top_k, params.top_p)
    except ValueError as exc:
        raise Unprocessable(str(exc)) from None
    max_tokens = settings.default_max_tokens if params.max_tokens is None else params.max_tokens
    if max_tokens < 1:
        raise Unprocessable("max_tokens must be >= 1")
    if max_tokens > settings.max_tokens_cap:
        raise Unprocessable(f"max_tokens {max_tokens} exceeds this server's cap of {settings.max_tokens_cap}")
    if params.seed is not None and not 0 <= params.seed < 2**64:
        raise Unprocessable("seed must be an integer in [0, 2**64)")
    if len(params.stop) > 8 or any(not s or len(s) > 200 for s in params.stop):
        raise Unprocessable("stop: at most 8 non-empty strings of at most 200 characters")
    tenant_id, _ = resolve_tenant(services, identity, params.tenant)
    if tenant_id is None:
        raise Forbidden("an admin token must name the tenant to generate for ('tenant')")
    if params.prompt_ids is not None:
        prompt_ids = tuple(int(t) for t in params.prompt_ids)
    elif params.prompt is not None:
        prompt_ids = tuple(services.engine.tokenizer().encode(params.prompt))
    else:
        raise BadRequest("give a prompt")
    if not prompt_ids:
        raise Unprocessable("the prompt is empty")
    if len(prompt_ids) > settings.max_prompt_tokens:
        raise Unprocessable(f"the prompt has {len(prompt_ids)} tokens; this server accepts at most "
                            f"{settings.max_prompt_tokens}")
    plan, spec, reason = None, None, None
    if not params.watermark:
        if not (settings.allow_opt_out or identity.admin):
            raise Forbidden("this deployment requires watermarking: 'watermark': false is not allowed")
        reason = "opt_out"
    elif params.temperature == 0:
        reason = "temperature_0"
    else:
        try:
            stored = services.active_key(tenant_id)
        except KeyStoreError as exc:  # no active key: 409, not retryable; a database fault: 503
            raise store_error(exc) from None
        plan = WatermarkPlan(key=stored.material, key_id=stored.key_id, version=stored.version,
                             fingerprint=stored.fingerprint)
        spec = stored.spec
    request = GenerationRequest(
        request_id=uuid.uuid4().hex, prompt_ids=prompt_ids, max_tokens=max_tokens,
        temperature=float(params.temperature), top_p=float(params.top_p), top_k=int(params.top_k),
        seed=params.seed, stop=tuple(params.stop), watermark=plan)
    try:
        services.engine.check(request)
    except ValueError as exc:
        raise Unprocessable(str(exc)) from None
    return _Prepared(request=request, tenant_id=tenant_id, plan=plan, spec=spec, reason=reason)


def _record(services: Services, prepared: _Prepared, done: Finished) -> Outcome:
    plan = prepared.plan
    reason = prepared.reason or ("dedup" if plan and done.routes.plain else None)
    try:
        with services.store.transaction() as session:
            record_generation(
                session, tenant_id=prepared.tenant_id, key_id=plan.key_id if plan else None,
                key_version=plan.version if plan else None, engine=services.engine.name,
                model=services.engine.model_name, spec=prepared.spec, prompt_tokens=done.prompt_tokens,
                output_tokens=len(done.token_ids), watermarked_tokens=done.routes.watermarked if plan else 0,
                unwatermarked_reason=reason,
                output_text=done.text,
                generation_id=prepared.request.request_id)
    except KeyStoreError as exc:
        log.error("provenance record failed for generation %s: %s", prepared.request.request_id, exc.user_message)
        raise Unavailable("the provenance record could not be written, so the output is withheld; "
                          "retry later") from None
    services.metrics.record_generation(services.engine.name, done, plan is not None)
    if prepared.reason:
        services.metrics.unwatermarked.labels(prepared.reason).inc()
    watermark = None
    if plan is not None:
        share = done.routes.watermarked / len(done.token_ids) if done.token_ids else 0.0
        watermark = {"key_id": plan.key_id, "version": plan.version, "fingerprint": plan.fingerprint,
                     "algorithm": prepared.spec.algorithm, "spec": prepared.spec.public_dict(),
                     "watermarked_tokens": done.routes.watermarked, "watermarked_share": share}
    return Outcome(generation_id=prepared.request.request_id, text=done.text, token_ids=done.token_ids,
                   finish_reason=done.finish_reason, prompt_tokens=done.prompt_tokens, watermark=watermark,
                   model=services.engine.model_name, routes=done.routes, unwatermarked_reason=reason)


def _record_quietly(services: Services, prepared: _Prepared, done: Finished) -> None:
    try:
        _record(services, prepared, done)
    except Unavailable:
        pass  # already logged by _record


async def _admitted(services: Services, identity: Identity, params: GenerateParams) -> tuple[_Prepared, GenerationLease]:
    """Validate and prepare (in a worker thread: key and tenant look-ups may query the
    database), then take a place in the tenant's limits (429 beyond them)."""
    prepared = await asyncio.to_thread(_prepare, services, identity, params)
    lease = await services.tenant_limits.admit(prepared.tenant_id, prepared.request.max_tokens)
    return prepared, lease


async def _leased(events: AsyncIterator[Delta | Outcome], lease: GenerationLease) -> AsyncIterator[Delta | Outcome]:
    """``events``, giving the lease back (with the tokens sent) however the stream ends."""
    sent = 0
    try:
        async for event in events:
            if isinstance(event, Delta):
                sent += len(event.token_ids)
            yield event
    finally:
        lease.release(sent)
        await events.aclose()


async def generate(services: Services, identity: Identity, params: GenerateParams) -> Outcome:
    prepared, lease = await _admitted(services, identity, params)
    try:
        outcome = await _generate(services, prepared)
    except BaseException:
        lease.release(0)
        raise
    lease.release(len(outcome.token_ids))
    return outcome


async def _generate(services: Services, prepared: _Prepared) -> Outcome:
    done = None
    try:
        async for event in services.engine.generate(prepared.request):
            if isinstance(event, Finished):
                done = event
    except (EngineBusy, EngineFailure) as exc:
        raise Unavailable(str(exc)) from None
    if done is None:
        raise Unavailable("the engine stopped before finishing the generation")
    return await asyncio.to_thread(_record, services, prepared, done)  # the ledger write, off the event loop


async def stream(services: Services, identity: Identity, params: GenerateParams) -> AsyncIterator[Delta | Outcome]:
    """Deltas as they come, then the recorded :class:`Outcome`. Validation happens before the
    first event, so a bad request fails before any streaming starts."""
    prepared, lease = await _admitted(services, identity, params)

    async def events() -> AsyncIterator[Delta | Outcome]:
        done = None
        text: list[str] = []
        tokens: list[int] = []
        routes = RouteCounts()
        iterator = services.engine.generate(prepared.request)
        try:
            async for event in iterator:
                if isinstance(event, Finished):
                    done = event
                else:
                    text.append(event.text)
                    tokens.extend(event.token_ids)
                    routes = event.routes or routes
                    yield event
        except (EngineBusy, EngineFailure) as exc:
            raise Unavailable(str(exc)) from None
        except (GeneratorExit, asyncio.CancelledError):
            # The client left mid-stream: what it was sent still gets its provenance record.
            partial = Finished(text="".join(text), token_ids=tuple(tokens), finish_reason="cancelled",
                               prompt_tokens=len(prepared.request.prompt_ids), routes=routes)
            threading.Thread(target=_record_quietly, args=(services, prepared, partial), daemon=True).start()
            raise
        finally:
            await iterator.aclose()
        if done is None:
            raise Unavailable("the engine stopped before finishing the generation")
        yield await asyncio.to_thread(_record, services, prepared, done)

    leased = _leased(events(), lease)
    weakref.finalize(leased, lease.release, 0)  # a stream never started still gives its place back
    return leased
