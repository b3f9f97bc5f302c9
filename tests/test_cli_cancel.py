"""Ctrl-C reaches a CLI loop that polls the server even when it lands in an RPC.

The SDK turns the cancellation of a call in flight into ``RPCTimeoutOrCancelledError``. A handler
that took it for a slow server used to swallow Ctrl-C: asyncio cancels every task on exit and
waits for them, and a polling loop went on for good (``run --follow`` and ``chat`` hung on a
loaded machine). ``raise_if_cancelled`` first in each such handler gives the cancellation back.
"""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import RPCTimeoutOrCancelledError

from durable_agents.cli.common import raise_if_cancelled


async def rpc() -> None:
    """A call the SDK makes: its cancellation comes out as ``RPCTimeoutOrCancelledError``."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        raise RPCTimeoutOrCancelledError("cancelled") from None


async def test_a_polling_loop_ends_when_cancelled_inside_an_rpc() -> None:
    polls = 0

    async def poll() -> None:
        nonlocal polls
        while True:
            polls += 1
            try:
                await rpc()
            except RPCTimeoutOrCancelledError:
                raise_if_cancelled()  # without it: the next poll, forever
            await asyncio.sleep(0)

    task = asyncio.ensure_future(poll())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=30)  # a hang guard
    assert polls == 1


async def test_a_slow_server_is_still_an_error_the_handler_takes() -> None:
    async def one() -> str:
        try:
            async with asyncio.timeout(0.01):
                await rpc()
        except (RPCTimeoutOrCancelledError, TimeoutError):
            raise_if_cancelled()  # a timeout of our own is not a cancellation of the command
            return "no answer"
        return "answer"

    assert await one() == "no answer"
