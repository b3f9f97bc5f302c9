"""Deltas in the PostgreSQL run store's database; readers are woken by ``NOTIFY``.

Connections come from a ``PostgresRunStore`` of its own (same URL), which migrates the schema on first use.
An append takes a per-run advisory lock for its transaction, so a run's sequence numbers commit in order
(a reader reading "after 7" never misses an 8 that commits late), and notifies ``CHANNEL`` with the
workflow id. Each channel holds at most one more connection, the one that ``LISTEN``s, opened by the first
``wait``; while it is down, waits fall back to polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import psycopg

from activities.store.postgres import PostgresRunStore
from activities.streaming.base import MAX_ROWS_PER_RUN, READ_LIMIT, Delta, DeltaSealer, delta_of

CHANNEL = "agent_stream_deltas"
POLL_S = 0.5  # while the listening connection is down
_LOCK_SPACE = 0x5354  # advisory-lock key space of appends ("ST"), apart from the migrations' lock


class PostgresDeltaChannel:
    def __init__(self, url: str, sealer: DeltaSealer | None = None, clock: Callable[[], float] = time.time) -> None:
        self._url = url
        self._db = PostgresRunStore(url, min_size=1, max_size=4)
        self.sealer = sealer or DeltaSealer(None)
        self.clock = clock
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._listening_ok = asyncio.Event()

    async def append(self, workflow_id: str, turn: int, attempt: int, restart: bool, text: str) -> int:
        sealed = self.sealer.seal(workflow_id, text)
        async with self._db.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_LOCK_SPACE, workflow_id))
            cur = await conn.execute(
                "INSERT INTO stream_deltas (workflow_id, seq, turn, attempt, restart, text, created_at)"
                " SELECT %s, COALESCE(MAX(seq), 0) + 1, %s, %s, %s, %s, %s FROM stream_deltas WHERE workflow_id = %s"
                " RETURNING seq",
                (workflow_id, turn, attempt, restart, sealed, self.clock(), workflow_id),
            )
            row = await cur.fetchone()
            await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, workflow_id))
        assert row is not None
        return int(row[0])

    async def read(self, workflow_id: str, after_seq: int, limit: int = READ_LIMIT) -> list[Delta]:
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT seq, turn, attempt, restart, text, created_at FROM stream_deltas"
                " WHERE workflow_id = %s AND seq > %s ORDER BY seq LIMIT %s",
                (workflow_id, after_seq, max(1, min(limit, READ_LIMIT))),
            )
            rows = await cur.fetchall()
        return [delta_of(workflow_id, row, self.sealer) for row in rows]

    async def _last(self, workflow_id: str) -> int:
        async with self._db.connection() as conn:
            cur = await conn.execute("SELECT MAX(seq) FROM stream_deltas WHERE workflow_id = %s", (workflow_id,))
            row = await cur.fetchone()
        return int(row[0] or 0) if row is not None else 0

    async def _listen_loop(self) -> None:
        """Wake the waiters of each notified run, reconnecting after a lost connection."""
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self._url, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self._listening_ok.set()
                    self._wake_all()  # what was appended while no one listened
                    async for note in conn.notifies():
                        for event in self._waiters.get(note.payload, ()):
                            event.set()
            except psycopg.Error:
                pass
            self._listening_ok.clear()
            await asyncio.sleep(POLL_S)

    def _wake_all(self) -> None:
        for events in self._waiters.values():
            for event in events:
                event.set()

    async def wait(self, workflow_id: str, after_seq: int, timeout_s: float) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.create_task(self._listen_loop(), name="stream-deltas-listen")
        event = asyncio.Event()
        self._waiters.setdefault(workflow_id, set()).add(event)
        deadline = time.monotonic() + max(0.0, timeout_s)
        try:
            # Registered before looking, so an append between the look and the wait still wakes this one.
            while await self._last(workflow_id) <= after_seq:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                step = left if self._listening_ok.is_set() else min(POLL_S, left)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), step)
                event.clear()
        finally:
            waiters = self._waiters.get(workflow_id, set())
            waiters.discard(event)
            if not waiters:
                self._waiters.pop(workflow_id, None)

    async def listen(self, workflow_id: str, ttl_s: float = 20.0) -> None:
        async with self._db.connection() as conn:
            await conn.execute(
                "INSERT INTO stream_listeners (workflow_id, until) VALUES (%s, %s)"
                " ON CONFLICT (workflow_id) DO UPDATE SET until = GREATEST(stream_listeners.until, excluded.until)",
                (workflow_id, self.clock() + ttl_s),
            )

    async def listening(self, workflow_id: str) -> bool:
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT 1 FROM stream_listeners WHERE workflow_id = %s AND until > %s", (workflow_id, self.clock())
            )
            return await cur.fetchone() is not None

    async def prune(self, workflow_id: str, before_turn: int, older_than: float) -> int:
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "DELETE FROM stream_deltas WHERE workflow_id = %s AND turn < %s AND created_at < %s",
                (workflow_id, before_turn, older_than),
            )
            gone = cur.rowcount
            cur = await conn.execute(
                "DELETE FROM stream_deltas WHERE workflow_id = %s AND seq <="
                " (SELECT COALESCE(MAX(seq), 0) FROM stream_deltas WHERE workflow_id = %s) - %s",
                (workflow_id, workflow_id, MAX_ROWS_PER_RUN),
            )
            return gone + cur.rowcount

    async def expire(self, older_than: float) -> int:
        async with self._db.connection() as conn:
            await conn.execute("DELETE FROM stream_listeners WHERE until < %s", (older_than,))
            cur = await conn.execute("DELETE FROM stream_deltas WHERE created_at < %s", (older_than,))
            return cur.rowcount

    async def delete(self, workflow_id: str) -> int:
        async with self._db.connection() as conn:
            await conn.execute("DELETE FROM stream_listeners WHERE workflow_id = %s", (workflow_id,))
            cur = await conn.execute("DELETE FROM stream_deltas WHERE workflow_id = %s", (workflow_id,))
            return cur.rowcount

    async def count(self, workflow_id: str) -> int:
        async with self._db.connection() as conn:
            cur = await conn.execute("SELECT COUNT(*) FROM stream_deltas WHERE workflow_id = %s", (workflow_id,))
            row = await cur.fetchone()
        return int(row[0]) if row is not None else 0

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await listener
        await self._db.close()
