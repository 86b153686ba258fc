"""vLLM in this process: ``AsyncLLM`` with Hallmark's plugin loaded.

vLLM runs its scheduler and model in engine-core processes it spawns; this backend owns
the ``AsyncLLM`` front end, which batches every concurrent request (tenants mixed) into
the same steps. Key material travels sealed under this process's transport key
(:mod:`.sealing`). vLLM's request logging stays off: it would print sampling parameters.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import os
from typing import Any, AsyncIterator

from service.engines.vllm import PLUGIN
from service.engines.vllm.backend import Chunk, Sampling

KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"


async def _in_thread(build):
    """Run ``build()`` in a short-lived thread, keeping the event loop responsive while
    vLLM loads (seconds to minutes). The result passes through a list that is emptied,
    not a future or the loop's executor (both keep a reference to it): AsyncLLM must be
    collectable right after shutdown(), or its __del__ fails at interpreter exit."""
    loop = asyncio.get_running_loop()
    finished = asyncio.Event()
    box: list = []

    def target() -> None:
        try:
            box.append(build())
        except BaseException as exc:  # re-raised in the awaiting coroutine
            box.append(exc)
        finally:
            loop.call_soon_threadsafe(finished.set)

    thread = threading.Thread(target=target, name="hallmark-vllm-start", daemon=True)
    thread.start()
    await finished.wait()
    thread.join()
    outcome = box.pop()
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


class InProcessBackend:
    """``AsyncLLM`` over a local checkpoint, with the per-request-key plugin."""

    sends_key_material = True

    def __init__(self, model: str, *, model_name: str | None = None, dtype: str = "auto",
                 max_model_len: int | None = None, enforce_eager: bool = False,
                 cpu_kv_cache_gib: int | None = None, engine_options: dict[str, Any] | None = None) -> None:
        self.model = model
        self.model_name = model_name or model
        self._options = {"dtype": dtype, "max_model_len": max_model_len, "enforce_eager": enforce_eager,
                         **(engine_options or {})}
        self._cpu_kv_cache_gib = cpu_kv_cache_gib
        self._engine = None

    @property
    def ready(self) -> bool:
        return self._engine is not None and not self._engine.errored

    def _build(self):
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        if self._cpu_kv_cache_gib is not None:
            # Read by vLLM's CPU worker at start; ignored by GPU builds.
            os.environ.setdefault(KV_CACHE_ENV, str(self._cpu_kv_cache_gib))
        options = {name: value for name, value in self._options.items() if value is not None}
        args = AsyncEngineArgs(model=self.model, served_model_name=self.model_name,
                               logits_processors=[PLUGIN], enable_log_requests=False,
                               disable_log_stats=True, **options)
        return AsyncLLM.from_engine_args(args)

    async def start(self) -> None:
        if self._engine is None:
            self._engine = await _in_thread(self._build)

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            # Terminates the engine-core and worker processes vLLM spawned. On the loop's
            # own thread: it cancels vLLM's output-handler task before the engine core
            # goes away (from another thread the handler sees a dead engine and logs it).
            engine.shutdown()
            # Collect it now: AsyncLLM.__del__ shuts down again, which fails noisily if it
            # only runs during interpreter teardown.
            del engine
            gc.collect()

    async def stream(self, request_id: str, prompt_ids: tuple[int, ...], sampling: Sampling,
                     extra_args: dict[str, Any]) -> AsyncIterator[Chunk]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=sampling.max_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k, seed=sampling.seed % (2**63) if sampling.seed is not None else None,
            output_kind=RequestOutputKind.DELTA, skip_special_tokens=True,
            extra_args=dict(extra_args) or None,
        )
        outputs = self._engine.generate({"prompt_token_ids": list(prompt_ids)}, params, request_id)
        try:
            async for output in outputs:
                completion = output.outputs[0]
                yield Chunk(token_ids=tuple(completion.token_ids),
                            finish_reason=completion.finish_reason if output.finished else None)
        finally:
            # Closing vLLM's generator aborts the request if it is still running.
            await outputs.aclose()
