"""The local engine: a Hugging Face causal LM (and optional draft) on CPU or one GPU.

A background thread owns the models and runs the step loop; the asyncio side submits
requests and receives their events through thread-safe callbacks. Requests join and
leave between steps (continuous batching); a consumer that stops listening cancels its
request at the next step.

Containment: a request whose admission (its prefill and first draw, run alone) fails is
failed alone. A step that raises is rolled back (the groups' caches are restored), every
running row is probed alone through the sampler, the rows that fail the probe are failed,
and the step runs again without them; only a failure no row explains (the model itself)
fails the whole batch. If the loop thread itself dies, in-flight requests fail with 503,
``ready`` turns false, and the loop restarts after ``restart_delay`` seconds; after
``max_restarts`` deaths within ten minutes it stays down and calls ``on_fatal`` (by
default SIGTERM to this process, so that its supervisor restarts it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections import deque
from typing import AsyncIterator, Callable

import numpy as np
import torch

from service.model_paths import BUNDLED_MODELS, resolve_model_path
from service.engines.base import Delta, EngineBusy, EngineFailure, Event, Finished, GenerationRequest, WatermarkPlan
from service.engines.local.batch import BatchSteps
from service.engines.local.outbox import Outbox, merged
from service.engines.local.outputs import OutputTable
from service.engines.local.request import RequestState
from service.engines.local.rows import DedupSlots
from service.engines.local.runner import Group, load_model
from service.engines.local.scheduler import SpeculativeGroups
from service.engines.local.static_runner import StaticGroup, check_batched_prefill
from service.engines.local.streamer import REST_RATIO, Streamer
from service.engines.local.telemetry import EngineTelemetry, StepReport
from watermark.processing import validate_sampling

log = logging.getLogger("hallmark.engine.local")
SWITCH_INTERVAL_CUDA = 0.001
"""Seconds: the interpreter's thread switch interval with the engine on CUDA (LocalEngine.switch_interval)."""
ADMIT_QUIET = 0.001
ADMIT_SETTLE = 0.02
"""Seconds: an idle engine that finds a burst of requests waiting (more than one) admits them
once none has arrived for ADMIT_QUIET, waiting ADMIT_SETTLE at most (LocalEngine._settle)."""


