"""SQLite run store: the embedded default (one file under ``.agent/``).

Good for one machine with any number of worker processes (WAL mode, busy
timeout); use PostgreSQL when workers span machines.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from pathlib import Path

from activities.store.base import StoredMessage, StoreError
from workflows.types import Message

_SCHEMA = """
CREATE TABLE IF NOT EXISTS transcript (
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    message TEXT NOT NULL,
    meta TEXT NOT NULL DEFAULT '{}',
    created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (conversation_id, seq)
);
"""


class SQLiteRunStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(_SCHEMA)

    def _row(self, row: tuple[int, str, str]) -> StoredMessage:
        return StoredMessage(seq=row[0], message=Message.model_validate_json(row[1]), meta=json.loads(row[2]))

    def _put(self, conversation_id: str, seq: int, message: Message, meta: dict[str, object]) -> StoredMessage:
        with self._lock:
            self._conn.execute(
                "INSERT OR IGNORE INTO transcript (conversation_id, seq, message, meta) VALUES (?, ?, ?, ?)",
                (conversation_id, seq, message.model_dump_json(), json.dumps(meta)),
            )
            row = self._conn.execute(
                "SELECT seq, message, meta FROM transcript WHERE conversation_id = ? AND seq = ?",
                (conversation_id, seq),
            ).fetchone()
        return self._row(row)

    def _get(self, conversation_id: str, seq: int) -> StoredMessage | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT seq, message, meta FROM transcript WHERE conversation_id = ? AND seq = ?",
                (conversation_id, seq),
            ).fetchone()
        return self._row(row) if row else None

    def _list(self, conversation_id: str, upto: int) -> list[StoredMessage]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT seq, message, meta FROM transcript WHERE conversation_id = ? AND seq < ? ORDER BY seq",
                (conversation_id, upto),
            ).fetchall()
        found = [self._row(r) for r in rows]
        if [m.seq for m in found] != list(range(upto)):
            missing = sorted(set(range(upto)) - {m.seq for m in found})
            raise StoreError(f"transcript {conversation_id} is missing entries {missing[:10]}")
        return found

    async def put_message(
        self, conversation_id: str, seq: int, message: Message, meta: dict[str, object] | None = None
    ) -> StoredMessage:
        return await asyncio.to_thread(self._put, conversation_id, seq, message, meta or {})

    async def get_message(self, conversation_id: str, seq: int) -> StoredMessage | None:
        return await asyncio.to_thread(self._get, conversation_id, seq)

    async def messages(self, conversation_id: str, upto: int) -> list[StoredMessage]:
        return await asyncio.to_thread(self._list, conversation_id, upto)

    async def close(self) -> None:
        with self._lock:
            self._conn.close()
