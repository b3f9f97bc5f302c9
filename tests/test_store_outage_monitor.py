"""The outage monitor's rule: one warning per outage, closed only by a call that began after it opened.

A call that took its connection before the store went away can finish after the outage's first
failure (its answer was already on the way). Its success must not close the outage, or the next
failure of the same outage would open, and warn about, a second one.
"""

from __future__ import annotations

import time
from collections.abc import MutableMapping
from typing import Any

import structlog.testing

from activities.store import StoreUnavailable
from activities.store.outage import OutageMonitor


def _names(events: list[MutableMapping[str, Any]]) -> list[Any]:
    return [e["event"] for e in events if str(e["event"]).startswith("store_")]


def test_a_call_begun_before_the_outage_does_not_close_it() -> None:
    monitor = OutageMonitor("test")
    monitor.succeeded()  # the store was reached once: later failures are an outage
    before = time.monotonic()
    with structlog.testing.capture_logs() as events:
        monitor.failed(StoreUnavailable("down"), time.monotonic())
        monitor.succeeded(before)  # under way when the outage opened
        assert monitor.in_outage
        monitor.failed(StoreUnavailable("still down"), time.monotonic())
        monitor.succeeded(time.monotonic())  # began after the outage opened: the store is back
    assert not monitor.in_outage
    assert _names(events) == ["store_unavailable", "store_recovered"]
    [up] = [e for e in events if e["event"] == "store_recovered"]
    assert up["failed_calls"] == 2


def test_a_success_without_a_start_time_closes_the_outage() -> None:
    monitor = OutageMonitor("test")
    monitor.succeeded()
    with structlog.testing.capture_logs() as events:
        monitor.failed(StoreUnavailable("down"))
        monitor.succeeded()
    assert _names(events) == ["store_unavailable", "store_recovered"]
