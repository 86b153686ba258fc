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
