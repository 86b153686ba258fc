"""The fair lane (service/access/lanes.py): one detection per principal at a time, the rest
waiting in turn, a bounded queue; other principals are never behind it. Order and refusals
only: timing belongs to bench/detect_flood.py."""

from __future__ import annotations

import asyncio

import pytest

from service.access.lanes import Lanes
from service.errors import RateLimited


def test_one_detection_per_principal_at_a_time_and_others_never_wait_behind_it():
    async def scenario():
        lanes, running, log = Lanes(queue=3), {"a": 0}, []
        gate = asyncio.Event()

        async def detect(principal: str, name: str) -> str:
            async with lanes.turn(principal):
                if principal == "a":
                    running["a"] += 1
                    assert running["a"] == 1  # never two of one principal at once
                    await gate.wait()
                    running["a"] -= 1
                log.append(name)
                return name

        flood = [asyncio.create_task(detect("a", f"a{i}")) for i in range(4)]
        await asyncio.sleep(0)
        # B's check passes while A's first holds its lane and three more of A's wait.
        assert await asyncio.wait_for(detect("b", "b0"), 1) == "b0"
        with pytest.raises(RateLimited):  # a fifth of A's: the queue (3) is full
            await detect("a", "a4")
        gate.set()
        await asyncio.gather(*flood)
        assert log == ["b0", "a0", "a1", "a2", "a3"]

    asyncio.run(scenario())


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _hold(lanes: Lanes, principal: str, entered: asyncio.Event, release: asyncio.Event) -> None:
    async with lanes.turn(principal):
        entered.set()
        await release.wait()


async def _spend(lanes: Lanes, clock: _Clock, principal: str, seconds: float) -> None:
    """A turn of ``principal`` that held its lane ``seconds`` (of the fake clock)."""
    async with lanes.turn(principal):
        clock.now += seconds


def test_use_is_the_share_of_recent_time_a_lane_was_held():
    async def scenario():
        clock = _Clock()
        lanes = Lanes(clock=clock, window=2.0)
        assert lanes.use("a") == 0.0
        await _spend(lanes, clock, "a", 0.2)  # one detection of 0.2 s: within its share
        assert 0.05 < lanes.use("a") < 0.2 and not lanes.over_share("a")
        for _ in range(10):  # a stream, back to back: over it
            await _spend(lanes, clock, "a", 0.3)
        assert lanes.use("a") > 0.75 and lanes.over_share("a")  # 3.2 s held: 1 - e^-1.6
        clock.now += 10  # then quiet: within it again
        assert not lanes.over_share("a")

    asyncio.run(scenario())


def test_an_over_share_principal_waits_while_another_principals_check_is_in_flight():
    async def scenario():
        clock = _Clock()
        lanes = Lanes(clock=clock, defer_max=60)
        await _spend(lanes, clock, "flood", 5.0)
        assert lanes.over_share("flood")
        b_in, b_out, a_in, a_out = asyncio.Event(), asyncio.Event(), asyncio.Event(), asyncio.Event()
        b = asyncio.create_task(_hold(lanes, "victim", b_in, b_out))
        await asyncio.wait_for(b_in.wait(), 5)
        a = asyncio.create_task(_hold(lanes, "flood", a_in, a_out))
        while not lanes.deferred:  # the flood's turn reached its wait
            await asyncio.sleep(0)
        assert not a_in.is_set()
        b_out.set()  # the victim's check ends: the flood goes on
        await asyncio.wait_for(a_in.wait(), 5)
        a_out.set()
        await asyncio.gather(a, b)
        # A principal within its share never waits for others.
        c_in, c_out = asyncio.Event(), asyncio.Event()
        b_in.clear()
        b_out.clear()
        b = asyncio.create_task(_hold(lanes, "victim", b_in, b_out))
        await asyncio.wait_for(b_in.wait(), 5)
        await asyncio.wait_for(_hold(lanes, "other", c_in, _set(c_out)), 5)
        assert lanes.deferred == 1
        b_out.set()
        await b

    asyncio.run(scenario())


