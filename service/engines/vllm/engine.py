"""The `vllm` engine adapter: Hallmark's :class:`~service.engines.base.Engine` over vLLM.

It turns a :class:`GenerationRequest` into a vLLM request whose ``extra_args`` name the
request's key (:mod:`.watermark_args`), streams the tokens back through a
:class:`~service.engines.stops.StopTextTracker`, and ends with the route counts replayed
from the tokens (:mod:`.route_replay`). Where vLLM runs is a :class:`Backend`: in this process
(:mod:`.inprocess`, key material sealed) or a remote ``vllm serve`` (:mod:`.remote`, key id
only). Closing the event iterator closes the backend stream, which aborts the request in
vLLM (cancellation).
"""

from __future__ import annotations

from typing import AsyncIterator

from service.engines.base import Delta, Finished, GenerationRequest, RouteCounts
from service.engines.stops import StopTextTracker
from service.engines.vllm.backend import Backend, Chunk, Sampling
from service.engines.vllm import watermark_args
from service.engines.vllm.route_replay import replay_routes, routes_for_opt_out
from watermark.processing import validate_sampling


class EngineNotReady(RuntimeError):
    """generate() before start(), or after stop()."""


def _finish_reason(reason: str | None) -> str:
    # vLLM says "stop" for EOS and stop tokens, "length" at max_tokens, "abort" when aborted.
    if reason in ("stop", "length"):
        return reason
    if reason == "abort":
        return "cancelled"
    return "stop"


class VLLMEngine:
    """An :class:`~service.engines.base.Engine` backed by vLLM (in-process or remote)."""

    name = "vllm"

    def __init__(self, backend: Backend, tokenizer_loader) -> None:
        self._backend = backend
        self._tokenizer_loader = tokenizer_loader
        self._tokenizer = None
        self._transport_key: bytes | None = None

    @property
    def model_name(self) -> str:
        return self._backend.model_name

    @property
    def ready(self) -> bool:
        return self._backend.ready

    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = self._tokenizer_loader()
        return self._tokenizer

    async def start(self) -> None:
        if self._backend.sends_key_material:
            from service.engines.vllm.sealing import ensure_transport_key

            # Before vLLM spawns its engine process, which inherits it from the environment.
            self._transport_key = ensure_transport_key()
        await self._backend.start()
        self.tokenizer()

    async def stop(self) -> None:
        await self._backend.stop()

    def _extra_args(self, request: GenerationRequest, seed: int) -> dict[str, Any]:
        plan = request.watermark
        if plan is None:
            return {}
        if self._backend.sends_key_material:
            return watermark_args.sealed_args(plan.key_id, plan.key, seed, self._transport_key)
        return watermark_args.reference_args(plan.key_id, seed, plan.key.salt)

    def check(self, request: GenerationRequest) -> None:
        """Raise ValueError for a request vLLM would refuse (before anything starts)."""
        validate_sampling(request.temperature, request.top_k, request.top_p)
        if request.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if request.seed is not None and not 0 <= request.seed <= watermark_args.MAX_SEED:
            raise ValueError("seed must be an integer in [0, 2**64 - 1]")

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Delta | Finished]:
        if not self.ready:
            raise EngineNotReady("the vllm engine is not started; call start() first")
        self.check(request)
        # The seed of the request's ordinary stream: given, or drawn here so that the
        # routes can be replayed afterwards (the plugin draws from the same stream).
        seed = request.seed if request.seed is not None else watermark_args.new_seed()
        sampling = Sampling(max_tokens=request.max_tokens, temperature=request.temperature,
                            top_p=request.top_p, top_k=request.top_k, seed=seed)
        tracker = StopTextTracker(self.tokenizer(), stop=tuple(request.stop))
        reason: str | None = None
        chunks = self._backend.stream(request.request_id, tuple(request.prompt_ids), sampling,
                                      self._extra_args(request, sampling.seed))
        try:
            async for chunk in chunks:
                if chunk.token_ids:
                    text = tracker.push(list(chunk.token_ids))
                    yield Delta(text=text, token_ids=chunk.token_ids)
                if tracker.stopped:
                    reason = "stop"
                    break
                if chunk.finish_reason is not None:
                    reason = _finish_reason(chunk.finish_reason)
                    break
        finally:
            # Closing the backend's stream aborts the request inside vLLM (stop string
            # reached, or our own consumer went away).
            await chunks.aclose()
        tail = tracker.finish()
        if tail:
            yield Delta(text=tail, token_ids=())
        token_ids = tuple(tracker.token_ids)
        yield Finished(text=tracker.text, token_ids=token_ids, finish_reason=reason or "stop",
                       prompt_tokens=len(request.prompt_ids), routes=self._routes(request, token_ids, sampling))

    @staticmethod
    def _routes(request: GenerationRequest, token_ids: tuple[int, ...], sampling: Sampling) -> RouteCounts:
        if request.watermark is None:
            return routes_for_opt_out(token_ids, request.temperature)
        return replay_routes(token_ids, request.watermark.key, sampling.seed, request.temperature,
                             prompt_ids=request.prompt_ids)

