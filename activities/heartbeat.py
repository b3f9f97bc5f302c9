"""Heartbeat while an activity waits, so a dead worker is noticed at heartbeat timeout.

Without it Temporal only notices a killed worker when start-to-close runs out
(minutes for a model call); with it, the retry starts within the heartbeat timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import structlog
from temporalio import activity

from activities.store.base import StoreUnavailable

T = TypeVar("T")
log = structlog.get_logger("activities.heartbeat")


@contextlib.asynccontextmanager
async def heartbeating(every_s: float, on_beat: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[None]:
    """Heartbeat every ``every_s`` seconds inside the block, the first after ``every_s`` (and await ``on_beat``
    each time).

    A failing ``on_beat`` (the ledger lease renewal while the store restarts) is logged and
    tried again on the next beat: heartbeats never stop because of it, and its error never
    replaces the block's own result. ``on_beat`` runs beside the heartbeats, not in their way:
    one that hangs (a store call waiting for a connection during an outage) delays no heartbeat,
    and the beats that come while it is still running do not start another.
    A no-op when ``every_s <= 0``.
    """
    if every_s <= 0:
        yield
        return

    async def callback() -> None:
        assert on_beat is not None
        try:
            await on_beat()
        except Exception as exc:
            log.warning("heartbeat_callback_failed", error_type=type(exc).__name__, error=str(exc)[:300])

    pending: asyncio.Task[None] | None = None

    async def beat() -> None:
        nonlocal pending
        while True:
            # The first beat comes after ``every_s``, not at once: each is a call to the server, and most blocks
            # (a model turn, a tool call) are over long before the server could miss one.
            await asyncio.sleep(every_s)
            activity.heartbeat()
            if on_beat is not None and (pending is None or pending.done()):
                pending = asyncio.create_task(callback())

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pending


async def persistently(
    what: str,
    operation: Callable[[], Awaitable[T]],
    *,
    first_delay_s: float = 0.2,
    max_delay_s: float = 5.0,
    heartbeat: bool = True,
) -> T:
    """Await ``operation`` until it succeeds, backing off between failures (and heartbeating).

    For writes that must not be lost once a side effect happened, such as recording its
    outcome: the activity's own timeout (or cancellation) is what finally stops it.
    """
    delay = first_delay_s
    attempt = 1
    while True:
        try:
            return await operation()
        except StoreUnavailable as exc:
            # The store's outage monitor logs the outage once; each retry of it is not news.
            log.debug("store_write_retrying", what=what, attempt=attempt, error=str(exc)[:300])
        except Exception as exc:
            log.warning(
                "store_write_retrying", what=what, attempt=attempt, error_type=type(exc).__name__, error=str(exc)[:300]
            )
        if heartbeat:
            with contextlib.suppress(RuntimeError):  # outside an activity (tests, scripts)
                activity.heartbeat()
        await asyncio.sleep(delay)
        delay = min(max_delay_s, delay * 2)
        attempt += 1
