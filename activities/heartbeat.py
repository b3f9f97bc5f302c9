"""Heartbeat while an activity waits, so a dead worker is noticed at heartbeat timeout.

Without it Temporal only notices a killed worker when start-to-close runs out
(minutes for a model call); with it, the retry starts within the heartbeat timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from temporalio import activity


@contextlib.asynccontextmanager
async def heartbeating(every_s: float, on_beat: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[None]:
    """Heartbeat every ``every_s`` seconds inside the block (and await ``on_beat`` each time).

    A no-op when ``every_s <= 0``.
    """
    if every_s <= 0:
        yield
        return

    async def beat() -> None:
        while True:
            activity.heartbeat()
            if on_beat is not None:
                await on_beat()
            await asyncio.sleep(every_s)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
