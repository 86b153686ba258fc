"""One request's state inside the local engine: sampling parameters, watermark keys,
context history, output so far, and the sink its events go to.

Its output and counters live in a row of an :class:`~service.engines.local.outputs.OutputTable`
(the engine's, from admission until it leaves; its own before that, or when used alone),
so that the step loop can take a block's tokens for every request at once; its events are
made by a :class:`~service.engines.local.streamer.Streamer` (the engine's detokenising
thread on CUDA; inline, here, otherwise).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

from service.engines.base import Delta, Finished, GenerationRequest, RouteCounts
from service.engines.local.outputs import OutputTable
from service.engines.local.streamer import Streamer, route_counts
from service.engines.stops import StopTextTracker
from watermark import stream
from watermark.dedup import ContextDeduper
from watermark.key import row_keys
from watermark.processing import validate_sampling
from watermark.spec import WatermarkSpec


@dataclass(eq=False)
class RequestState:
    request: GenerationRequest
    tokenizer: object
    eos_ids: frozenset[int]
    sink: Callable[[object], None]
    streamer: Streamer | None = None
    """Where its events are made (None: inline, on the calling thread)."""
    cancelled: threading.Event = field(default_factory=threading.Event)
    failed: bool = False
    rid: str = ""  # the row id in the engine's batch groups

    def __post_init__(self) -> None:
        req = self.request
        # No row with parameters the sampler cannot take ever reaches a batch (the gateway
        # validates first; this guards every other caller).
        validate_sampling(req.temperature, req.top_k, req.top_p)
        if self.streamer is None:
            self.streamer = Streamer()
        self.tracker = StopTextTracker(self.tokenizer, req.stop)
        self.stream_key = stream.stream_key(req.seed)
        plan = req.watermark
        self.spec: WatermarkSpec | None = plan.key.spec if plan else None
        self.keys = row_keys(plan.key if plan else None)
        if plan is None:
            self._dedup = ContextDeduper(1, "none", None)
        else:
            spec = plan.key.spec
            self._dedup = ContextDeduper(spec.context_width, spec.dedup, spec.dedup_max_history, prompt=req.prompt_ids)
        self._dedup_seen = 0  # output tokens the deduper has taken (it catches up when read)
        self.table: OutputTable | None = None
        self.row = -1
        self._finished = False
        self._final: list[int] = []  # the output, once the request has left its table row

    # ------------------------------------------------------------------ its table row

    def attach(self, table: OutputTable) -> None:
        """Take a row of the engine's table (at admission)."""
        self.row = table.open(self.request.max_tokens, self.eos_ids, one_by_one=not self.streamed)
        self.table = table
        table.done[self.row] = self._finished

    def detach(self) -> None:
        """Leave the table (the request has left the batch): its output is copied out."""
        if self.table is not None:
            self._final = self.table.output(self.row)
            self.table.close(self.row)
            self.table, self.row = None, -1

    def _own_row(self) -> tuple[OutputTable, int]:
        if self.table is None:  # used alone (tests) or before admission
            self.attach(OutputTable(1, max(self.request.max_tokens, 1)))
        return self.table, self.row

    @property
    def finished(self) -> bool:
        return self._finished

    @finished.setter
    def finished(self, value: bool) -> None:
        self._finished = value
        if self.table is not None:
            self.table.done[self.row] = value

    @property
    def output(self) -> list[int]:
        return self.table.output(self.row) if self.table is not None else list(self._final)

    @property
    def length(self) -> int:
        return int(self.table.length[self.row]) if self.table is not None else len(self._final)

    @property
    def last_token(self) -> int | None:
        """The last sampled token (not yet fed to the target model), None before the first."""
        n = self.length
        if n == 0:
            return None
        return int(self.table.tokens[self.row, n - 1]) if self.table is not None else self._final[-1]

    def _counter(self, name: str) -> int:
        return int(getattr(self.table, name)[self.row]) if self.table is not None else 0

    @property
    def drafted(self) -> int:
        return self._counter("drafted")

    @drafted.setter
    def drafted(self, value: int) -> None:
        self._own_row()[0].drafted[self.row] = value

    @property
    def accepted(self) -> int:
        return self._counter("accepted")

    @accepted.setter
    def accepted(self, value: int) -> None:
        self._own_row()[0].accepted[self.row] = value

    def routes(self) -> RouteCounts:
        return route_counts(self.table.routes[self.row]) if self.table is not None else RouteCounts()

    @property
    def dedup(self) -> ContextDeduper:
        """The request's ContextDeduper, up to date with its output (the engine takes blocks
        into the table without it; the CPU path and row probes read it)."""
        n = self.length
        if self._dedup_seen < n:
            self._dedup.extend(self.output[self._dedup_seen:n])
            self._dedup_seen = n
        return self._dedup

    @property
    def width(self) -> int:
        """The watermark context width (without catching the deduper up)."""
        return self._dedup.width

    # ------------------------------------------------------------------ flags

    @property
    def greedy(self) -> bool:
        return self.request.temperature == 0

    @property
    def watermarked(self) -> bool:
        return self.request.watermark is not None and not self.greedy

    @property
    def dual_key(self) -> bool:
        return self.spec is not None and self.spec.algorithm == "dual_key_gumbel"

    @property
    def keyed_coin(self) -> bool:
        return self.spec is not None and self.spec.coin == "keyed"

    @property
    def streamed(self) -> bool:
        """Whether its text is made by the streamer (no stop strings: where its text ends
        does not decide where it stops)."""
        return not self.request.stop

    # ------------------------------------------------------------------ taking tokens

    def emit(self, token: int, route: int) -> bool:
        """Take one sampled token; returns True when the request has finished. A failure
        here (detokenising, a stop string) fails this request only."""
        return self.emit_block([token], [route])

    def emit_block(self, tokens: list[int], routes: list[int]) -> bool:
        """Take several sampled tokens in order (a step's tokens for this request) with one
        Delta for all of them; returns True when the request has finished. Requests with
        stop strings take them one by one, so that the text ends at the token that
        completes a stop string. (The engine takes a whole block's rows at once with
        OutputTable.take; this is the same rule for one request.)"""
        if self.finished:
            return True
        try:
            if not self.streamed:
                return any(self._emit_stopping(token, route) for token, route in zip(tokens, routes))
            return self._emit_block(tokens, routes)
        except Exception as exc:  # noqa: BLE001 - contained to this row, reported to its caller
            self.fail(exc)
            return True

    def _emit_block(self, tokens: list[int], routes: list[int]) -> bool:
        table, row = self._own_row()
        taken: list[int] = []
        reason = None
        for token, route in zip(tokens, routes):
            if token in self.eos_ids:
                reason = "stop"
                break
            table.append(row, token, route)
            taken.append(token)
            if self.length >= self.request.max_tokens:
                reason = "length"
                break
        if taken:
            self.streamer.tokens(self, taken, self.routes())
        if reason:
            return self.finish(reason)
        return False

    def _emit_stopping(self, token: int, route: int) -> bool:
        if self.finished:
            return True
        if token in self.eos_ids:
            return self.finish("stop")
        table, row = self._own_row()
        table.append(row, token, route)
        self.streamer.event(self, Delta(text=self.tracker.push([token]), token_ids=(token,), routes=self.routes()))
        if self.tracker.stopped:
            return self.finish("stop")
        if self.length >= self.request.max_tokens:
            return self.finish("length")
        return False

    # ------------------------------------------------------------------ ending

    def fail(self, exc: BaseException) -> None:
        """End this request with an error (its caller gets an EngineFailure)."""
        if not self.finished:
            self.finished = self.failed = True
            self.streamer.fail(self, exc)

    def fail_from_stream(self, exc: BaseException) -> None:
        """The streamer could not make this request's text: it fails (the step loop sees
        it finished and lets it leave)."""
        if not self.failed:
            self.finished = self.failed = True
            self.sink(exc)

    def finish(self, reason: str) -> bool:
        if self.finished:
            return True
        self.finished = True
        self.streamer.finish(self, Finished(
            text="", token_ids=tuple(self.output), finish_reason=reason, prompt_tokens=len(self.request.prompt_ids),
            routes=self.routes(), drafted_tokens=self.drafted, accepted_tokens=self.accepted))
        return True