def _set(event: asyncio.Event) -> asyncio.Event:
    event.set()
    return event


def test_an_over_share_principal_is_never_starved():
    async def scenario():
        clock = _Clock()
        lanes = Lanes(clock=clock, defer_max=0.01)
        await _spend(lanes, clock, "flood", 5.0)
        b_in, b_out, a_in = asyncio.Event(), asyncio.Event(), asyncio.Event()
        b = asyncio.create_task(_hold(lanes, "victim", b_in, b_out))
        await asyncio.wait_for(b_in.wait(), 5)
        # Others' checks in flight all the time: the flood's turn still comes (after defer_max).
        await asyncio.wait_for(_hold(lanes, "flood", a_in, _set(asyncio.Event())), 5)
        assert a_in.is_set() and lanes.deferred == 1
        b_out.set()
        await b

    asyncio.run(scenario())


def test_a_turn_that_began_within_its_share_never_waits_for_others_midway():
    async def scenario():
        clock = _Clock()
        lanes = Lanes(clock=clock, defer_max=60)
        b_in, b_out = asyncio.Event(), asyncio.Event()
        async with lanes.turn("long"):
            b = asyncio.create_task(_hold(lanes, "victim", b_in, b_out))
            await asyncio.wait_for(b_in.wait(), 5)
            clock.now += 5.0  # its own detection ran long: over its share now
            assert lanes.over_share("long")
            await asyncio.wait_for(lanes.defer("long"), 5)  # goes on (the core's check, gate._core)
        assert lanes.deferred == 0
        b_out.set()
        await b

    asyncio.run(scenario())


def test_a_turn_says_whether_it_may_detect_on_the_loop():
    """The route detects a contending over-share principal's small bodies off the event loop;
    a principal alone keeps the loop (no one to delay)."""
    async def scenario():
        clock = _Clock()
        lanes = Lanes(clock=clock)
        async with lanes.turn("a") as inline:
            assert inline is True  # a first detection
            clock.now += 5.0  # held its lane 5 s
        assert lanes.over_share("a")
        async with lanes.turn("a") as inline:
            assert inline is True  # a stream, but alone: nobody waits behind it
        async with lanes.turn("b") as inline:
            assert inline is True  # another principal, within its share
        async with lanes.turn("a") as inline:
            assert inline is False  # a stream while b is active: off the loop
        clock.now += 20
        async with lanes.turn("a") as inline:
            assert inline is True  # quiet since: within its share again
        async with lanes.turn("c") as inline:
            assert inline is True
        clock.now += lanes.window
        async with lanes.turn("a") as inline:
            clock.now += 5.0  # a stream again
        assert lanes.over_share("a")
        async with lanes.turn("a") as inline:
            assert inline is True  # c's turn began 7 s ago: nobody lately to delay

    asyncio.run(scenario())


def test_the_gateways_lanes_take_the_settings_and_out_of_range_settings_are_refused(monkeypatch):
    from pydantic import ValidationError

    from service.access import gate
    from service.access.lanes import DEFER_MAX, SHARE, WINDOW
    from service.settings import ServiceSettings

    default = gate._lanes(ServiceSettings())
    assert (default.share, default.window, default.defer_max) == (SHARE, WINDOW, DEFER_MAX)
    monkeypatch.setenv("HALLMARK_DETECT_FAIR_SHARE", "0.3")
    monkeypatch.setenv("HALLMARK_DETECT_DEFER_MAX_S", "0.2")
    chosen = gate._lanes(ServiceSettings(detect_fair_window_s=4.0, detect_queue=5))
    assert (chosen.share, chosen.window, chosen.defer_max, chosen.queue) == (0.3, 4.0, 0.2, 5)
    for bad in ({"detect_fair_share": 0}, {"detect_fair_share": 1.5}, {"detect_fair_window_s": 0},
                {"detect_defer_max_s": -1}, {"detect_worker_nice": 20}, {"detect_worker_nice": -1},
                {"detect_parse_inline_bytes": -1}):
        with pytest.raises(ValidationError):
            ServiceSettings(**bad)
