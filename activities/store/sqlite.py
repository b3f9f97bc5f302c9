"""SQLite run store: the embedded default (one file under ``.agent/``).

Good for one machine with any number of worker processes (WAL mode, busy
timeout); use PostgreSQL when workers span machines.

A database locked (or busy) past ``BUSY_TIMEOUT_S`` by another connection raises
``StoreUnavailable``, counted by the store's ``OutageMonitor`` (one warning per
outage); other SQLite errors propagate as they are.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import activities.store.budget as budget
from activities.store.base import (
    StoredMessage,
    StoreError,
    StoreUnavailable,
    decode_blob,
    encode_blob,
    is_blob_digest,
)
from activities.store.checkpoint_usage import STOPPED, CheckpointUsage
from activities.store.ledger import Claim, ClaimRequest, ClaimStatus, LedgerEntry, LedgerState
from activities.store.outage import OutageMonitor
from activities.store.packing import pack_text, unpack_text
from activities.store.schema import SQLITE_SCHEMA
from activities.store.sqlite_erase import SQLiteErasure
from workflows.types import Message

WAL_CHECKPOINT_PAGES = 256  # of 4 KiB: about 1 MiB
WAL_SIZE_LIMIT = 1024 * 1024

T = TypeVar("T")
# How long one statement waits for another connection's write lock before it fails (StoreUnavailable,
# then Temporal retries the activity with backoff). Calls of one process are serialised by a lock, so
# this is also how long every other store call of the process may queue behind a blocked one: kept well
# under the activities' heartbeat timeouts (15-20 s).
BUSY_TIMEOUT_S = 5.0
_BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
_DELETE_BATCH = 500  # digests per DELETE (well under SQLite's limit of bound parameters)
_LEDGER_COLUMNS = (
    "key, tool, args_hash, workflow_id, state, owner, attempt, lease_until, executions, result, is_error, note"
)


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's "database is locked" / busy (another connection holds the lock)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _BUSY_CODES  # extended codes (SQLITE_BUSY_SNAPSHOT, ...) share the low byte
    text = str(exc)
    return "database is locked" in text or "database table is locked" in text or "database is busy" in text


class SQLiteRunStore(SQLiteErasure):
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._monitor = OutageMonitor(str(self.path))
        self._conn = sqlite3.connect(self.path, check_same_thread=False, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            # A deleted row (a forgotten tenant's transcript) is overwritten, not left readable in a free page.
            self._conn.execute("PRAGMA secure_delete=ON")
            # Checkpoint the WAL every ~1 MB (not SQLite's ~4 MB) and truncate it back to 1 MB afterwards:
            # the WAL is part of what a run costs on disk, and a long run must not grow it unbounded.
            self._conn.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
            self._conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
            self._conn.executescript(SQLITE_SCHEMA)
        except sqlite3.OperationalError as exc:
            self._conn.close()
            if is_busy(exc):
                raise self._unavailable(exc) from None
            raise

    def _unavailable(self, exc: BaseException, began: float | None = None) -> StoreUnavailable:
        error = StoreUnavailable(f"the SQLite run store {self.path} is locked by another connection: {exc}")
        self._monitor.failed(error, began)
        return error

    async def _call(self, fn: Callable[..., T], *args: Any, write: bool = True) -> T:
        """Run ``fn`` in a thread; every call goes through here, so this is where a locked database is seen.

        Only a write that gets through ends an outage: readers are not blocked by another connection's
        write lock (WAL), so a read succeeding says nothing about whether the lock is gone.
        """
        began = time.monotonic()
        try:
            result = await asyncio.to_thread(fn, *args)
        except sqlite3.OperationalError as exc:
            if is_busy(exc):
                raise self._unavailable(exc, began) from None
            raise
        if write:
            self._monitor.succeeded(began)
        return result

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._call(fn, *args, write=False)

    def _row(self, row: tuple[int, str | bytes, str]) -> StoredMessage:
        return StoredMessage(
            seq=row[0], message=Message.model_validate_json(unpack_text(row[1])), meta=json.loads(row[2])
        )

    def _put(self, conversation_id: str, seq: int, message: Message, meta: dict[str, object]) -> StoredMessage:
        meta_json = json.dumps(meta)
        with self._lock:
            inserted = self._conn.execute(
                "INSERT OR IGNORE INTO transcript (conversation_id, seq, message, meta) VALUES (?, ?, ?, ?)",
                (conversation_id, seq, pack_text(message.model_dump_json()), meta_json),
            ).rowcount
            if inserted:  # ours is the entry: no need to read it back, unpack and validate it again
                return StoredMessage(seq=seq, message=message.model_copy(deep=True), meta=json.loads(meta_json))
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

    def _transcript(self, conversation_id: str, limit: int) -> list[StoredMessage]:
        found: list[StoredMessage] = []
        with self._lock:
            cur = self._conn.execute(
                "SELECT seq, message, meta FROM transcript WHERE conversation_id = ? AND seq >= 0 AND seq < ?"
                " ORDER BY seq",
                (conversation_id, max(0, limit)),
            )
            for row in cur:
                if row[0] != len(found):
                    break  # the first gap
                found.append(self._row(row))
        return found

    def _entries_after(self, conversation_id: str, after: int, limit: int) -> list[StoredMessage]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT seq, message, meta FROM transcript WHERE conversation_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (conversation_id, after, max(0, limit)),
            ).fetchall()
        return [self._row(r) for r in rows]

    def _copy(self, source: str, target: str, upto: int) -> int:
        if upto < 0:
            raise ValueError(f"cannot copy up to a negative position ({upto})")
        span = "conversation_id = ? AND seq >= 0 AND seq < ?"
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                present = {r[0] for r in self._conn.execute(f"SELECT seq FROM transcript WHERE {span}", (source, upto))}
                if len(present) != upto:
                    missing = sorted(set(range(upto)) - present)
                    raise StoreError(f"transcript {source} is missing entries {missing[:10]}: nothing copied")
                self._conn.execute(
                    "INSERT OR IGNORE INTO transcript (conversation_id, seq, message, meta)"
                    f" SELECT ?, seq, message, meta FROM transcript WHERE {span}",
                    (target, source, upto),
                )
                (held,) = self._conn.execute(f"SELECT COUNT(*) FROM transcript WHERE {span}", (target, upto)).fetchone()
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return int(held)

    def _conversations(self) -> list[tuple[str, float]]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT conversation_id, CAST(strftime('%s', MAX(created_at)) AS REAL) FROM transcript"
                " GROUP BY conversation_id ORDER BY conversation_id"
            ).fetchall()
        return [(r[0], float(r[1] if r[1] is not None else 0.0)) for r in rows]

    async def put_message(
        self, conversation_id: str, seq: int, message: Message, meta: dict[str, object] | None = None
    ) -> StoredMessage:
        return await self._call(self._put, conversation_id, seq, message, meta or {})

    async def get_message(self, conversation_id: str, seq: int) -> StoredMessage | None:
        return await self._read(self._get, conversation_id, seq)

    async def messages(self, conversation_id: str, upto: int) -> list[StoredMessage]:
        return await self._read(self._list, conversation_id, upto)

    async def transcript(self, conversation_id: str, limit: int = 100_000) -> list[StoredMessage]:
        return await self._read(self._transcript, conversation_id, limit)

    async def entries_after(self, conversation_id: str, after: int = -1, limit: int = 1000) -> list[StoredMessage]:
        return await self._read(self._entries_after, conversation_id, after, limit)

    async def copy_messages(self, source: str, target: str, upto: int) -> int:
        return await self._call(self._copy, source, target, upto)

    async def conversations(self) -> list[tuple[str, float]]:
        return await self._read(self._conversations)

    # --- ledger ---------------------------------------------------------------------

    @staticmethod
    def _entry(row: tuple[Any, ...]) -> LedgerEntry:
        return LedgerEntry(**dict(zip(_LEDGER_COLUMNS.split(", "), row, strict=True)))

    def _select(self, key: str) -> LedgerEntry | None:
        row = self._conn.execute(f"SELECT {_LEDGER_COLUMNS} FROM ledger WHERE key = ?", (key,)).fetchone()
        return self._entry(row) if row else None

    def _claim(self, r: ClaimRequest) -> Claim:
        now = time.time()
        with self._lock:
            # BEGIN IMMEDIATE takes the write lock first, so the read-decide-write below is atomic
            # across every process using this file.
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                current = self._select(r.key)
                status: ClaimStatus
                started = int(r.start_if_fresh)
                if current is None:
                    self._conn.execute(
                        "INSERT INTO ledger"
                        " (key, tool, args_hash, workflow_id, state, owner, attempt, lease_until, executions)"
                        " VALUES (?, ?, ?, ?, 'intent', ?, ?, ?, ?)",
                        (r.key, r.tool, r.args_hash, r.workflow_id, r.owner, r.attempt, now + r.lease_s, started),
                    )
                    status = "fresh"
                elif r.force:
                    status = "fresh"
                elif current.state == "done":
                    self._conn.execute("COMMIT")
                    return Claim(status="done", entry=current)
                elif current.state == "intent" and current.lease_until > now and current.owner != r.owner:
                    self._conn.execute("COMMIT")
                    return Claim(status="busy", entry=current)
                else:
                    status = "recovered"
                if current is not None:
                    self._conn.execute(
                        "UPDATE ledger SET state = 'intent', owner = ?, attempt = ?, lease_until = ?,"
                        " executions = executions + ?, updated_at = CURRENT_TIMESTAMP WHERE key = ?",
                        (r.owner, r.attempt, now + r.lease_s, started if status == "fresh" else 0, r.key),
                    )
                entry = self._select(r.key)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        assert entry is not None
        return Claim(status=status, entry=entry)

    def _started(self, key: str, owner: str) -> bool:
        with self._lock:
            cur = self._conn.execute(
                "UPDATE ledger SET executions = executions + 1 WHERE key = ? AND owner = ?", (key, owner)
            )
        return cur.rowcount == 1

    def _renew(self, key: str, owner: str, lease_s: float) -> bool:
        with self._lock:
            cur = self._conn.execute(
                "UPDATE ledger SET lease_until = ? WHERE key = ? AND owner = ? AND state = 'intent'",
                (time.time() + lease_s, key, owner),
            )
        return cur.rowcount == 1

    def _finish(self, key: str, owner: str, state: LedgerState, result: str, is_error: bool, note: str) -> None:
        with self._lock:
            # The first recorded outcome wins: a zombie finishing late cannot overwrite it.
            self._conn.execute(
                "UPDATE ledger SET state = ?, result = ?, is_error = ?, note = ?, lease_until = 0,"
                " updated_at = CURRENT_TIMESTAMP WHERE key = ? AND state != 'done'",
                (state, result, int(is_error), note, key),
            )

    def _ledger(self, workflow_id: str | None) -> list[LedgerEntry]:
        with self._lock:
            if workflow_id is None:
                rows = self._conn.execute(f"SELECT {_LEDGER_COLUMNS} FROM ledger ORDER BY rowid").fetchall()
            else:
                rows = self._conn.execute(
                    f"SELECT {_LEDGER_COLUMNS} FROM ledger WHERE workflow_id = ? ORDER BY rowid", (workflow_id,)
                ).fetchall()
        return [self._entry(r) for r in rows]

    async def claim(self, request: ClaimRequest) -> Claim:
        return await self._call(self._claim, request)

    async def started(self, key: str, owner: str) -> bool:
        return await self._call(self._started, key, owner)

    async def renew(self, key: str, owner: str, lease_s: float) -> bool:
        return await self._call(self._renew, key, owner, lease_s)

    async def finish(
        self, key: str, owner: str, state: LedgerState, result: str, is_error: bool, note: str = ""
    ) -> None:
        await self._call(self._finish, key, owner, state, result, is_error, note)

    async def ledger(self, workflow_id: str | None = None) -> list[LedgerEntry]:
        return await self._read(self._ledger, workflow_id)

    async def close(self) -> None:
        with self._lock:
            self._conn.close()

    # --- tree budget ----------------------------------------------------------------

    def _budget_rows(self, root: str) -> list[budget.BudgetRow]:
        rows = self._conn.execute(
            "SELECT key, settled, tokens, cost_usd, at FROM budget WHERE root = ?", (root,)
        ).fetchall()
        return [budget.BudgetRow(r[0], bool(r[1]), r[2], r[3], r[4]) for r in rows]

    def _budget_reserve(
        self, root: str, key: str, cap_tokens: int, cap_cost_usd: float, tokens: int, cost_usd: float
    ) -> budget.BudgetVerdict:
        now = time.time()
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")  # the read-decide-write is atomic across processes
            try:
                verdict = budget.decide(self._budget_rows(root), key, cap_tokens, cap_cost_usd, now, tokens, cost_usd)
                if verdict == "granted":
                    self._conn.execute(
                        "INSERT OR IGNORE INTO budget (root, key, tokens, cost_usd, at) VALUES (?, ?, ?, ?, ?)",
                        (root, key, tokens, cost_usd, now),
                    )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return verdict

    def _budget_settle(self, root: str, key: str, tokens: int, cost_usd: float) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT INTO budget (root, key, settled, tokens, cost_usd, at) VALUES (?, ?, 1, ?, ?, ?)"
                " ON CONFLICT (root, key) DO UPDATE SET settled = 1, tokens = excluded.tokens,"
                " cost_usd = excluded.cost_usd WHERE settled = 0",
                (root, key, tokens, cost_usd, time.time()),
            )

    def _budget_release(self, root: str, key: str) -> None:
        with self._lock:
            self._conn.execute("DELETE FROM budget WHERE root = ? AND key = ? AND settled = 0", (root, key))

    def _budget_spent(self, root: str) -> budget.BudgetSpent:
        with self._lock:
            return budget.spent(self._budget_rows(root), time.time())

    async def budget_reserve(
        self, root: str, key: str, cap_tokens: int, cap_cost_usd: float, tokens: int = 0, cost_usd: float = 0.0
    ) -> budget.BudgetVerdict:
        return await self._call(self._budget_reserve, root, key, cap_tokens, cap_cost_usd, tokens, cost_usd)

    async def budget_settle(self, root: str, key: str, tokens: int, cost_usd: float) -> None:
        await self._call(self._budget_settle, root, key, tokens, cost_usd)

    async def budget_release(self, root: str, key: str) -> None:
        await self._call(self._budget_release, root, key)

    async def budget_spent(self, root: str) -> budget.BudgetSpent:
        return await self._read(self._budget_spent, root)

    # --- runs of a tree ----------------------------------------------------------------

    def _tree_run_reserve(self, root: str, key: str, cap: int) -> bool:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")  # the count-decide-insert is atomic across processes
            try:
                held = self._conn.execute("SELECT 1 FROM tree_runs WHERE root = ? AND key = ?", (root, key)).fetchone()
                count = self._conn.execute("SELECT count(*) FROM tree_runs WHERE root = ?", (root,)).fetchone()[0]
                granted = held is not None or count < cap
                if held is None and granted:
                    self._conn.execute(
                        "INSERT INTO tree_runs (root, key, at) VALUES (?, ?, ?)", (root, key, time.time())
                    )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return granted

    def _tree_runs(self, root: str) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT count(*) FROM tree_runs WHERE root = ?", (root,)).fetchone()[0])

    async def tree_run_reserve(self, root: str, key: str, cap: int) -> bool:
        return await self._call(self._tree_run_reserve, root, key, cap)

    async def tree_runs(self, root: str) -> int:
        return await self._read(self._tree_runs, root)

    def _tenant_run_reserve(self, tenant: str, workflow_id: str, cap: int) -> tuple[bool, list[str]]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")  # the count-decide-insert is atomic across processes
            try:
                held = self._conn.execute(
                    "SELECT 1 FROM tenant_runs WHERE tenant = ? AND workflow_id = ?", (tenant, workflow_id)
                ).fetchone()
                counted = [
                    row[0]
                    for row in self._conn.execute(
                        "SELECT workflow_id FROM tenant_runs WHERE tenant = ? ORDER BY workflow_id", (tenant,)
                    )
                ]
                granted = held is not None or len(counted) < cap
                if held is None and granted:
                    self._conn.execute(
                        "INSERT INTO tenant_runs (tenant, workflow_id, at) VALUES (?, ?, ?)",
                        (tenant, workflow_id, time.time()),
                    )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return granted, [] if granted else counted

    def _tenant_run_release(self, tenant: str, workflow_id: str) -> bool:
        with self._lock:
            cur = self._conn.execute(
                "DELETE FROM tenant_runs WHERE tenant = ? AND workflow_id = ?", (tenant, workflow_id)
            )
        return cur.rowcount > 0

    def _tenant_runs(self, tenant: str | None) -> list[tuple[str, str]]:
        with self._lock:
            if tenant is None:
                rows = self._conn.execute("SELECT tenant, workflow_id FROM tenant_runs ORDER BY tenant, workflow_id")
            else:
                rows = self._conn.execute(
                    "SELECT tenant, workflow_id FROM tenant_runs WHERE tenant = ? ORDER BY workflow_id", (tenant,)
                )
            return [(row[0], row[1]) for row in rows]

    async def tenant_run_reserve(self, tenant: str, workflow_id: str, cap: int) -> tuple[bool, list[str]]:
        return await self._call(self._tenant_run_reserve, tenant, workflow_id, cap)

    async def tenant_run_release(self, tenant: str, workflow_id: str) -> bool:
        return await self._call(self._tenant_run_release, tenant, workflow_id)

    async def tenant_runs(self, tenant: str | None = None) -> list[tuple[str, str]]:
        return await self._read(self._tenant_runs, tenant)

    # --- blobs ----------------------------------------------------------------------

    def _put_blob(self, data: bytes) -> tuple[str, bool]:
        digest, encoding, stored = encode_blob(data)
        with self._lock:
            # Same digest, same bytes: whoever inserted first stored exactly what we would.
            cur = self._conn.execute(
                "INSERT OR IGNORE INTO blobs (digest, size, encoding, data, created_at) VALUES (?, ?, ?, ?, ?)",
                (digest, len(data), encoding, stored, time.time()),
            )
        return digest, cur.rowcount == 1

    def _get_blob(self, digest: str) -> bytes | None:
        with self._lock:
            row = self._conn.execute("SELECT size, encoding, data FROM blobs WHERE digest = ?", (digest,)).fetchone()
        return decode_blob(digest, row[0], row[1], row[2]) if row else None

    def _blob_digests(self, older_than: float) -> list[str]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT digest FROM blobs WHERE created_at < ? ORDER BY digest", (older_than,)
            ).fetchall()
        return [r[0] for r in rows]

    def _delete_blobs(self, digests: list[str]) -> int:
        unique = sorted(set(digests))
        deleted = 0
        for start in range(0, len(unique), _DELETE_BATCH):
            batch = unique[start : start + _DELETE_BATCH]
            with self._lock:
                cur = self._conn.execute(f"DELETE FROM blobs WHERE digest IN ({', '.join('?' * len(batch))})", batch)
                self._conn.execute(f"DELETE FROM blob_refs WHERE digest IN ({', '.join('?' * len(batch))})", batch)
            deleted += cur.rowcount
        return deleted

    async def put_blob(self, data: bytes) -> str:
        return (await self._call(self._put_blob, data))[0]

    async def add_blob(self, data: bytes) -> tuple[str, bool]:
        return await self._call(self._put_blob, data)

    # --- checkpoint usage -----------------------------------------------------------

    def _checkpoint_usage(self, run: str) -> CheckpointUsage:
        with self._lock:
            row = self._conn.execute(
                "SELECT COALESCE(SUM(bytes), 0), COALESCE(SUM(checkpoint_id != ?), 0),"
                " COALESCE(MAX(checkpoint_id = ?), 0) FROM checkpoint_usage WHERE run = ?",
                (STOPPED, STOPPED, run),
            ).fetchone()
        return CheckpointUsage(bytes=int(row[0]), count=int(row[1]), stopped=bool(row[2]))

    def _checkpoint_record(self, run: str, checkpoint_id: str, new_bytes: int) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT OR IGNORE INTO checkpoint_usage (run, checkpoint_id, bytes, at) VALUES (?, ?, ?, ?)",
                (run, checkpoint_id, new_bytes, time.time()),
            )

    async def checkpoint_usage(self, run: str) -> CheckpointUsage:
        return await self._read(self._checkpoint_usage, run)

    async def checkpoint_record(self, run: str, checkpoint_id: str, new_bytes: int) -> None:
        await self._call(self._checkpoint_record, run, checkpoint_id, new_bytes)

    async def get_blob(self, digest: str) -> bytes | None:
        if not is_blob_digest(digest):
            return None
        return await self._read(self._get_blob, digest)

    async def blob_digests(self, older_than: float) -> list[str]:
        return await self._read(self._blob_digests, older_than)

    async def delete_blobs(self, digests: list[str]) -> int:
        return await self._call(self._delete_blobs, digests)
