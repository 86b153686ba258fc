"""The local engine: a Hugging Face causal LM (and optional draft) on CPU or one GPU.

A background thread owns the models and runs the step loop; the asyncio side submits
requests and receives their events through thread-safe callbacks. Requests join and
leave between steps (continuous batching); a consumer that stops listening cancels its
request at the next step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from typing import AsyncIterator

import torch

from service.engines import BUNDLED_MODELS, resolve_model_path
from service.engines.base import EngineBusy, EngineFailure, Event, Finished, GenerationRequest, WatermarkPlan
from service.engines.local.request import RequestState
from service.engines.local.runner import Group, load_model
from service.engines.local.scheduler import SpeculativeGroups, plain_step, sample_next, speculative_step

log = logging.getLogger("hallmark.engine.local")


class LocalEngine:
    name = "local"

    def __init__(self, model: str = "bundled", draft_model: str | None = None, *, device: str = "auto",
                 max_batch: int = 16, speculative_k: int = 4, max_queue: int = 256) -> None:
        # Reported as the bundled model's real name ("bundled" is only an alias for it).
        self.model_name = BUNDLED_MODELS.get(model, model)
        self.draft_name = draft_model
        self._device_name = device
        self.max_batch = max_batch
        self.k = speculative_k
        self.max_queue = max_queue
        self._ready = False
        self._tokenizer = None
        self._waiting: deque[RequestState] = deque()
        self._running: list[RequestState] = []
        self._pending: dict[int, list[int]] = {}  # draft tokens not yet fed, per request
        self._wake = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.max_context_tokens = 0

    # ------------------------------------------------------------------ lifecycle

    @property
    def ready(self) -> bool:
        return self._ready

    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(self.model_name))
        return self._tokenizer

    def _device(self) -> torch.device:
        if self._device_name == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self._device_name)

    def load(self) -> None:
        """Load the models and warm every code path up (blocking)."""
        device = self._device()
        self.device = device
        target = load_model(resolve_model_path(self.model_name), device)
        self.plain = Group(target, device)
        self.spec_target = Group(target, device)
        self.spec: SpeculativeGroups | None = None
        if self.draft_name:
            draft = load_model(resolve_model_path(self.draft_name), device)
            if draft.config.vocab_size != target.config.vocab_size:
                raise ValueError("the draft model's vocabulary differs from the target's; they must share a tokenizer")
            self.spec = SpeculativeGroups(target=self.spec_target, draft=Group(draft, device), k=self.k)
        tok = self.tokenizer()
        eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        gen_eos = getattr(target.generation_config, "eos_token_id", None)
        eos |= set(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos] if gen_eos is not None else [])
        self.eos_ids = frozenset(e for e in eos if e is not None)
        self.max_context_tokens = int(getattr(target.config, "max_position_embeddings", 2048))
        if device.type == "cuda":
            try:
                from watermark.kernels.registry import warm_up

                warm_up(device)
            except ImportError:
                log.warning("Triton kernels unavailable; the CUDA path uses the torch reference")
        self._warm_up()
        self._ready = True

    def _warm_up(self) -> None:
        from watermark.key import WatermarkKey
        from watermark.spec import WatermarkSpec

        sink = lambda event: None  # noqa: E731
        for algorithm in ("gumbel", "dual_key_gumbel"):
            plan = WatermarkPlan(key=WatermarkKey(1, WatermarkSpec(algorithm=algorithm)), key_id="warmup",
                                 version=0, fingerprint="")
            state = RequestState(GenerationRequest("warmup", tuple(self.tokenizer().encode("Warm up")), 3,
                                                   watermark=plan), self.tokenizer(), frozenset(), sink)
            self._admit(state)
            while not state.finished:
                self._step()
            self._retire()

    async def start(self) -> None:
        if self._thread is not None:
            return
        await asyncio.to_thread(self.load)
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="hallmark-local-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)
            self._thread = None
        self._ready = False

    # ------------------------------------------------------------------ requests

    def check(self, request: GenerationRequest) -> None:
        if len(request.prompt_ids) + request.max_tokens > self.max_context_tokens:
            raise ValueError(f"prompt ({len(request.prompt_ids)} tokens) plus max_tokens ({request.max_tokens}) "
                             f"exceeds the model's context of {self.max_context_tokens} tokens")

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Event]:
        self.check(request)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        state = RequestState(request, self.tokenizer(), self.eos_ids,
                             sink=lambda event: loop.call_soon_threadsafe(queue.put_nowait, event))
        with self._wake:
            if len(self._waiting) >= self.max_queue:
                raise EngineBusy("the generation queue is full; retry shortly")
            self._waiting.append(state)
            self._wake.notify_all()
        try:
            while True:
                event = await queue.get()
                if isinstance(event, BaseException):
                    raise EngineFailure(str(event)) from event
                yield event
                if isinstance(event, Finished):
                    return
        finally:
            if not state.finished:
                state.cancelled.set()
                with self._wake:
                    self._wake.notify_all()

    # ------------------------------------------------------------------ the loop (engine thread)

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._wake:
                while not self._stop and not self._waiting and not self._running:
                    self._wake.wait(timeout=1.0)
                if self._stop:
                    break
                admitted = []
                while self._waiting and len(self._running) + len(admitted) < self.max_batch:
                    admitted.append(self._waiting.popleft())
            try:
                for state in admitted:
                    if state.cancelled.is_set():
                        state.finish("cancelled")
                        continue
                    self._admit(state)
                self._step()
            except Exception as exc:  # a model failure fails every running request, not the server
                log.exception("engine step failed")
                for state in self._running + admitted:
                    if not state.finished:
                        state.finished = True
                        state.sink(exc)
                self._running = []
                self._reset_groups()
            self._retire()

    def _reset_groups(self) -> None:
        for group in (self.plain, self.spec_target, self.spec.draft if self.spec else None):
            if group is not None:
                group.keep([])
        self._pending.clear()

    def _uses_speculation(self, state: RequestState) -> bool:
        return self.spec is not None and (state.request.watermark is None or state.dual_key)

    def _admit(self, state: RequestState) -> None:
        rid = state.request.request_id + f"#{id(state)}"
        state.rid = rid
        prompt = list(state.request.prompt_ids)
        group = self.spec_target if self._uses_speculation(state) else self.plain
        cache, mask, logits = group.prefill(prompt)
        sample_next(logits.unsqueeze(0), [state])
        if state.finished:
            return
        group.join(rid, cache, mask, len(prompt))
        if group is self.spec_target:
            d_cache, d_mask, _ = self.spec.draft.prefill(prompt)
            self.spec.draft.join(rid, d_cache, d_mask, len(prompt))
            self._pending[id(state)] = [state.last_token]
        self._running.append(state)

    def _step(self) -> None:
        plain = [s for s in self._running if s.rid in set(self.plain.ids)]
        spec = [s for s in self._running if self.spec is not None and s.rid in set(self.spec_target.ids)]
        if plain:
            plain = sorted(plain, key=lambda s: self.plain.ids.index(s.rid))
            plain_step(self.plain, plain)
        if spec:
            spec = sorted(spec, key=lambda s: self.spec_target.ids.index(s.rid))
            pending = [self._pending[id(s)] for s in spec]
            speculative_step(self.spec, spec, pending)
            for s, p in zip(spec, pending):
                self._pending[id(s)] = p

    def _retire(self) -> None:
        for state in self._running:
            if state.cancelled.is_set() and not state.finished:
                state.finish("cancelled")
        alive = [s for s in self._running if not s.finished]
        if len(alive) != len(self._running):
            ids = {s.rid for s in alive}
            self.plain.keep([i for i in self.plain.ids if i in ids])
            if self.spec is not None:
                self.spec_target.keep([i for i in self.spec_target.ids if i in ids])
                self.spec.draft.keep([i for i in self.spec.draft.ids if i in ids])
            for s in self._running:
                if s.finished:
                    self._pending.pop(id(s), None)
            self._running = alive


def create_local_engine(settings) -> LocalEngine:
    return LocalEngine(settings.model, settings.draft_model or None, device=settings.device,
                       max_batch=settings.max_batch, speculative_k=settings.speculative_k,
                       max_queue=settings.max_queue)
