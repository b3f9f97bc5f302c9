"""Waiting for an event in tests: poll until it happened, with one generous deadline.

Tests never sleep a fixed time to let something happen and never assert how long
something took (speed is measured under ``bench/``). They wait for the event
itself: :func:`eventually` polls a check until it returns something truthy and
fails with what was last seen when the deadline passes. The deadline only stops
a test that would otherwise hang; it is generous so that a busy machine is slow,
never wrong.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

DEADLINE_S = 90.0  # a hang guard, not a speed requirement: a loaded 2-core machine stays far inside it
EVERY_S = 0.05


class NeverHappened(AssertionError):
    """The awaited event did not happen before the deadline."""


@overload
async def eventually(
    check: Callable[[], Awaitable[T | None]], what: str, *, within_s: float = ..., every_s: float = ...
) -> T: ...


@overload
async def eventually(check: Callable[[], T | None], what: str, *, within_s: float = ..., every_s: float = ...) -> T: ...


async def eventually(
    check: Callable[[], Any],
    what: str,
    *,
    within_s: float = DEADLINE_S,
    every_s: float = EVERY_S,
) -> Any:
    """The first truthy value ``check()`` returns (awaited when it is a coroutine function).

    An ``AssertionError`` raised by ``check`` counts as "not yet"; the last one (or the last
    value seen) is quoted when the deadline passes, so a failure says what the test saw.
    """
    deadline = time.monotonic() + within_s
    last: object = None
    while True:
        try:
            value = check()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            last = value
        except AssertionError as exc:
            last = exc
        if time.monotonic() > deadline:
            raise NeverHappened(f"{what}: not within {within_s:g} s; last seen: {last!r}")
        await asyncio.sleep(every_s)


def eventually_sync(
    check: Callable[[], T | None], what: str, *, within_s: float = DEADLINE_S, every_s: float = EVERY_S
) -> T:
    """:func:`eventually` for code that runs in a thread (subprocess helpers)."""
    deadline = time.monotonic() + within_s
    last: object = None
    while True:
        try:
            value = check()
            if value:
                return value
            last = value
        except AssertionError as exc:
            last = exc
        if time.monotonic() > deadline:
            raise NeverHappened(f"{what}: not within {within_s:g} s; last seen: {last!r}")
        time.sleep(every_s)
