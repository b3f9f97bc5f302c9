"""Deltas in the SQLite run store's file: a connection of its own; readers poll (SQLite has no notifications).

Appends of one file are serialised by ``BEGIN IMMEDIATE`` (SQLite's one write lock, across processes), so
a run's sequence numbers are given and committed in order and a reader never skips one.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from activities.store.base import StoreUnavailable
from activities.store.schema import SQLITE_SCHEMA
from activities.store.sqlite import BUSY_TIMEOUT_S, is_busy
from activities.streaming.base import MAX_ROWS_PER_RUN, READ_LIMIT, Delta, DeltaSealer, delta_of

T = TypeVar("T")
POLL_S = 0.05  # how often a waiting reader looks again


class SQLiteDeltaChannel:
    def __init__(
        self, path: str | Path, sealer: DeltaSealer | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.sealer = sealer or DeltaSealer(None)
        self.clock = clock
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, check_same_thread=False, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA secure_delete=ON")  # an erased run's text is overwritten, not left in a page
            self._conn.executescript(SQLITE_SCHEMA)
        except sqlite3.OperationalError as exc:
            self._conn.close()
            raise self._error(exc) from None

    def _error(self, exc: sqlite3.OperationalError) -> Exception:
        if is_busy(exc):
            return StoreUnavailable(f"the SQLite run store {self.path} is locked by another connection: {exc}")
        return exc

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        def locked() -> T:
            with self._lock:
                return fn(*args)

        try:
            return await asyncio.to_thread(locked)
        except sqlite3.OperationalError as exc:
            raise self._error(exc) from None

    def _append(self, workflow_id: str, turn: int, attempt: int, restart: bool, text: str) -> int:
        c = self._conn
        c.execute("BEGIN IMMEDIATE")
        try:
            row = c.execute("SELECT MAX(seq) FROM stream_deltas WHERE workflow_id = ?", (workflow_id,)).fetchone()
            seq = int(row[0] or 0) + 1
            c.execute(
                "INSERT INTO stream_deltas (workflow_id, seq, turn, attempt, restart, text, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (workflow_id, seq, turn, attempt, int(restart), self.sealer.seal(workflow_id, text), self.clock()),
            )
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")
        return seq

    async def append(self, workflow_id: str, turn: int, attempt: int, restart: bool, text: str) -> int:
        return await self._run(self._append, workflow_id, turn, attempt, restart, text)

    def _read(self, workflow_id: str, after_seq: int, limit: int) -> list[Delta]:
        rows = self._conn.execute(
            "SELECT seq, turn, attempt, restart, text, created_at FROM stream_deltas"
            " WHERE workflow_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (workflow_id, after_seq, max(1, min(limit, READ_LIMIT))),
        ).fetchall()
        return [delta_of(workflow_id, row, self.sealer) for row in rows]

    async def read(self, workflow_id: str, after_seq: int, limit: int = READ_LIMIT) -> list[Delta]:
        return await self._run(self._read, workflow_id, after_seq, limit)

    def _last(self, workflow_id: str) -> int:
        row = self._conn.execute("SELECT MAX(seq) FROM stream_deltas WHERE workflow_id = ?", (workflow_id,)).fetchone()
        return int(row[0] or 0)

    async def wait(self, workflow_id: str, after_seq: int, timeout_s: float) -> None:
        deadline = time.monotonic() + max(0.0, timeout_s)
        while await self._run(self._last, workflow_id) <= after_seq:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(POLL_S, left))

    def _listen(self, workflow_id: str, until: float) -> None:
        self._conn.execute(
            "INSERT INTO stream_listeners (workflow_id, until) VALUES (?, ?)"
            " ON CONFLICT (workflow_id) DO UPDATE SET until = MAX(until, excluded.until)",
            (workflow_id, until),
        )

    async def listen(self, workflow_id: str, ttl_s: float = 20.0) -> None:
        await self._run(self._listen, workflow_id, self.clock() + ttl_s)

    def _listening(self, workflow_id: str, now: float) -> bool:
        row = self._conn.execute(
            "SELECT 1 FROM stream_listeners WHERE workflow_id = ? AND until > ?", (workflow_id, now)
        ).fetchone()
        return row is not None

    async def listening(self, workflow_id: str) -> bool:
        return await self._run(self._listening, workflow_id, self.clock())

    def _prune(self, workflow_id: str, before_turn: int, older_than: float) -> int:
        c = self._conn
        gone = c.execute(
            "DELETE FROM stream_deltas WHERE workflow_id = ? AND turn < ? AND created_at < ?",
            (workflow_id, before_turn, older_than),
        ).rowcount
        gone += c.execute(
            "DELETE FROM stream_deltas WHERE workflow_id = ? AND seq <= ?",
            (workflow_id, self._last(workflow_id) - MAX_ROWS_PER_RUN),
        ).rowcount
        return int(gone)

    async def prune(self, workflow_id: str, before_turn: int, older_than: float) -> int:
        return await self._run(self._prune, workflow_id, before_turn, older_than)

    def _expire(self, older_than: float) -> int:
        self._conn.execute("DELETE FROM stream_listeners WHERE until < ?", (older_than,))
        return int(self._conn.execute("DELETE FROM stream_deltas WHERE created_at < ?", (older_than,)).rowcount)

    async def expire(self, older_than: float) -> int:
        return await self._run(self._expire, older_than)

    def _delete(self, workflow_id: str) -> int:
        self._conn.execute("DELETE FROM stream_listeners WHERE workflow_id = ?", (workflow_id,))
        return int(self._conn.execute("DELETE FROM stream_deltas WHERE workflow_id = ?", (workflow_id,)).rowcount)

    async def delete(self, workflow_id: str) -> int:
        return await self._run(self._delete, workflow_id)

    def _count(self, workflow_id: str) -> int:
        row = self._conn.execute("SELECT COUNT(*) FROM stream_deltas WHERE workflow_id = ?", (workflow_id,)).fetchone()
        return int(row[0])

    async def count(self, workflow_id: str) -> int:
        return await self._run(self._count, workflow_id)

    async def close(self) -> None:
        await self._run(self._conn.close)
