"""Long-term memory in the SQLite run store's file: FTS5 (bm25) for plaintext entries, the keyed index for sealed.

The store has its own connection to the run store's file, with ``secure_delete`` on: pages freed by a
delete are overwritten with zeros, the full-text index is merged (``optimize``) after deletes so that
its old segments go too, and the WAL is checkpointed and truncated, so a deleted entry's text is in none
of the database's files afterwards.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import activities.memory.scoring as scoring
from activities.memory.base import (
    MemoryEntry,
    MemoryLimits,
    MemoryStoreError,
    bound_limit,
    check_key,
    check_text,
    deleted_totals,
    key_for,
    over_bounds,
)
from activities.memory.sealing import MARK, Sealer
from activities.memory.terms import fts5_match, query_terms, term_counts
from activities.store.base import StoreError, StoreUnavailable
from activities.store.schema import SQLITE_SCHEMA
from activities.store.sqlite import BUSY_TIMEOUT_S, is_busy

T = TypeVar("T")
Entries = list[MemoryEntry]  # named outside the class, whose own ``list`` method shadows the builtin
_COLUMNS = "e.id, e.key, e.text, e.created_at, e.expires_at, e.tenant, e.user_name"
_LIVE = "(e.expires_at IS NULL OR e.expires_at > ?)"


class SQLiteMemoryStore:
    def __init__(
        self,
        path: str | Path,
        sealer: Sealer | None = None,
        limits: MemoryLimits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.sealer = sealer
        self.limits = limits or MemoryLimits()
        self.clock = clock
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, check_same_thread=False, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA secure_delete=ON")
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

    def _entry(self, row: Sequence[Any], score: float = 0.0) -> MemoryEntry:
        _, key, text, created_at, expires_at, tenant, user = row[:7]
        if self.sealer is not None:
            text = self.sealer.open(tenant, user, text, key)
        elif text.startswith(MARK):
            raise StoreError(f"memory entry {key!r} is encrypted, and no key ring is configured (AGENT_PAYLOAD_KEYS)")
        return MemoryEntry(key=key, text=text, created_at=created_at, expires_at=expires_at, user=user, score=score)

    # --- save ----------------------------------------------------------------------

    async def save(self, tenant: str, user: str, key: str, text: str, idem_key: str) -> MemoryEntry:
        check_text(text)
        key = check_key(key or key_for(idem_key))
        return await self._run(self._save, tenant, user, key, text, idem_key)

    def _save(self, tenant: str, user: str, key: str, text: str, idem_key: str) -> MemoryEntry:
        c = self._conn
        c.execute("BEGIN IMMEDIATE")
        try:
            entry = self._save_locked(tenant, user, key, text, idem_key)
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")
        return entry

    def _save_locked(self, tenant: str, user: str, key: str, text: str, idem_key: str) -> MemoryEntry:
        c = self._conn
        done = c.execute(
            f"SELECT {_COLUMNS} FROM memory_entries e WHERE tenant = ? AND user_name = ? AND idem_key = ?",
            (tenant, user, idem_key),
        ).fetchone()
        if done is not None:
            return self._entry(done)  # a retry of a save that happened
        counts, length = term_counts(text)
        size = len(text.encode())
        c.execute("INSERT OR IGNORE INTO memory_namespaces (tenant, user_name) VALUES (?, ?)", (tenant, user))
        entries, used = c.execute(
            "SELECT entries, bytes FROM memory_namespaces WHERE tenant = ? AND user_name = ?", (tenant, user)
        ).fetchone()
        old = c.execute(
            "SELECT id, text, size, length, sealed FROM memory_entries WHERE tenant = ? AND user_name = ? AND key = ?",
            (tenant, user, key),
        ).fetchone()
        if old is not None:
            entries, used = entries - 1, used - old[2]
        why = over_bounds(self.limits, entries, used, size)
        if why:
            raise MemoryStoreError(why)
        if old is not None:
            self._unindex(old[0], old[1], bool(old[4]))
            c.execute("DELETE FROM memory_entries WHERE id = ?", (old[0],))
            self._account(tenant, user, -1, -old[2], -old[3])
        now = self.clock()
        expires = None if self.limits.ttl_s is None else now + self.limits.ttl_s
        stored = text if self.sealer is None else self.sealer.seal(tenant, user, text)
        entry_id = c.execute(
            "INSERT INTO memory_entries (tenant, user_name, key, idem_key, text, size, length, sealed, created_at,"
            " expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (tenant, user, key, idem_key, stored, size, length, int(self.sealer is not None), now, expires),
        ).lastrowid
        if self.sealer is None:
            c.execute("INSERT INTO memory_fts (rowid, text) VALUES (?, ?)", (entry_id, text))
        else:
            sealer = self.sealer
            c.executemany(
                "INSERT INTO memory_terms (term, entry, tf) VALUES (?, ?, ?)",
                [(sealer.term_hash(tenant, user, term), entry_id, tf) for term, tf in counts.items()],
            )
        self._account(tenant, user, 1, size, length)
        return MemoryEntry(key=key, text=text, created_at=now, expires_at=expires, user=user)

    def _account(self, tenant: str, user: str, entries: int, size: int, length: int) -> None:
        self._conn.execute(
            "UPDATE memory_namespaces SET entries = entries + ?, bytes = bytes + ?, terms = terms + ?"
            " WHERE tenant = ? AND user_name = ?",
            (entries, size, length, tenant, user),
        )

    def _unindex(self, entry_id: int, stored: str, sealed: bool) -> None:
        if sealed:
            self._conn.execute("DELETE FROM memory_terms WHERE entry = ?", (entry_id,))
        else:  # external content: FTS5 removes an entry given the text it indexed
            self._conn.execute(
                "INSERT INTO memory_fts (memory_fts, rowid, text) VALUES ('delete', ?, ?)", (entry_id, stored)
            )

    # --- search and list -------------------------------------------------------------

    async def search(self, tenant: str, user: str, query: str, limit: int) -> list[MemoryEntry]:
        words = query_terms(query)
        if not words:
            return []
        return await self._run(self._search, tenant, user, words, bound_limit(limit))

    def _search(self, tenant: str, user: str, words: list[str], limit: int) -> list[MemoryEntry]:
        now = self.clock()
        if self.sealer is None:
            words = self._selective(words)
            rows = self._conn.execute(
                f"SELECT {_COLUMNS}, bm25(memory_fts) AS rank FROM memory_fts"
                " JOIN memory_entries e ON e.id = memory_fts.rowid"
                f" WHERE memory_fts MATCH ? AND e.tenant = ? AND e.user_name = ? AND {_LIVE}"
                " ORDER BY rank LIMIT ?",
                (fts5_match(words), tenant, user, now, limit),
            ).fetchall()
            return [self._entry(row, -row[7]) for row in rows]  # bm25(): lower is better
        hashes = [h for word in words for h in self.sealer.query_hashes(tenant, user, word)]
        marks = ", ".join("?" * len(hashes))
        frequencies = dict(
            self._conn.execute(
                f"SELECT term, COUNT(*) FROM memory_terms WHERE term IN ({marks}) GROUP BY term", hashes
            ).fetchall()
        )
        if not frequencies:
            return []
        usage = self._conn.execute(
            "SELECT entries, terms FROM memory_namespaces WHERE tenant = ? AND user_name = ?", (tenant, user)
        ).fetchone()
        weights = scoring.weights(scoring.selective(frequencies, usage[0] if usage else 0), usage)
        sql = scoring.keyed_query(_COLUMNS, "?", len(weights))
        rows = self._conn.execute(
            sql, [*scoring.flat(weights), scoring.avg_length(usage), tenant, user, now, limit]
        ).fetchall()
        return [self._entry(row, row[7]) for row in rows]

    def _selective(self, words: list[str]) -> list[str]:
        """``words`` less the common ones (``scoring.selective``), by the index's own counts (fts5vocab)."""
        marks = ", ".join("?" * len(words))
        counts = dict(self._conn.execute(f"SELECT term, doc FROM memory_vocab WHERE term IN ({marks})", words))
        (entries,) = self._conn.execute("SELECT COALESCE(SUM(entries), 0) FROM memory_namespaces").fetchone()
        kept = scoring.selective({word: int(counts.get(word, 0)) for word in words}, int(entries))
        return [word for word in words if word in kept]

    async def list(self, tenant: str, user: str | None, limit: int) -> list[MemoryEntry]:
        return await self._run(self._list, tenant, user, bound_limit(limit))

    def _list(self, tenant: str, user: str | None, limit: int) -> Entries:
        where, params = _namespace(tenant, user)
        rows = self._conn.execute(
            f"SELECT {_COLUMNS} FROM memory_entries e WHERE {where} AND {_LIVE} ORDER BY e.created_at DESC, e.id DESC"
            " LIMIT ?",
            (*params, self.clock(), limit),
        ).fetchall()
        return [self._entry(row) for row in rows]

    async def count(self, tenant: str, user: str | None) -> int:
        where, params = _namespace(tenant, user)
        row = await self._run(
            lambda: self._conn.execute(f"SELECT COUNT(*) FROM memory_entries e WHERE {where}", params).fetchone()
        )
        return int(row[0])

    # --- deleting ----------------------------------------------------------------------

    async def delete(self, tenant: str, user: str, key: str) -> bool:
        return await self._run(self._delete_where, "tenant = ? AND user_name = ? AND key = ?", (tenant, user, key)) > 0

    async def forget(self, tenant: str, user: str | None) -> int:
        where, params = _namespace(tenant, user, alias="")
        return await self._run(self._delete_where, where, params)

    async def expire(self, now: float) -> int:
        return await self._run(self._delete_where, "expires_at IS NOT NULL AND expires_at <= ?", (now,))

    def _delete_where(self, where: str, params: tuple[Any, ...]) -> int:
        c = self._conn
        c.execute("BEGIN IMMEDIATE")
        try:
            rows = c.execute(
                f"SELECT id, text, sealed, tenant, user_name, size, length FROM memory_entries WHERE {where}", params
            ).fetchall()
            totals = deleted_totals([(r[0], *r[3:]) for r in rows])
            for entry_id, stored, sealed, *_ in rows:
                self._unindex(entry_id, stored, bool(sealed))
                c.execute("DELETE FROM memory_entries WHERE id = ?", (entry_id,))
            for (tenant, user), (entries, size, length) in totals.items():
                self._account(tenant, user, -entries, -size, -length)
            c.execute("DELETE FROM memory_namespaces WHERE entries <= 0")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")
        if rows:
            self._scrub()
        return len(rows)

    def _scrub(self) -> None:
        """Leave no copy of deleted text: merge the index's segments (old ones are freed, and zeroed by
        ``secure_delete``), then copy the WAL into the database and truncate it."""
        self._conn.execute("INSERT INTO memory_fts (memory_fts) VALUES ('optimize')")
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    async def close(self) -> None:
        # Through the lock: a call whose caller was cancelled may still be running in its thread.
        await self._run(self._conn.close)


def _namespace(tenant: str, user: str | None, alias: str = "e.") -> tuple[str, tuple[str, ...]]:
    if user is None:
        return f"{alias}tenant = ?", (tenant,)
    return f"{alias}tenant = ? AND {alias}user_name = ?", (tenant, user)
