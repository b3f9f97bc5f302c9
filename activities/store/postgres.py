"""PostgreSQL run store: for workers spread over several machines.

Same semantics as the SQLite store (``activities.store.sqlite``), with the claim
decided in one transaction: ``INSERT ... ON CONFLICT DO NOTHING`` for a new key,
else ``SELECT ... FOR UPDATE`` on the existing row and an ``UPDATE``. The pool
opens on first use, which also applies any missing schema migration.

Messages and meta are JSON in ``text`` columns rather than ``jsonb``: ``jsonb``
rejects ``\\u0000``, which a tool's output may well contain. Raw text columns
(ledger ``result``/``note``) cannot hold NUL at all, so NUL is stored as U+FFFD.
Blobs are ``bytea``, which holds any bytes.

Outages: a connection-level failure (the server stopped or restarting, a connection refused or
lost, no pooled connection within ``_ACQUIRE_TIMEOUT_S``) raises ``StoreUnavailable``; any other
server error is a plain ``StoreError``. The pool reconnects in the background; its own per-attempt
log lines (``psycopg.pool`` warnings) are silenced, since the store's ``OutageMonitor`` logs one
``store_unavailable`` warning per outage and one ``store_recovered`` when a call succeeds again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

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
from activities.store.postgres_erase import PostgresErasure
from activities.store.schema import POSTGRES_MIGRATIONS
from workflows.types import Message

Connection = psycopg.AsyncConnection[TupleRow]

# pg_advisory_xact_lock key serialising migrations of one database across workers ("agentmig").
_MIGRATION_LOCK = 0x6167656E746D6967
_LEDGER_COLUMNS = (
    "key, tool, args_hash, workflow_id, state, owner, attempt, lease_until, executions, result, is_error, note"
)
_CONNECT_TIMEOUT_S = 10
# How long a call waits for a pooled connection before it fails with StoreUnavailable (and its activity
# attempt is retried by Temporal): below the tool heartbeat timeouts (15 s for http_request), so a wait
# during an outage never looks like a dead worker.
_ACQUIRE_TIMEOUT_S = 8.0
# The pool's background reconnection of one connection backs off (1, 2, 4, ... s) until this, then gives
# up and starts over on the next request: a short limit keeps the retries frequent, so the pool has a
# connection again within a few seconds of the server coming back.
_RECONNECT_TIMEOUT_S = 6.0
# SQLSTATEs of connection-level failures: class 08 (connection exception), the server shutting down or
# starting (57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now), too many connections.
_UNAVAILABLE_STATES = ("08", "57P01", "57P02", "57P03", "53300")
# Errors of connecting (no SQLSTATE) that no waiting cures: a wrong password, database or host rule.
_NOT_AN_OUTAGE = ("authentication failed", "does not exist", "no pg_hba.conf entry", "invalid")
_DELETE_BATCH = 1000  # digests per DELETE: one short statement each, not one long lock on many rows


def redact_url(url: str) -> str:
    """``url`` with its password (in the URL, its query or a ``password=`` conninfo) replaced by ``***``."""
    try:
        if "://" not in url:
            params = psycopg.conninfo.conninfo_to_dict(url)
            return psycopg.conninfo.make_conninfo("", **{k: "***" if k == "password" else v for k, v in params.items()})
        parts = urlsplit(url)
        if parts.password:
            user = quote(parts.username or "", safe="")
            parts = parts._replace(netloc=f"{user}:***@{parts.netloc.rpartition('@')[2]}")
        query = [(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
        return urlunsplit(parts._replace(query=urlencode(query, safe="/:*")))
    except (ValueError, psycopg.ProgrammingError):
        return "<unparseable PostgreSQL URL>"


def _quiet_pool_logger() -> None:
    """Silence psycopg_pool's per-attempt warnings (one per reconnection try, ~45 per 20 s outage).

    Its logger never logs above WARNING; an operator who configured a level for it keeps theirs.
    """
    pool_logger = logging.getLogger("psycopg.pool")
    if pool_logger.level == logging.NOTSET:
        pool_logger.setLevel(logging.ERROR)


def is_unavailable(exc: BaseException, conn: Connection | None = None) -> bool:
    """Whether ``exc`` is a connection-level failure (retrying later can help), not a logic error."""
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    if conn is not None and (conn.broken or conn.closed):
        return True
    state = exc.sqlstate
    if state is None:  # a client-side failure: refused, reset, closed, timed out, ...
        text = str(exc).lower()
        return not any(marker in text for marker in _NOT_AN_OUTAGE)
    return state.startswith(_UNAVAILABLE_STATES)


def _text(value: str) -> str:
    return value.replace("\x00", "\ufffd")


class PostgresRunStore(PostgresErasure):
    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10) -> None:
        self._url = url
        self._shown = redact_url(url)
        try:
            self._secret = str(psycopg.conninfo.conninfo_to_dict(url).get("password") or "")
        except psycopg.ProgrammingError:
            raise StoreError(f"invalid PostgreSQL URL {self._shown}") from None
        self._sizes = (min_size, max_size)
        self._pool: AsyncConnectionPool[Connection] | None = None
        self._opening = asyncio.Lock()
        self._closed = False
        self._monitor = OutageMonitor(self._shown)

    def _error(self, what: str, exc: BaseException) -> StoreError:
        text = f"{what} (PostgreSQL run store {self._shown}): {exc}"
        return StoreError(text.replace(self._secret, "***") if self._secret else text)

    def _unavailable(self, what: str, exc: BaseException, began: float | None = None) -> StoreUnavailable:
        text = f"{what} (PostgreSQL run store {self._shown}): {exc or type(exc).__name__}"
        error = StoreUnavailable(text.replace(self._secret, "***") if self._secret else text)
        self._monitor.failed(error, began)
        return error

    async def _ready(self) -> AsyncConnectionPool[Connection]:
        if self._pool is not None:
            return self._pool
        async with self._opening:
            if self._closed:
                raise StoreError("the PostgreSQL run store is closed")
            if self._pool is None:
                try:
                    async with await psycopg.AsyncConnection.connect(
                        self._url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S
                    ) as conn:
                        await self._migrate(conn)
                except psycopg.Error as exc:
                    if is_unavailable(exc):
                        raise self._unavailable("cannot open the run store", exc) from None
                    raise self._error("cannot open the run store", exc) from None
                _quiet_pool_logger()
                pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
                    self._url,
                    min_size=self._sizes[0],
                    max_size=self._sizes[1],
                    kwargs={"autocommit": True, "connect_timeout": _CONNECT_TIMEOUT_S},
                    check=AsyncConnectionPool.check_connection,
                    open=False,
                    name="run-store",
                    timeout=_ACQUIRE_TIMEOUT_S,
                    reconnect_timeout=_RECONNECT_TIMEOUT_S,
                )
                try:
                    await pool.open(wait=True, timeout=_CONNECT_TIMEOUT_S)
                except PoolTimeout as exc:
                    await pool.close()
                    raise self._unavailable("cannot open the connection pool", exc) from None
                self._pool = pool
        return self._pool

    @staticmethod
    async def _migrate(conn: Connection) -> None:
        """Apply the missing migrations in one transaction; the advisory lock serialises concurrent starters."""
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations"
                " (version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            cur = await conn.execute("SELECT version FROM schema_migrations")
            applied = {row[0] for row in await cur.fetchall()}
            for version, sql in enumerate(POSTGRES_MIGRATIONS, start=1):
                if version not in applied:
                    await conn.execute(sql)
                    await conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (version,))

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[Connection]:
        """A pooled connection; every call goes through here, so this is where outages are told apart.

        ``StoreUnavailable`` for a connection-level failure (counted by the outage monitor), ``StoreError``
        for any other operational error (a deadlock, a cancelled statement); a call that began after an
        outage opened and gets through ends it.
        """
        began = time.monotonic()
        pool = await self._ready()
        conn: Connection | None = None
        try:
            async with pool.connection() as conn:
                yield conn
        except PoolTimeout as exc:
            raise self._unavailable("no connection to the run store", exc, began) from None
        except psycopg.OperationalError as exc:
            if is_unavailable(exc, conn):
                raise self._unavailable("run store unavailable", exc, began) from None
            raise self._error("run store error", exc) from None
        self._monitor.succeeded(began)

    def connection(self) -> AbstractAsyncContextManager[Connection]:
        """A pooled connection (schema migrated, outages told apart) for what shares this database (memory)."""
        return self._conn()

    # --- transcript -----------------------------------------------------------------

    @staticmethod
    def _message(row: tuple[Any, ...]) -> StoredMessage:
        return StoredMessage(seq=row[0], message=Message.model_validate_json(row[1]), meta=json.loads(row[2]))

    async def put_message(
        self, conversation_id: str, seq: int, message: Message, meta: dict[str, object] | None = None
    ) -> StoredMessage:
        async with self._conn() as conn:
            # Two statements, not one: the SELECT needs a snapshot taken after a concurrent winner committed.
            cur = await conn.execute(
                "INSERT INTO transcript (conversation_id, seq, message, meta) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (conversation_id, seq) DO NOTHING RETURNING seq, message, meta",
                (conversation_id, seq, message.model_dump_json(), json.dumps(meta or {})),
            )
            row = await cur.fetchone()
            if row is None:
                cur = await conn.execute(
                    "SELECT seq, message, meta FROM transcript WHERE conversation_id = %s AND seq = %s",
                    (conversation_id, seq),
                )
                row = await cur.fetchone()
        if row is None:
            raise StoreError(f"transcript {conversation_id} entry {seq} vanished after insert")
        return self._message(row)

    async def get_message(self, conversation_id: str, seq: int) -> StoredMessage | None:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT seq, message, meta FROM transcript WHERE conversation_id = %s AND seq = %s",
                (conversation_id, seq),
            )
            row = await cur.fetchone()
        return self._message(row) if row else None

    async def messages(self, conversation_id: str, upto: int) -> list[StoredMessage]:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT seq, message, meta FROM transcript WHERE conversation_id = %s AND seq < %s ORDER BY seq",
                (conversation_id, upto),
            )
            rows = await cur.fetchall()
        found = [self._message(r) for r in rows]
        if [m.seq for m in found] != list(range(upto)):
            missing = sorted(set(range(upto)) - {m.seq for m in found})
            raise StoreError(f"transcript {conversation_id} is missing entries {missing[:10]}")
        return found

    async def transcript(self, conversation_id: str, limit: int = 100_000) -> list[StoredMessage]:
        found: list[StoredMessage] = []
        async with self._conn() as conn:
            cur = conn.cursor()
            await cur.execute(
                "SELECT seq, message, meta FROM transcript WHERE conversation_id = %s AND seq >= 0 AND seq < %s"
                " ORDER BY seq",
                (conversation_id, max(0, limit)),
            )
            async for row in cur:
                if row[0] != len(found):
                    break  # the first gap
                found.append(self._message(row))
        return found

    async def entries_after(self, conversation_id: str, after: int = -1, limit: int = 1000) -> list[StoredMessage]:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT seq, message, meta FROM transcript WHERE conversation_id = %s AND seq > %s"
                " ORDER BY seq LIMIT %s",
                (conversation_id, after, max(0, limit)),
            )
            rows = await cur.fetchall()
        return [self._message(r) for r in rows]

    async def copy_messages(self, source: str, target: str, upto: int) -> int:
        if upto < 0:
            raise ValueError(f"cannot copy up to a negative position ({upto})")
        span = "conversation_id = %s AND seq >= 0 AND seq < %s"
        async with self._conn() as conn, conn.transaction():
            # Entries are never deleted, so what this finds in the source stays there until the copy.
            cur = await conn.execute(f"SELECT seq FROM transcript WHERE {span}", (source, upto))
            present = {r[0] for r in await cur.fetchall()}
            if len(present) != upto:
                missing = sorted(set(range(upto)) - present)
                raise StoreError(f"transcript {source} is missing entries {missing[:10]}: nothing copied")
            await conn.execute(
                "INSERT INTO transcript (conversation_id, seq, message, meta)"
                f" SELECT %s, seq, message, meta FROM transcript WHERE {span}"
                " ON CONFLICT (conversation_id, seq) DO NOTHING",
                (target, source, upto),
            )
            cur = await conn.execute(f"SELECT COUNT(*) FROM transcript WHERE {span}", (target, upto))
            row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    async def conversations(self) -> list[tuple[str, float]]:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT conversation_id, EXTRACT(EPOCH FROM MAX(created_at))::float8 FROM transcript"
                " GROUP BY conversation_id ORDER BY conversation_id"
            )
            rows = await cur.fetchall()
        return [(r[0], float(r[1])) for r in rows]

    # --- ledger ---------------------------------------------------------------------

    @staticmethod
    def _entry(row: tuple[Any, ...]) -> LedgerEntry:
        return LedgerEntry(**dict(zip(_LEDGER_COLUMNS.split(", "), row, strict=True)))

    async def claim(self, request: ClaimRequest) -> Claim:
        r = request
        async with self._conn() as conn, conn.transaction():
            started = int(r.start_if_fresh)
            cur = await conn.execute(
                "INSERT INTO ledger (key, tool, args_hash, workflow_id, state, owner, attempt, lease_until, executions)"
                " VALUES (%s, %s, %s, %s, 'intent', %s, %s, %s, %s)"
                f" ON CONFLICT (key) DO NOTHING RETURNING {_LEDGER_COLUMNS}",
                (r.key, r.tool, r.args_hash, r.workflow_id, r.owner, r.attempt, time.time() + r.lease_s, started),
            )
            row = await cur.fetchone()
            if row is not None:
                return Claim(status="fresh", entry=self._entry(row))
            # The key exists (possibly just committed by a concurrent claimer): lock it and decide.
            cur = await conn.execute(f"SELECT {_LEDGER_COLUMNS} FROM ledger WHERE key = %s FOR UPDATE", (r.key,))
            row = await cur.fetchone()
            if row is None:
                raise StoreError(f"ledger key {r.key} vanished during claim")
            current = self._entry(row)
            now = time.time()
            status: ClaimStatus
            if r.force:
                status = "fresh"
            elif current.state == "done":
                return Claim(status="done", entry=current)
            elif current.state == "intent" and current.lease_until > now and current.owner != r.owner:
                return Claim(status="busy", entry=current)
            else:
                status = "recovered"
            cur = await conn.execute(
                "UPDATE ledger SET state = 'intent', owner = %s, attempt = %s, lease_until = %s,"
                " executions = executions + %s, updated_at = now()"
                f" WHERE key = %s RETURNING {_LEDGER_COLUMNS}",
                (r.owner, r.attempt, now + r.lease_s, started if status == "fresh" else 0, r.key),
            )
            row = await cur.fetchone()
        assert row is not None
        return Claim(status=status, entry=self._entry(row))

    async def started(self, key: str, owner: str) -> bool:
        async with self._conn() as conn:
            cur = await conn.execute(
                "UPDATE ledger SET executions = executions + 1 WHERE key = %s AND owner = %s", (key, owner)
            )
        return cur.rowcount == 1

    async def renew(self, key: str, owner: str, lease_s: float) -> bool:
        async with self._conn() as conn:
            cur = await conn.execute(
                "UPDATE ledger SET lease_until = %s WHERE key = %s AND owner = %s AND state = 'intent'",
                (time.time() + lease_s, key, owner),
            )
        return cur.rowcount == 1

    async def finish(
        self, key: str, owner: str, state: LedgerState, result: str, is_error: bool, note: str = ""
    ) -> None:
        async with self._conn() as conn:
            # The first recorded outcome wins: a zombie finishing late cannot overwrite it.
            await conn.execute(
                "UPDATE ledger SET state = %s, result = %s, is_error = %s, note = %s, lease_until = 0,"
                " updated_at = now() WHERE key = %s AND state != 'done'",
                (state, _text(result), is_error, _text(note), key),
            )

    async def ledger(self, workflow_id: str | None = None) -> list[LedgerEntry]:
        async with self._conn() as conn:
            if workflow_id is None:
                cur = await conn.execute(f"SELECT {_LEDGER_COLUMNS} FROM ledger ORDER BY id")
            else:
                cur = await conn.execute(
                    f"SELECT {_LEDGER_COLUMNS} FROM ledger WHERE workflow_id = %s ORDER BY id", (workflow_id,)
                )
            rows = await cur.fetchall()
        return [self._entry(r) for r in rows]

    # --- tree budget ----------------------------------------------------------------

    @staticmethod
    async def _budget_rows(conn: Connection, root: str) -> list[budget.BudgetRow]:
        cur = await conn.execute("SELECT key, settled, tokens, cost_usd, at FROM budget WHERE root = %s", (root,))
        return [budget.BudgetRow(r[0], bool(r[1]), r[2], r[3], r[4]) for r in await cur.fetchall()]

    async def budget_reserve(
        self, root: str, key: str, cap_tokens: int, cap_cost_usd: float, tokens: int = 0, cost_usd: float = 0.0
    ) -> budget.BudgetVerdict:
        now = time.time()
        async with self._conn() as conn, conn.transaction():
            # One tree's reservations are decided one at a time (a lock on the root, for this transaction).
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"budget:{root}",))
            rows = await self._budget_rows(conn, root)
            verdict = budget.decide(rows, key, cap_tokens, cap_cost_usd, now, tokens, cost_usd)
            if verdict == "granted":
                await conn.execute(
                    "INSERT INTO budget (root, key, tokens, cost_usd, at) VALUES (%s, %s, %s, %s, %s)"
                    " ON CONFLICT DO NOTHING",
                    (root, key, tokens, cost_usd, now),
                )
        return verdict

    async def budget_settle(self, root: str, key: str, tokens: int, cost_usd: float) -> None:
        async with self._conn() as conn:
            await conn.execute(
                "INSERT INTO budget (root, key, settled, tokens, cost_usd, at) VALUES (%s, %s, TRUE, %s, %s, %s)"
                " ON CONFLICT (root, key) DO UPDATE SET settled = TRUE, tokens = excluded.tokens,"
                " cost_usd = excluded.cost_usd WHERE NOT budget.settled",
                (root, key, tokens, cost_usd, time.time()),
            )

    async def budget_release(self, root: str, key: str) -> None:
        async with self._conn() as conn:
            await conn.execute("DELETE FROM budget WHERE root = %s AND key = %s AND NOT settled", (root, key))

    async def budget_spent(self, root: str) -> budget.BudgetSpent:
        async with self._conn() as conn:
            rows = await self._budget_rows(conn, root)
        return budget.spent(rows, time.time())

    # --- runs of a tree ----------------------------------------------------------------

    async def tree_run_reserve(self, root: str, key: str, cap: int) -> bool:
        async with self._conn() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"tree_runs:{root}",))
            cur = await conn.execute("SELECT 1 FROM tree_runs WHERE root = %s AND key = %s", (root, key))
            if await cur.fetchone() is not None:
                return True  # a retry of a start that already holds its place
            cur = await conn.execute("SELECT count(*) FROM tree_runs WHERE root = %s", (root,))
            row = await cur.fetchone()
            if row is not None and int(row[0]) >= cap:
                return False
            await conn.execute(
                "INSERT INTO tree_runs (root, key, at) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                (root, key, time.time()),
            )
        return True

    async def tree_runs(self, root: str) -> int:
        async with self._conn() as conn:
            cur = await conn.execute("SELECT count(*) FROM tree_runs WHERE root = %s", (root,))
            row = await cur.fetchone()
        return int(row[0]) if row is not None else 0

    async def tenant_run_reserve(self, tenant: str, workflow_id: str, cap: int) -> tuple[bool, list[str]]:
        async with self._conn() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"tenant_runs:{tenant}",))
            cur = await conn.execute(
                "SELECT 1 FROM tenant_runs WHERE tenant = %s AND workflow_id = %s", (tenant, workflow_id)
            )
            if await cur.fetchone() is not None:
                return True, []  # a retry of a start that already holds its place
            cur = await conn.execute(
                "SELECT workflow_id FROM tenant_runs WHERE tenant = %s ORDER BY workflow_id", (tenant,)
            )
            counted = [str(row[0]) for row in await cur.fetchall()]
            if len(counted) >= cap:
                return False, counted
            await conn.execute(
                "INSERT INTO tenant_runs (tenant, workflow_id, at) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                (tenant, workflow_id, time.time()),
            )
        return True, []

    async def tenant_run_release(self, tenant: str, workflow_id: str) -> bool:
        async with self._conn() as conn:
            cur = await conn.execute(
                "DELETE FROM tenant_runs WHERE tenant = %s AND workflow_id = %s", (tenant, workflow_id)
            )
            return cur.rowcount > 0

    async def tenant_runs(self, tenant: str | None = None) -> list[tuple[str, str]]:
        async with self._conn() as conn:
            if tenant is None:
                cur = await conn.execute("SELECT tenant, workflow_id FROM tenant_runs ORDER BY tenant, workflow_id")
            else:
                cur = await conn.execute(
                    "SELECT tenant, workflow_id FROM tenant_runs WHERE tenant = %s ORDER BY workflow_id", (tenant,)
                )
            return [(str(row[0]), str(row[1])) for row in await cur.fetchall()]

    # --- blobs ----------------------------------------------------------------------

    async def put_blob(self, data: bytes) -> str:
        return (await self.add_blob(data))[0]

    async def add_blob(self, data: bytes) -> tuple[str, bool]:
        # Hashing and compressing up to MAX_BLOB_BYTES takes a while: not on the event loop.
        digest, encoding, stored = await asyncio.to_thread(encode_blob, data)
        async with self._conn() as conn:
            # Same digest, same bytes: whoever inserted first stored exactly what we would.
            cur = await conn.execute(
                "INSERT INTO blobs (digest, size, encoding, data, created_at) VALUES (%s, %s, %s, %s, %s)"
                " ON CONFLICT (digest) DO NOTHING",
                (digest, len(data), encoding, stored, time.time()),
            )
            return digest, cur.rowcount == 1

    # --- checkpoint usage -----------------------------------------------------------

    async def checkpoint_usage(self, run: str) -> CheckpointUsage:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT COALESCE(SUM(bytes), 0), COUNT(*) FILTER (WHERE checkpoint_id <> %s),"
                " COALESCE(BOOL_OR(checkpoint_id = %s), FALSE) FROM checkpoint_usage WHERE run = %s",
                (STOPPED, STOPPED, run),
            )
            row = await cur.fetchone()
        assert row is not None
        return CheckpointUsage(bytes=int(row[0]), count=int(row[1]), stopped=bool(row[2]))

    async def checkpoint_record(self, run: str, checkpoint_id: str, new_bytes: int) -> None:
        async with self._conn() as conn:
            await conn.execute(
                "INSERT INTO checkpoint_usage (run, checkpoint_id, bytes, at) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT DO NOTHING",
                (run, checkpoint_id, new_bytes, time.time()),
            )

    async def get_blob(self, digest: str) -> bytes | None:
        if not is_blob_digest(digest):
            return None
        async with self._conn() as conn:
            cur = await conn.execute("SELECT size, encoding, data FROM blobs WHERE digest = %s", (digest,))
            row = await cur.fetchone()
        if row is None:
            return None
        return await asyncio.to_thread(decode_blob, digest, row[0], row[1], row[2])

    async def blob_digests(self, older_than: float) -> list[str]:
        async with self._conn() as conn:
            cur = await conn.execute("SELECT digest FROM blobs WHERE created_at < %s ORDER BY digest", (older_than,))
            rows = await cur.fetchall()
        return [r[0] for r in rows]

    async def delete_blobs(self, digests: list[str]) -> int:
        unique = sorted(set(digests))
        deleted = 0
        for start in range(0, len(unique), _DELETE_BATCH):
            batch = unique[start : start + _DELETE_BATCH]
            async with self._conn() as conn:
                cur = await conn.execute("DELETE FROM blobs WHERE digest = ANY(%s)", (batch,))
                await conn.execute("DELETE FROM blob_refs WHERE digest = ANY(%s)", (batch,))
            deleted += cur.rowcount
        return deleted

    async def close(self) -> None:
        async with self._opening:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
