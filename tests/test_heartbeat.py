"""``heartbeating``: beats every interval from the first, and none at all for a block shorter than that."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.testing import ActivityEnvironment

from activities.heartbeat import heartbeating


def _counting(beats: list[Any], enough: asyncio.Event, wanted: int) -> ActivityEnvironment:
    env = ActivityEnvironment()

    def on_heartbeat(*details: Any) -> None:
        beats.append(details)
        if len(beats) >= wanted:
            enough.set()

    env.on_heartbeat = on_heartbeat
    return env


async def test_a_block_over_before_the_interval_sends_no_heartbeat() -> None:
    """Each heartbeat is a call to the server: a model turn or tool call that is quickly over makes none."""
    beats: list[Any] = []

    async def quick() -> int:
        async with heartbeating(30):
            for _ in range(20):  # the block awaits (as a store call does): the beat task gets to run
                await asyncio.sleep(0)
        return len(beats)

    assert await _counting(beats, asyncio.Event(), 1).run(quick) == 0


async def test_a_longer_block_beats_every_interval() -> None:
    beats: list[Any] = []
    enough = asyncio.Event()

    async def slow() -> int:
        async with heartbeating(0.05):
            await enough.wait()  # the third beat ends the block
        return len(beats)

    assert await _counting(beats, enough, 3).run(slow) >= 3
