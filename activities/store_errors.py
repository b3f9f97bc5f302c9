"""Run-store outages inside activities: a retryable ``StoreUnavailable`` failure that backs off.

``store_guarded`` wraps the body of every activity that uses the run store (the tool activities and
the ``mcp`` activity through ``run_invocation``, ``model``, ``run_config``, ``transcript_append``,
``compensate``). A ``StoreUnavailable`` escaping the body fails the attempt with
``ApplicationError(type="StoreUnavailable", message="the run store is unavailable: ...")``:

- retryable, so Temporal retries the activity (within its retry policy's attempts);
- with ``next_retry_delay`` backing off from 2 s to 30 s by attempt, so retries do not hammer a
  store that is down (this overrides the policy's interval, not its attempt count);
- of category BENIGN, so the SDK logs the failed attempt at DEBUG without a traceback: the store's
  ``OutageMonitor`` already logged the outage once (``store_unavailable``), and will log
  ``store_recovered``.

Activities that do not wrap their body still fail retryably: the SDK turns the exception into an
``ApplicationError`` of type ``StoreUnavailable`` (without the backoff).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import ParamSpec, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from activities.store.base import StoreUnavailable

STORE_UNAVAILABLE = "StoreUnavailable"  # the ApplicationError type
FIRST_RETRY_DELAY_S = 2.0
MAX_RETRY_DELAY_S = 30.0

P = ParamSpec("P")
T = TypeVar("T")


def retry_delay(attempt: int) -> timedelta:
    """2 s after the first attempt, doubling, at most 30 s."""
    return timedelta(seconds=min(MAX_RETRY_DELAY_S, FIRST_RETRY_DELAY_S * 2 ** max(0, attempt - 1)))


def store_unavailable_error(exc: StoreUnavailable) -> ApplicationError:
    try:
        attempt = activity.info().attempt
    except RuntimeError:  # outside an activity
        attempt = 1
    return ApplicationError(
        f"the run store is unavailable: {exc}",
        type=STORE_UNAVAILABLE,
        next_retry_delay=retry_delay(attempt),
        category=ApplicationErrorCategory.BENIGN,
    )


def store_guarded(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Turn a ``StoreUnavailable`` out of ``fn`` into the retryable, backing-off ``StoreUnavailable`` failure."""

    @functools.wraps(fn)
    async def guarded(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except StoreUnavailable as exc:
            raise store_unavailable_error(exc) from None

    return guarded
