"""The engine's outbox (service/engines/local/outbox.py): a step's events reach each
request's queue in order, with one event-loop wake-up per flush."""

from __future__ import annotations

import asyncio

from service.engines.local.outbox import Outbox


def _counting_loop() -> tuple[asyncio.AbstractEventLoop, list]:
    """A new event loop and the list of the wake-ups handed to it from other threads."""
    loop = asyncio.new_event_loop()
    wakeups = []
    original = loop.call_soon_threadsafe

    def counting(callback, *args):
        wakeups.append(callback)
        return original(callback, *args)

    loop.call_soon_threadsafe = counting
    return loop, wakeups


def test_events_arrive_in_order_with_one_wake_up_per_flush():
    loop, wakeups = _counting_loop()
    outbox = Outbox()
    queues = [asyncio.Queue(), asyncio.Queue()]
    sinks = [outbox.sink(loop, q) for q in queues]
    for i in range(3):
        sinks[0](("a", i))
        sinks[1](("b", i))
    assert wakeups == []  # nothing handed over before the flush
    outbox.flush()
    outbox.flush()  # nothing pending: no wake-up
    assert len(wakeups) == 1
    loop.run_until_complete(asyncio.sleep(0))
    assert [queues[0].get_nowait() for _ in range(3)] == [("a", 0), ("a", 1), ("a", 2)]
    assert [queues[1].get_nowait() for _ in range(3)] == [("b", 0), ("b", 1), ("b", 2)]
    loop.close()


def test_a_closed_loop_drops_its_events():
    loop = asyncio.new_event_loop()
    outbox = Outbox()
    sink = outbox.sink(loop, asyncio.Queue())
    loop.close()
    sink("event")
    outbox.flush()  # no exception: nobody is listening any more


def test_a_busy_loop_gets_one_merged_delta_per_request():
    """Events put while a delivery waits for the loop join it; a request's consecutive
    Deltas become one (text and token ids in order, the latest route counts); anything else
    (a Finished, an error) stays in place, after them."""
    from service.engines.base import Delta, Finished, RouteCounts

    loop, wakeups = _counting_loop()
    outbox = Outbox()
    queue = asyncio.Queue()
    sink = outbox.sink(loop, queue)
    sink(Delta(text="a", token_ids=(1,), routes=RouteCounts(key_a=1)))
    outbox.flush()
    sink(Delta(text="b", token_ids=(2, 3), routes=RouteCounts(key_a=3)))  # the loop has not run yet
    outbox.flush()
    done = Finished(text="ab", token_ids=(1, 2, 3), finish_reason="length", prompt_tokens=1,
                    routes=RouteCounts(key_a=3))
    sink(done)
    sink(Delta(text="", token_ids=(), routes=RouteCounts(key_a=3)))
    outbox.flush()
    assert len(wakeups) == 1
    loop.run_until_complete(asyncio.sleep(0))
    events = [queue.get_nowait() for _ in range(queue.qsize())]
    assert events == [Delta(text="ab", token_ids=(1, 2, 3), routes=RouteCounts(key_a=3)), done,
                      Delta(text="", token_ids=(), routes=RouteCounts(key_a=3))]
    sink(Delta(text="c", token_ids=(4,)))
    outbox.flush()  # delivered: the next flush wakes the loop again
    assert len(wakeups) == 2
    loop.run_until_complete(asyncio.sleep(0))
    assert queue.get_nowait() == Delta(text="c", token_ids=(4,))
    loop.close()
