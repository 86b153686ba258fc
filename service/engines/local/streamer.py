"""Requests' events, made off the step loop: detokenising and handing text over.

The step loop takes tokens (outputs.py) and posts them here with their requests; the
streamer turns them into each request's events: a Delta of its new tokens and text, then
its Finished. Threaded (the local engine on CUDA), a pass takes everything posted since
the last one and decodes every request with new tokens in one call of the Rust tokenizer
(stops.decode_many, which runs without the GIL), so the step loop's cost per block no
longer grows with the rows' text: detokenising 256 rows took 4 ms per block on the step
loop (H100, issue 33). A request's events keep their order: everything for one request
goes through the same queue; a pass gives a request one Delta for all its new tokens.

Requests with stop strings are detokenised on the step loop instead (RequestState.emit:
where their text stops decides where they stop); they post finished events here.

Inline (``threaded=False``: the CPU engine, a RequestState alone), each post is handled
at once on the caller's thread, so events leave as today: one Delta per take.

Threaded, the thread rests after each pass for ``rest_ratio`` times the pass's own length
(at most :data:`MAX_REST` seconds) before it takes the next messages: a pass costs about the
same Python per request whether it covers one block's tokens or several (a Delta, its text
window, its hand-over and the consumer's wake-up, per request), and every bit of it holds the
GIL the step loop needs to launch and take blocks (H100 at 256 rows: the step loop waited
2.2 ms a 4 ms block for the GIL, issue 33). Resting, the streamer holds the GIL at most
1 / (1 + rest_ratio) of the time and each request gets one Delta per few blocks at 256 rows
(a pass of ~1 ms: a Delta every ~5 ms), while at a few rows (a pass of tens of µs) it rests
a fraction of a millisecond: tokens still leave as they come. A request's end (its Finished,
a failure) cuts a rest short.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable, Protocol

import numpy as np

from service.engines.base import Delta, Finished, RouteCounts
from service.engines.stops import StopTextTracker, decode_many, windowed_decoding

log = logging.getLogger("hallmark.engine.local")

_TOKENS, _EVENT, _FINISH, _FAIL, _MARK = range(5)
REST_RATIO = 4.0
"""A threaded streamer rests this many times its last pass's length before the next (module docstring)."""
MAX_REST = 0.02
"""Seconds a threaded streamer rests at most between passes (a bound on the latency it adds)."""


class RequestState(Protocol):
    """What the streamer needs of a request (service.engines.local.request.RequestState):
    a protocol, so that the request module may import the streamer and not the reverse."""

    failed: bool
    tracker: StopTextTracker

    def sink(self, event) -> None: ...

    def fail_from_stream(self, exc: BaseException) -> None: ...


def route_counts(row) -> RouteCounts:
    """RouteCounts from a row of OutputTable.routes (ROUTE_GREEDY, PLAIN, KEY_A, KEY_B)."""
    return RouteCounts(key_a=int(row[2]), key_b=int(row[3]), plain=int(row[1]), greedy=int(row[0]))