class LocalEngine(BatchSteps):
    name = "local"

    def __init__(self, model: str = "bundled", draft_model: str | None = None, *, device: str = "auto",
                 max_batch: int = 16, speculative_k: int = 4, max_queue: int = 256,
                 restart_delay: float = 1.0, max_restarts: int = 3, on_fatal=None,
                 static_cache: bool | None = None, cuda_graphs: bool = True, cpu_threads: int | None = None,
                 speculative_blocks: bool | None = None, pipeline_blocks: bool = True,
                 streamer_thread: bool | None = None, pipeline_depth: int = 1,
                 switch_interval: float | None = None, batched_prefill: bool | None = None,
                 streamer_rest: float | None = None) -> None:
        # Reported as the bundled model's real name ("bundled" is only an alias for it).
        self.model_name = BUNDLED_MODELS.get(model, model)
        self.draft_name = draft_model
        self._device_name = device
        self.max_batch = max_batch
        self.k = speculative_k
        self.max_queue = max_queue
        # Static preallocated KV caches (service/engines/local/model); None = on CUDA only.
        self.static_cache = static_cache
        self.cuda_graphs = cuda_graphs
        # Intra-op threads of the engine's thread on the CPU; None: see _cpu_threads.
        self.cpu_threads = cpu_threads
        # Speculative blocks as one function of fixed shapes (spec_block.py), one CUDA graph
        # per bucket on CUDA; None = on static caches on CUDA. False: scheduler.speculative_step.
        self.speculative_blocks = speculative_blocks
        # Graph-replayed blocks run one ahead of the host (spec_block.SpeculativeBlocks.step).
        self.pipeline_blocks = pipeline_blocks
        self.pipeline_depth = pipeline_depth
        # Requests' text made on a thread of its own (streamer.py); None = on CUDA, where the
        # step loop's time is the GPU's idle time.
        self.streamer_thread = streamer_thread
        # The interpreter's thread switch interval while the engine runs on CUDA (None: 1 ms
        # there, unchanged on the CPU; 0: unchanged). The step loop waits for the GPU with
        # the GIL released; taking it back from a busy event loop or streamer thread waits
        # up to this long, while the GPU may run dry. Python's default is 5 ms.
        self.switch_interval = switch_interval
        # Admission prefills many prompts in one forward (static groups on CUDA) where a
        # check at load finds every row's logits equal to its own prefill's; False: never.
        self.batched_prefill = batched_prefill
        self._blocks = None
        self._ready = False
        self._tokenizer = None
        self._waiting: deque[RequestState] = deque()
        self._running: list[RequestState] = []
        self._running_rows = np.zeros(0, dtype=np.int64)  # their OutputTable rows
        self._cancelling = threading.Event()  # a request was cancelled: the next retire looks
        self._outputs: OutputTable | None = None  # every admitted request's tokens (outputs.py)
        self._members: dict[str, list[RequestState]] = {}  # per group: its rows in order (step cache)
        self._wake = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.max_context_tokens = 0
        self.vocab_size = 0
        self.restart_delay = restart_delay
        self.max_restarts = max_restarts
        self.on_fatal = on_fatal or _terminate_process
        self._deaths: list[float] = []
        self._looping = False
        # Called after every step with a StepReport (host-side facts only; see telemetry.py).
        self.step_hooks: list[Callable[[StepReport], None]] = []
        self.telemetry: EngineTelemetry | None = None
        self._outbox = Outbox()
        # The threaded streamer's rest after a pass, in multiples of the pass (streamer.py;
        # None: REST_RATIO, 0: none, a pass as soon as a block is posted).
        self._streamer = Streamer(threaded=False, after_pass=self._outbox.flush,
                                  rest_ratio=REST_RATIO if streamer_rest is None else streamer_rest)
        self._tables: dict[str, tuple] = {}  # per group: (RowTable, dedup) of its current rows
        self._dedup_slots: DedupSlots | None = None  # the GPU deduper's request slots (CUDA)

    # ------------------------------------------------------------------ lifecycle

    @property
    def ready(self) -> bool:
        """Models loaded and the step loop alive."""
        return self._ready and self._looping

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
        if device.type == "cpu":
            self.cpu_threads = _cpu_threads(target, self.cpu_threads)
            torch.set_num_threads(self.cpu_threads)  # the warm-up below runs on this thread
        self.max_context_tokens = int(getattr(target.config, "max_position_embeddings", 2048))
        static = self.static_cache if self.static_cache is not None else device.type == "cuda"
        self._outputs = OutputTable(self.max_batch, self.max_context_tokens)
        self._streamer.threaded = self.streamer_thread if self.streamer_thread is not None else device.type == "cuda"

        def group(model):
            if static:  # preallocated KV cache; decode/verify forwards replayed as CUDA graphs on CUDA
                return StaticGroup(model, device, slots=self.max_batch, context=self.max_context_tokens + self.k + 1,
                                   graphs=self.cuda_graphs)
            return Group(model, device)

        self.plain = group(target)
        self.spec_target = group(target)
        self.spec: SpeculativeGroups | None = None
        if self.draft_name:
            draft = load_model(resolve_model_path(self.draft_name), device)
            if draft.config.vocab_size != target.config.vocab_size:
                raise ValueError("the draft model's vocabulary differs from the target's; they must share a tokenizer")
            self.spec = SpeculativeGroups(target=self.spec_target, draft=group(draft), k=self.k)
        tok = self.tokenizer()
        eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        gen_eos = getattr(target.generation_config, "eos_token_id", None)
        eos |= set(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos] if gen_eos is not None else [])
        self.eos_ids = frozenset(e for e in eos if e is not None)
        self.max_context_tokens = int(getattr(target.config, "max_position_embeddings", 2048))
        self.vocab_size = int(target.config.vocab_size)
        if device.type == "cuda":
            try:
                from watermark.kernels.registry import warm_up

                warm_up(device)
                if self.spec is not None:  # speculative blocks take their dedup decisions on the GPU
                    self._dedup_slots = DedupSlots(self.max_batch, self.max_context_tokens + self.k + 2, device)
            except ImportError:
                log.warning("Triton kernels unavailable; the CUDA path uses the torch reference")
        if device.type == "cpu":  # compile the CPU race now, not at the first request
            from watermark import cpu_race

            cpu_race.warm_up()
        blocks = self.speculative_blocks if self.speculative_blocks is not None else \
            static and device.type == "cuda"
        if blocks and self.spec is not None and isinstance(self.spec_target, StaticGroup):
            from service.engines.local.spec_block import SpeculativeBlocks

            self._blocks = SpeculativeBlocks(self.spec.draft, self.spec_target, self.k, self._outputs, self._streamer,
                                             self._dedup_slots, graphs=self.cuda_graphs, pipeline=self.pipeline_blocks,
                                             depth=self.pipeline_depth)
        self._warm_up()
        for group in self._groups():  # capture every decode/verify graph now, not at request time
            if isinstance(group, StaticGroup) and group.graphs_enabled:
                if self._blocks is not None and group in (self.spec.draft, self.spec_target):
                    widths = ()  # the blocks' own graphs run their forwards: prefill graphs only
                else:
                    widths = (1, 2) if self.spec is not None and group is self.spec.draft else \
                        (self.k + 1,) if group is self.spec_target else (1,)
                group.capture_all(widths)
        if self._blocks is not None:
            self._blocks.capture_all()
        for group in self._groups():  # prefill many prompts in one forward where that changes no logits
            if isinstance(group, StaticGroup) and group.graphs_enabled and self.batched_prefill is not False:
                group.batched_prefill = check_batched_prefill(group)
                log.info("batched prefill on %s: %s", group.model.config.model_type,
                         "on" if group.batched_prefill else "off (a row's logits differ from its own prefill's)")
        if self.telemetry is None:  # after the warm-up, so that its steps are not counted
            self.telemetry = EngineTelemetry.attach(self)
        self._ready = True

    def _warm_up(self) -> None:
        from watermark.key import WatermarkKey
        from watermark.spec import WatermarkSpec

        sink = lambda event: None  # noqa: E731
        for algorithm in ("gumbel", "dual_key_gumbel"):
            plan = WatermarkPlan(key=WatermarkKey(1, WatermarkSpec(algorithm=algorithm)), key_id="warmup",
                                 version=0, fingerprint="")
            state = RequestState(GenerationRequest("warmup", tuple(self.tokenizer().encode("Warm up")), 3,
                                                   watermark=plan), self.tokenizer(), frozenset(), sink,
                                 streamer=self._streamer)
            self._admit([state])
            while not state.finished:
                self._step()
            self._retire()

    async def start(self) -> None:
        if self._thread is not None:
            return
        await asyncio.to_thread(self.load)
        interval = self.switch_interval if self.switch_interval is not None else \
            (SWITCH_INTERVAL_CUDA if self.device.type == "cuda" else 0)
        if interval:
            sys.setswitchinterval(interval)
        self._stop = False
        self._start_thread()

    def _start_thread(self) -> None:
        self._looping = True
        self._thread = threading.Thread(target=self._supervised_loop, name="hallmark-local-engine", daemon=True)
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
        validate_sampling(request.temperature, request.top_k, request.top_p)
        if self.vocab_size and request.top_k > self.vocab_size:
            raise ValueError(f"top_k must be at most the vocabulary size, {self.vocab_size} (0 disables it)")
        if self.vocab_size and any(not 0 <= t < self.vocab_size for t in request.prompt_ids):
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size})")
        if request.seed is not None and not 0 <= request.seed < 2**64:
            raise ValueError("seed must be an integer in [0, 2**64)")
        if len(request.prompt_ids) + request.max_tokens > self.max_context_tokens:
            raise ValueError(f"prompt ({len(request.prompt_ids)} tokens) plus max_tokens ({request.max_tokens}) "
                             f"exceeds the model's context of {self.max_context_tokens} tokens")

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Event]:
        self.check(request)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        state = RequestState(request, self.tokenizer(), self.eos_ids, sink=self._outbox.sink(loop, queue),
                             streamer=self._streamer)
        with self._wake:
            if not self.ready:
                raise EngineFailure("the engine is not running (restarting after a failure); retry shortly")
            if len(self._waiting) >= self.max_queue:
                raise EngineBusy("the generation queue is full; retry shortly")
            self._waiting.append(state)
            self._wake.notify_all()
        held = None
        try:
            while True:
                event, held = caught_up(queue, held if held is not None else await queue.get())
                if isinstance(event, BaseException):
                    raise EngineFailure(str(event)) from event
                yield event
                if isinstance(event, Finished):
                    return
        finally:
            if not state.finished:
                state.cancelled.set()
                self._cancelling.set()
                with self._wake:
                    self._wake.notify_all()

    # ------------------------------------------------------------------ the loop (engine thread)

    def _supervised_loop(self) -> None:
        try:
            self._loop()
            return
        except BaseException as exc:  # noqa: BLE001 - the thread's last word: fail everyone, restart
            log.exception("the engine loop died")
            failure = exc
        self._looping = False
        with self._wake:
            lost = self._running + list(self._waiting)
            self._waiting.clear()
        for state in lost:
            state.fail(EngineFailure(f"the engine failed ({type(failure).__name__}); retry"))
            state.detach()
        self._streamer.wait(30)
        self._outbox.flush()
        self._set_running([])
        self._reset_groups()
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < 600] + [now]
        if len(self._deaths) > self.max_restarts:
            log.critical("the engine loop died %d times in ten minutes; giving up", len(self._deaths))
            self.on_fatal()
            return
        time.sleep(self.restart_delay)
        with self._wake:
            if self._stop:
                return
        log.warning("restarting the engine loop")
        self._start_thread()

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        if self.device.type == "cpu":
            torch.set_num_threads(self.cpu_threads)
        while True:
            with self._wake:
                while not self._stop and not self._waiting and not self._running:
                    self._wake.wait(timeout=1.0)
                if self._stop:
                    break
                if not self._running and len(self._waiting) > 1:
                    self._settle()
                admitted = []
                while self._waiting and len(self._running) + len(admitted) < self.max_batch:
                    admitted.append(self._waiting.popleft())
            live = []
            for state in admitted:
                if state.cancelled.is_set():
                    state.finish("cancelled")
                else:
                    live.append(state)
            if live:
                self._admit_all(live)
            try:
                self._step_contained()
            except Exception as exc:  # a model failure fails every running request, not the server
                log.exception("engine step failed")
                for state in self._running:
                    state.fail(exc)
                    state.detach()
                self._set_running([])
                self._reset_groups()
            self._retire()
            self._outbox.flush()
        self._streamer.wait(30)
        self._outbox.flush()

    def _settle(self) -> None:
        """With the engine idle and a burst of requests arriving (a round of 256 clients
        submitted at once), wait until the burst stops growing (``self._wake`` held): the
        step loop woke at the first of them and would otherwise admit the burst in pieces,
        each with its own fixed cost (the blocks drained, one eager prefill forward per group
        and chunk, the first draw read back, the groups' RowTables and graphs changed): 2 or
        more admissions per 256 requests on the CPU, one after this (bench/engine_admission.py).
        A lone request (batch 1) is admitted at once."""
        deadline = time.monotonic() + ADMIT_SETTLE
        seen = len(self._waiting)
        while seen < self.max_batch and not self._stop:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._wake.wait(min(ADMIT_QUIET, left))
            if len(self._waiting) == seen:
                return
            seen = len(self._waiting)

