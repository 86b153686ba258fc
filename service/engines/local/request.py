"""One request's state inside the local engine: sampling parameters, watermark keys,
context history, output so far, and the sink its events go to."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

from service.engines.base import Delta, Finished, GenerationRequest, RouteCounts
from service.engines.stops import StopTextTracker
from watermark import stream
from watermark.dedup import ContextDeduper
from watermark.key import row_keys
from watermark.processing import validate_sampling
from watermark.results import ROUTE_GREEDY, ROUTE_KEY_A, ROUTE_KEY_B, ROUTE_PLAIN
from watermark.spec import WatermarkSpec


@dataclass
class RequestState:
    request: GenerationRequest
    tokenizer: object
    eos_ids: frozenset[int]
    sink: Callable[[object], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    output: list[int] = field(default_factory=list)
    counts: dict[int, int] = field(default_factory=lambda: {ROUTE_KEY_A: 0, ROUTE_KEY_B: 0, ROUTE_PLAIN: 0,
                                                            ROUTE_GREEDY: 0})
    drafted: int = 0
    accepted: int = 0
    finished: bool = False
    last_token: int | None = None  # sampled, not yet fed to the target model
    rid: str = ""  # the row id in the engine's batch groups
    unsent: list[int] = field(default_factory=list)  # taken tokens whose text is not sent yet (emit_block defer)

    def __post_init__(self) -> None:
        req = self.request
        # No row with parameters the sampler cannot take ever reaches a batch (the gateway
        # validates first; this guards every other caller).
        validate_sampling(req.temperature, req.top_k, req.top_p)
        self.tracker = StopTextTracker(self.tokenizer, req.stop)
        self.stream_key = stream.stream_key(req.seed)
        plan = req.watermark
        self.spec: WatermarkSpec | None = plan.key.spec if plan else None
        self.keys = row_keys(plan.key if plan else None)
        if plan is None:
            width = 1
            self.dedup = ContextDeduper(width, "none", None)
        else:
            key = plan.key
            self.dedup = ContextDeduper(key.spec.context_width, key.spec.dedup, key.spec.dedup_max_history,
                                        prompt=req.prompt_ids)

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

    def routes(self) -> RouteCounts:
        c = self.counts
        return RouteCounts(key_a=c[ROUTE_KEY_A], key_b=c[ROUTE_KEY_B], plain=c[ROUTE_PLAIN], greedy=c[ROUTE_GREEDY])

    def emit(self, token: int, route: int) -> bool:
        """Take one sampled token; returns True when the request has finished. A failure
        here (detokenising, a stop string) fails this request only."""
        if self.finished:
            return True
        try:
            return self._emit(token, route)
        except Exception as exc:  # noqa: BLE001 - contained to this row, reported to its caller
            self.fail(exc)
            return True

    def emit_block(self, tokens: list[int], routes: list[int], defer: bool = False) -> bool:
        """Take several sampled tokens in order (a step's tokens for this request) with one
        Delta for all of them (detokenising once); returns True when the request has finished.
        Requests with stop strings take them one by one, so that the text ends at the token
        that completes a stop string.

        ``defer``: the tokens are taken (output, dedup history, EOS and length checks) but
        their text is detokenised and sent by :meth:`send_text`, which the engine calls
        while the GPU runs its next step (a finishing request sends at once; the events
        and their order are the same, one step later)."""
        if self.finished:
            return True
        if self.request.stop:
            return any(self.emit(token, route) for token, route in zip(tokens, routes))
        try:
            return self._emit_block(tokens, routes, defer)
        except Exception as exc:  # noqa: BLE001 - contained to this row, reported to its caller
            self.fail(exc)
            return True

    def send_text(self) -> None:
        """Send one Delta for the tokens taken by a deferred :meth:`emit_block`."""
        if not self.unsent or self.finished:
            return
        taken, self.unsent = self.unsent, []
        try:
            self.sink(Delta(text=self.tracker.push(taken), token_ids=tuple(taken), routes=self.routes()))
        except Exception as exc:  # noqa: BLE001 - contained to this row, reported to its caller
            self.fail(exc)

    def _emit_block(self, tokens: list[int], routes: list[int], defer: bool = False) -> bool:
        taken: list[int] = []
        reason = None
        for token, route in zip(tokens, routes):
            if token in self.eos_ids:
                reason = "stop"
                break
            self.output.append(token)
            self.counts[route] += 1
            self.dedup.push(token)
            self.last_token = token
            taken.append(token)
            if len(self.output) >= self.request.max_tokens:
                reason = "length"
                break
        self.unsent.extend(taken)
        if reason:
            return self.finish(reason)
        if not defer:
            self.send_text()
        return self.finished

    def fail(self, exc: BaseException) -> None:
        """End this request with an error (its caller gets an EngineFailure)."""
        if not self.finished:
            self.finished = True
            self.sink(exc)

    def _emit(self, token: int, route: int) -> bool:
        if token in self.eos_ids:
            return self.finish("stop")
        self.output.append(token)
        self.counts[route] += 1
        self.dedup.push(token)
        self.last_token = token
        self.sink(Delta(text=self.tracker.push([token]), token_ids=(token,), routes=self.routes()))
        if self.tracker.stopped:
            return self.finish("stop")
        if len(self.output) >= self.request.max_tokens:
            return self.finish("length")
        return False

    def finish(self, reason: str) -> bool:
        self.send_text()  # deferred text first
        if self.finished:
            return True
        self.finished = True
        rest = self.tracker.finish()
        if rest:
            self.sink(Delta(text=rest, token_ids=(), routes=self.routes()))
        self.sink(Finished(text=self.tracker.text, token_ids=tuple(self.output), finish_reason=reason,
                           prompt_tokens=len(self.request.prompt_ids), routes=self.routes(),
                           drafted_tokens=self.drafted, accepted_tokens=self.accepted))
        return True
