"""The detection gate's writes, committed in groups by one thread per gateway process.

Every tenant and public detection writes twice (its budgets and the probe guard before the
work, the tokens charged after it), and every expert detection writes its audit event. Each
was its own transaction on the event loop: on SQLite a commit is an fsync, and two worker
processes writing at once wait on each other through SQLite's busy handler, which sleeps up
to 100 ms at a time; the loop, and every request on it, waited too (measured with
`bench.detect_http --workers 2` and expert tokens: 172 req/s, p99 403 ms, against 256 req/s,
p99 239 ms for the same load through admin tokens, which write nothing).

Here a write is a function of a session, submitted to :class:`GroupCommit`, which runs the
writes waiting at that moment in one transaction, each in its own savepoint, and commits
once. The request awaits its write's future, so its answer still leaves only after its write
committed (an expert's audit event exists before the expert sees the result), while the loop
serves other requests. A write that raises (a budget used up, the probe guard refusing) rolls
back its own savepoint only and hands its exception to its own request; a failed commit
fails every write of the group, none of which then took effect. A write whose request was
cancelled while it waited still runs (a charge after the work is not escaped by hanging up);
its outcome goes nowhere, and the rest of its group is answered as usual.

A group holds each row it locks (a budget) until its commit, so two replicas' groups can
lock the same rows in opposite orders, which a single request's write never does (it locks
its budgets in one order): PostgreSQL then aborts one of the statements as a deadlock. A
write that lost such a race (ConcurrentChange), or whose whole group did, took no effect and
is run again alone, in its own transaction, up to :data:`RETRIES` times: a request never
gets an error that other requests' grouping caused.

Generation records (a stream's started, checkpoint and finished entries) go through a
second instance (``Services.ledger_writes``, service.generation), for the same reasons.
Their writes also say how to run many of them at once (``submit(write, batch=(run_many,
item))``): the group's writes with the same ``run_many`` run as one call in one savepoint
(ledger.grouped.append_many: the entries of 256 streams cost about as much as a few single
ones, where each entry alone cost ~10 ms of the ORM's per-statement work and so bounded
generation under many streams: bench/ledger_groups.py). If that call raises, each of its
writes runs alone as above, so a refused write still fails alone with its own error.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import Future, InvalidStateError
from typing import Any, Callable

from keys.db import translate_error
from keys.errors import ConcurrentChange

log = logging.getLogger("hallmark.access")

MAX_GROUP = 64
"""Writes committed together at most (bounds one transaction's length)."""
RETRIES = 3
"""Times a write that lost a race with another transaction (ConcurrentChange) is run again alone."""


class GroupCommit:
    """Runs submitted writes on one daemon thread, grouped into transactions of the store."""

    def __init__(self, store, *, max_group: int = MAX_GROUP, name: str = "detection") -> None:
        self.store = store
        self.name = name  # what the writes are, in log lines and the thread's name
        self.groups = 0  # groups run (transactions), and writes in them: how well writes are grouped
        self.writes = 0
        self.max_group = max_group
        self._queue: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self.batched = 0  # writes that ran as part of a batch (run_many)
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def submit(self, write: Callable[[Any], Any], batch: tuple[Callable[[Any, list], list], Any] | None = None
               ) -> Future:
        """Queue ``write(session)``; the future holds its result once the group committed,
        or its exception (its own, or the group's commit failure, as a KeyStoreError).
        ``batch``: (``run_many``, ``item``), where ``run_many(session, items)`` does the
        writes of ``items`` at once and returns their results in order, and ``write`` is
        this item's write alone."""
        future: Future = Future()
        self._queue.put((write, future, batch))
        if self._thread is None or not self._thread.is_alive():
            self._start()
        return future

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                # A forked worker (`hallmark serve --workers`) has no thread of its parent's.
                self._thread = threading.Thread(target=self._run, name=f"hallmark-{self.name}-writes", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            group = [self._queue.get()]
            while len(group) < self.max_group:
                try:
                    group.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self.groups += 1
            self.writes += len(group)
            try:
                self._commit(group)
            except BaseException as exc:  # noqa: BLE001 - a fault here must not strand the group's requests
                # The type only: a database error's text can quote the statement's parameters.
                log.error("the %s writes' thread failed on a group of %d: %s", self.name, len(group),
                          type(exc).__name__)
                for item in group:
                    if not item[1].done():
                        _resolve(item[1], False, exc)

    def _commit(self, group: list[tuple], attempt: int = 0) -> None:
        if len(group) == 1:  # a batchable write alone runs as its own write
            self._commit_one(group, attempt)
            return
        outcomes: list[tuple[Callable[[Any], Any], Future, bool, Any]] = []
        try:
            with self.store.transaction() as session:
                done = self._batches(session, group)
                for index, (write, future, _) in enumerate(group):
                    if index in done:
                        outcomes.append((write, future, True, done[index]))
                        continue
                    try:
                        with session.begin_nested():
                            outcomes.append((write, future, True, write(session)))
                    except Exception as exc:  # this write's own refusal or fault: its savepoint is gone
                        mapped = translate_error(exc, self.store.url)
                        outcomes.append((write, future, False, mapped if mapped is not None else exc))
        except BaseException as exc:  # the commit itself: nothing of the group took effect
            mapped = translate_error(exc, self.store.url)
            failure = mapped if mapped is not None else exc
            if isinstance(failure, ConcurrentChange) and attempt < RETRIES:
                self._again(group, attempt)
                return
            log.warning("a group of %d %s writes failed to commit: %s", len(group), self.name,
                        type(failure).__name__)
            for item in group:
                _resolve(item[1], False, failure)
            return
        lost = []
        for write, future, ok, value in outcomes:
            if not ok and isinstance(value, ConcurrentChange) and attempt < RETRIES:
                lost.append((write, future, None))
            else:
                _resolve(future, ok, value)
        if lost:
            self._again(lost, attempt)

    def _commit_one(self, group: list[tuple], attempt: int) -> None:
        """A group of one write: no savepoint (its refusal rolls back a transaction that holds
        nothing else), two statements and their bookkeeping fewer on the serial path (issue 31:
        the gate's cost on an expert's request is this one audit write)."""
        write, future, _ = group[0]
        try:
            with self.store.transaction() as session:
                value = write(session)
        except BaseException as exc:  # noqa: BLE001 - its own refusal, or the commit's failure: its request's
            mapped = translate_error(exc, self.store.url)
            failure = mapped if mapped is not None else exc
            if isinstance(failure, ConcurrentChange) and attempt < RETRIES:
                self._again(group, attempt)
                return
            _resolve(future, False, failure)
            return
        _resolve(future, True, value)

    def _batches(self, session, group: list[tuple]) -> dict[int, Any]:
        """Run the group's batchable writes, each ``run_many`` once over its items in one
        savepoint; by index in the group, the results of those that ran (none of a batch
        that raised: its writes then run alone)."""
        batches: dict[Callable, list[int]] = {}
        for index, (_, _, batch) in enumerate(group):
            if batch is not None:
                batches.setdefault(batch[0], []).append(index)
        done: dict[int, Any] = {}
        for run_many, indexes in batches.items():
            if len(indexes) < 2:
                continue
            try:
                with session.begin_nested():
                    results = run_many(session, [group[i][2][1] for i in indexes])
            except Exception as exc:  # noqa: BLE001 - some write of it is refused: each runs alone
                log.debug("a batch of %d %s writes ran one by one (%s)", len(indexes), self.name,
                          type(exc).__name__)
                continue
            done.update(zip(indexes, results))
            self.batched += len(indexes)
        return done

    def _again(self, writes: list[tuple], attempt: int) -> None:
        """Each of ``writes`` (none took effect) again, alone; the other transaction of the
        race has committed or is about to (a deadlock's survivor goes on once its victim aborts)."""
        time.sleep(0.005 * (attempt + 1))
        for item in writes:
            self._commit([item], attempt + 1)


def _resolve(future: Future, ok: bool, value: Any) -> None:
    """Hand ``future`` its write's outcome, unless its request was cancelled meanwhile (its
    awaiting task cancelled the future): the write ran all the same, and the group's other
    futures must still be resolved, so a cancelled one is never an error here."""
    try:
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
    except InvalidStateError:  # cancelled: nobody waits for this outcome
        pass


in_flight: Callable[[], int] | None = None
"""How many HTTP requests this process is serving now, those not yet started included: set by
`hallmark serve` (uvicorn's own count, service.cli.serve); None where the app is served
otherwise (tests, embedding), where :class:`Held` then knows only the requests it counts."""


class Held:
    """Batchable writes of one kind (an expert's audit event) held on the event loop while
    other requests are in flight, then submitted to ``writes`` as one write,
    ``run_many(session, items)``: one transaction, one statement and one commit (an fsync on
    SQLite) for the lot, instead of one each.

    A request counts itself in (:meth:`enter`) before it queues for its work and out
    (:meth:`leave`) once its write is added. The held writes go once no other request is in
    flight (neither one counted in nor, where the server says (:data:`in_flight`), one it has
    received and not yet started; so a lone request never waits), when ``most`` are held, or
    ``linger`` seconds after the first was held. Under load (the loop busy with one request's
    detection after another) that is one commit per ``linger``, and the wait costs no
    throughput: the loop runs the next request meanwhile. Measured (a SQLite store, this
    2-core machine): an audit write alone cost ~1 ms of CPU (the writes' thread's Python work
    and the commit's, each taking the interpreter from the loop), 0.13 ms each in eights.
    Every request still gets its own outcome only once its row committed. Event-loop only
    (no locks): :meth:`add`, :meth:`enter` and :meth:`leave` run on the loop."""

    def __init__(self, writes: GroupCommit, run_many: Callable[[Any, list], list], *, linger: float = 0.02,
                 most: int = MAX_GROUP) -> None:
        self.writes, self.run_many, self.linger, self.most = writes, run_many, linger, most
        self.busy = 0
        self.waiting = 0  # requests whose write is held or submitted and not yet committed
        self.flushes = 0  # writes submitted, and items in them: how well they were held together
        self.items = 0
        self._held: list[tuple[Any, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None

    def enter(self) -> None:
        self.busy += 1

    def leave(self) -> None:
        self.busy -= 1
        if self._held and not self._others():
            self.flush()

    def _others(self) -> bool:
        """Whether another request is in flight that may add a write soon."""
        if self.busy > 0:
            return True
        # The server's requests, less those waiting for this class's writes (they add none).
        return in_flight is not None and in_flight() > self.waiting

    def add(self, item: Any) -> asyncio.Future:
        """Hold ``item``; the future holds its ``run_many`` result once committed (or the
        write's exception, as :meth:`GroupCommit.submit` hands it)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._held.append((item, future))
        self.waiting += 1
        if len(self._held) >= self.most or not self._others():
            self.flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.linger, self.flush)
        return future

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held, self._held = self._held, []
        if not held:
            return
        self.flushes += 1
        self.items += len(held)
        items = [item for item, _ in held]
        loop = asyncio.get_running_loop()
        done = self.writes.submit(lambda session: self.run_many(session, items))

        def settled(outcome: Future) -> None:
            try:
                loop.call_soon_threadsafe(self._hand_out, outcome, held)
            except RuntimeError:  # the loop closed meanwhile (shutdown): nobody waits any more
                pass

        done.add_done_callback(settled)

    def _hand_out(self, outcome: Future, held: list[tuple[Any, asyncio.Future]]) -> None:
        """Each held item's own result, or the write's exception (a request that left
        meanwhile, its future cancelled, gets nothing: its row committed all the same)."""
        self.waiting -= len(held)
        error = outcome.exception()
        results = None if error is not None else outcome.result()
        for index, (_, future) in enumerate(held):
            if future.done():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(results[index])
