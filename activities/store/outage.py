"""One warning per store outage, not one per failed call.

Each store instance (one per worker process) owns an ``OutageMonitor``. The first call that fails
with ``StoreUnavailable`` opens an outage and logs ``store_unavailable`` (a warning); later failures
are only counted. The first call that started after the outage opened and succeeds closes it and logs
``store_recovered`` (info) with how long it lasted and how many calls failed meanwhile. A call that was
already under way when the outage opened proves nothing about the store now (it may have had its answer
before the store went away), so its success leaves the outage open.
"""

from __future__ import annotations

import threading
import time

import structlog

log = structlog.get_logger("activities.store")


class OutageMonitor:
    def __init__(self, store: str) -> None:
        self._store = store
        self._lock = threading.Lock()  # the SQLite store reports from its worker threads too
        self._since: float | None = None  # time.monotonic() of the outage's first failure
        self._opened = 0.0  # time.monotonic() when that failure was reported
        self._failed = 0
        self._reached = False  # a call has succeeded since the process started

    @property
    def in_outage(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException, began: float | None = None) -> None:
        """A call failed because the store is unavailable; ``began`` is when it started (``time.monotonic()``).

        The outage is taken to have begun when its first failed call did (a call may wait seconds
        for a connection before it fails).
        """
        if not self._reached:
            # Never reached since the process started: a configuration problem (the worker's start-up check
            # says so in its one line), not an outage of a store that was working.
            log.debug("store_unreachable", store=self._store, error_type=type(exc).__name__)
            return
        with self._lock:
            self._failed += 1
            if self._since is not None:
                return
            self._opened = time.monotonic()
            self._since = began if began is not None else self._opened
        log.warning("store_unavailable", store=self._store, error_type=type(exc).__name__, error=str(exc)[:300])

    def succeeded(self, began: float | None = None) -> None:
        """A call reached the store (cheap when there is no outage); ``began`` is when it started.

        It ends an outage only if it began after the outage opened (or ``began`` is not given).
        """
        self._reached = True
        if self._since is None:
            return
        with self._lock:
            if self._since is None or (began is not None and began < self._opened):
                return
            since, failed = self._since, self._failed
            self._since, self._failed = None, 0
        log.info("store_recovered", store=self._store, outage_s=round(time.monotonic() - since, 2), failed_calls=failed)