class Streamer:
    def __init__(self, threaded: bool = False, after_pass: Callable[[], None] | None = None,
                 rest_ratio: float = REST_RATIO) -> None:
        self.threaded = threaded
        self.rest_ratio = rest_ratio
        self.after_pass = after_pass  # the engine's Outbox.flush: one hand-over per pass
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._urgent = threading.Event()  # a request ended or failed: cut the rest short
        self._thread: threading.Thread | None = None
        self.passes = 0
        self.rows_decoded = 0

    # ------------------------------------------------------------------ posting (any thread)

    def block(self, states: list[RequestState], index: np.ndarray, tokens: np.ndarray, taken: np.ndarray,
              routes: np.ndarray) -> None:
        """A block's new tokens: ``states[index[i]]`` took ``tokens[i, :taken[i]]``, and
        ``routes[i]`` are its route counts after them (OutputTable.routes). Neither the list
        nor the arrays may change afterwards (pass copies)."""
        self._post((_TOKENS, states, index, tokens, taken, routes))

    def tokens(self, state: RequestState, tokens: list[int], routes: RouteCounts) -> None:
        """One request's new tokens (taken one request at a time)."""
        self._post((_TOKENS, [state], None, [tokens], None, [routes]))

    def event(self, state: RequestState, event) -> None:
        """An event made by the step loop (a stop-string request's Delta), after what
        ``state`` posted before."""
        self._post((_EVENT, state, event))

    def finish(self, state: RequestState, finished: Finished) -> None:
        """The request's end: the rest of its text, then ``finished`` with its text (a
        resting thread wakes for it: a request's end is not kept waiting)."""
        self._post((_FINISH, state, finished))
        self._urgent.set()

    def fail(self, state: RequestState, exc: BaseException) -> None:
        self._post((_FAIL, state, exc))
        self._urgent.set()

    def _post(self, message) -> None:
        if not self.threaded:
            self._pass([message])
            return
        self._queue.put(message)
        if self._thread is None or not self._thread.is_alive():
            self._start()

    # ------------------------------------------------------------------ the thread

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hallmark-local-streamer", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until everything posted so far is handed over (True), or ``timeout``."""
        if not self.threaded:
            return True
        done = threading.Event()
        self._queue.put((_MARK, done))
        if self._thread is None or not self._thread.is_alive():
            self._start()
        return done.wait(timeout)

    def _run(self) -> None:
        while True:
            messages = [self._queue.get()]
            started = time.perf_counter()
            self._urgent.clear()  # before taking the rest: an end posted from now on wakes the rest
            while True:
                try:
                    messages.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._pass(messages)
            except Exception:  # noqa: BLE001 - a fault of this thread must not strand every request
                log.exception("the engine's streamer failed on a pass of %d messages", len(messages))
            if self.after_pass is not None:
                self.after_pass()
            marked = False
            for message in messages:
                if message[0] == _MARK:
                    message[1].set()
                    marked = True
            if self.rest_ratio > 0 and not marked:  # see the module docstring (a waiter is not kept waiting)
                self._urgent.wait(min(MAX_REST, self.rest_ratio * (time.perf_counter() - started)))

    # ------------------------------------------------------------------ a pass

    def _pass(self, messages: list) -> None:
        self.passes += 1
        new: dict[RequestState, list[int]] = {}
        routes: dict[RequestState, RouteCounts | np.ndarray] = {}
        finishing: list[tuple[RequestState, Finished]] = []
        for message in messages:
            kind = message[0]
            if kind == _TOKENS:
                _, states, index, tokens, taken, counts = message
                rows = tokens.tolist() if isinstance(tokens, np.ndarray) else tokens
                ns = [len(r) for r in rows] if taken is None else taken.tolist()
                if isinstance(counts, np.ndarray):  # Python ints once per block, not per row later
                    counts = counts.tolist()
                for i, b in enumerate(range(len(states)) if index is None else index.tolist()):
                    state = states[b]
                    if ns[i] and not state.failed:
                        new.setdefault(state, []).extend(rows[i][:ns[i]])
                        routes[state] = counts[i]
            elif kind == _MARK:
                continue
            elif kind == _FINISH:  # its last event: made at the end of the pass, its tokens' Delta first
                finishing.append((message[1], message[2]))
            else:
                state = message[1]
                if state in new:  # its tokens first
                    self._deltas({state: new.pop(state)}, routes)
                state.sink(message[2])
        if new:
            self._deltas(new, routes)
        if finishing:
            self._finish_all(finishing)

    def _deltas(self, new: dict, routes: dict) -> None:
        """One Delta per request for its new tokens, decoded together."""
        by_tokenizer: dict[int, list[RequestState]] = {}
        for state in new:
            state.tracker.token_ids.extend(new[state])
            by_tokenizer.setdefault(id(state.tracker.tokenizer), []).append(state)
        for states in by_tokenizer.values():
            self._decoded(states, new, routes)

    def _decoded(self, states: list[RequestState], new: dict, routes: dict) -> None:
        tokenizer = states[0].tracker.tokenizer
        windowed = windowed_decoding(tokenizer)
        texts = _decode(tokenizer, [w for s in states for w in s.tracker.windows()] if windowed
                        else [s.tracker.token_ids for s in states], pairs=windowed)
        self.rows_decoded += len(states)
        for state, text in zip(states, texts):
            if isinstance(text, BaseException):
                state.fail_from_stream(text)
                continue
            counts = routes[state]
            released = state.tracker.release_window(*text) if windowed else state.tracker.release(text)
            state.sink(Delta(text=released, token_ids=tuple(new[state]),
                             routes=counts if isinstance(counts, RouteCounts) else route_counts(counts)))

    def _finish_all(self, finishing: list[tuple[RequestState, Finished]]) -> None:
        """The rest of each request's text, then its Finished; windowed requests' text is
        their whole output's decode (one batched call for all of them)."""
        windowed = [s for s, _ in finishing if s.tracker.windowed and not s.failed]
        full: dict[RequestState, object] = {}
        by_tokenizer: dict[int, list[RequestState]] = {}
        for state in windowed:
            by_tokenizer.setdefault(id(state.tracker.tokenizer), []).append(state)
        for states in by_tokenizer.values():
            full.update(zip(states, _decode(states[0].tracker.tokenizer, [s.tracker.token_ids for s in states])))
        for state, finished in finishing:
            if state.failed:
                continue
            text = full.get(state)
            if isinstance(text, BaseException):
                state.fail_from_stream(text)
                continue
            if text is None:
                rest = state.tracker.finish()
            else:
                rest, agrees = state.tracker.finish_with(text)
                if not agrees:
                    log.warning("request text made in windows differs from its whole decode (tokenizer %s)",
                                type(state.tracker.tokenizer).__name__)
            if rest:
                state.sink(Delta(text=rest, token_ids=(), routes=finished.routes))
            state.sink(Finished(text=state.tracker.text, token_ids=finished.token_ids,
                                finish_reason=finished.finish_reason, prompt_tokens=finished.prompt_tokens,
                                routes=finished.routes, drafted_tokens=finished.drafted_tokens,
                                accepted_tokens=finished.accepted_tokens))


def _decode(tokenizer, sequences: list[list[int]], pairs: bool = False) -> list:
    """Each sequence's text (in one batched call), or, where that fails, each decoded alone
    with an exception in place of the text of any that does not decode (its request fails
    alone). ``pairs``: the texts two by two, as tuples (a tracker's two windows)."""
    try:
        texts = decode_many(tokenizer, sequences)
    except Exception:  # noqa: BLE001 - one request's tokens may not decode: find it, fail it alone
        texts = []
        for ids in sequences:
            try:
                texts.append(tokenizer.decode(list(ids), skip_special_tokens=True))
            except Exception as exc:  # noqa: BLE001
                texts.append(exc)
    if not pairs:
        return texts
    out = []
    for first, second in zip(texts[0::2], texts[1::2]):
        failed = first if isinstance(first, BaseException) else second
        out.append(failed if isinstance(failed, BaseException) else (first, second))
    return out
