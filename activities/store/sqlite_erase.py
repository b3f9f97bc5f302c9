"""The SQLite store's part of forgetting and retention: blob references, deleting a run's rows, scrubbing.

Mixed into :class:`activities.store.sqlite.SQLiteRunStore`. The connection runs with
``PRAGMA secure_delete=ON``, so a deleted row's bytes are overwritten in the database file
rather than left in a free page; :meth:`scrub` then checkpoints the WAL and truncates it, so
the page images written before the delete are gone from the WAL file too.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from activities.store.checkpoint_usage import STOPPED

T = TypeVar("T")
_BATCH = 500  # bound parameters per statement (well under SQLite's limit)


class SQLiteErasure:
    _conn: sqlite3.Connection
    _lock: threading.Lock

    if TYPE_CHECKING:

        async def _call(self, fn: Callable[..., T], *args: Any, write: bool = True) -> T: ...

        async def _read(self, fn: Callable[..., T], *args: Any) -> T: ...

    def _blob_ref(self, run: str, tenant: str, user: str, digests: list[str]) -> None:
        now = time.time()
        with self._lock:
            self._conn.executemany(
                "INSERT OR IGNORE INTO blob_refs (digest, run, tenant, user_name, at) VALUES (?, ?, ?, ?, ?)",
                [(digest, run, tenant, user, now) for digest in sorted(set(digests))],
            )

    def _blob_refs_of(self, run: str) -> list[str]:
        with self._lock:
            rows = self._conn.execute("SELECT digest FROM blob_refs WHERE run = ? ORDER BY digest", (run,)).fetchall()
        return [r[0] for r in rows]

    def _blob_ref_runs(self, digests: list[str]) -> dict[str, set[str]]:
        unique = sorted(set(digests))
        found: dict[str, set[str]] = {}
        for start in range(0, len(unique), _BATCH):
            batch = unique[start : start + _BATCH]
            with self._lock:
                rows = self._conn.execute(
                    f"SELECT digest, run FROM blob_refs WHERE digest IN ({', '.join('?' * len(batch))})", batch
                ).fetchall()
            for digest, run in rows:
                found.setdefault(digest, set()).add(run)
        return found

    def _delete_where(self, table: str, column: str, value: str) -> int:
        with self._lock:
            return self._conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (value,)).rowcount

    def _count_messages(self, conversation_id: str) -> int:
        with self._lock:
            row = self._conn.execute(
                "SELECT COUNT(*) FROM transcript WHERE conversation_id = ?", (conversation_id,)
            ).fetchone()
        return int(row[0])

    def _delete_checkpoint_usage(self, run: str) -> int:
        # Counted: the checkpoints recorded, not the marker that the run's checkpoints stopped.
        with self._lock:
            self._conn.execute("DELETE FROM checkpoint_usage WHERE run = ? AND checkpoint_id = ?", (run, STOPPED))
            return self._conn.execute("DELETE FROM checkpoint_usage WHERE run = ?", (run,)).rowcount

    def _scrub(self) -> bool:
        with self._lock:
            busy, _, _ = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return not busy

    async def blob_ref(self, run: str, tenant: str, user: str, digests: list[str]) -> None:
        if digests:
            await self._call(self._blob_ref, run, tenant, user, digests)

    async def blob_refs_of(self, run: str) -> list[str]:
        return await self._read(self._blob_refs_of, run)

    async def blob_ref_runs(self, digests: list[str]) -> dict[str, set[str]]:
        return await self._read(self._blob_ref_runs, digests)

    async def delete_blob_refs(self, run: str) -> int:
        return await self._call(self._delete_where, "blob_refs", "run", run)

    async def count_messages(self, conversation_id: str) -> int:
        return await self._read(self._count_messages, conversation_id)

    async def delete_conversation(self, conversation_id: str) -> int:
        return await self._call(self._delete_where, "transcript", "conversation_id", conversation_id)

    async def delete_ledger(self, workflow_id: str) -> int:
        return await self._call(self._delete_where, "ledger", "workflow_id", workflow_id)

    async def delete_checkpoint_usage(self, run: str) -> int:
        return await self._call(self._delete_checkpoint_usage, run)

    async def scrub(self, full: bool = False) -> bool:
        return await self._call(self._scrub)