def caught_up(queue: asyncio.Queue, event) -> tuple[object, object]:
    """``event``, merged with the Deltas already queued behind it (a Delta only), and the
    first other event taken from the queue meanwhile (None if none). A consumer that fell
    behind (a stream awaiting its ledger checkpoint) gets one event for everything that
    arrived meanwhile: it catches up in one step and covers it with one checkpoint, rather
    than one per 32 tokens; the text and tokens are the same."""
    while isinstance(event, Delta) and not queue.empty():
        following = queue.get_nowait()
        if not isinstance(following, Delta):
            return event, following
        event = merged(event, following)
    return event, None


# Below this many parameters a CPU decode step is a chain of operations too small to share:
# a second intra-op thread only adds fork/join barriers. The bundled draft (2.85 M, batch 8)
# ran no faster with two threads on an idle 2-core machine and 3x slower with the machine
# loaded (bench/local_vs_vllm_cpu.py; the event loop's thread then preempts a spinning worker).
_SMALL_MODEL_PARAMETERS = 100_000_000
_DEFAULT_THREADS = torch.get_num_threads()  # before any engine changed it


def _cpu_threads(model, requested: int | None) -> int:
    """The engine thread's intra-op threads: ``requested``, else one for small models and
    torch's default for the rest."""
    if requested is not None:
        if requested < 1:
            raise ValueError("cpu_threads must be at least 1 (or None to choose by model size)")
        return requested
    if sum(p.numel() for p in model.parameters()) < _SMALL_MODEL_PARAMETERS:
        return 1
    return _DEFAULT_THREADS


def _terminate_process() -> None:
    """Ask this process to shut down (uvicorn drains and exits; a supervisor restarts it)."""
    os.kill(os.getpid(), signal.SIGTERM)


def create_local_engine(settings) -> LocalEngine:
    return LocalEngine(settings.model, settings.draft_model or None, device=settings.device,
                       max_batch=settings.max_batch, speculative_k=settings.speculative_k,
                       max_queue=settings.max_queue)
