"""Long-term memory in the PostgreSQL run store's database: ``tsvector`` + GIN (``ts_rank``) for plaintext
entries, the keyed term index for sealed ones.

Connections come from a ``PostgresRunStore`` of its own (same URL), which migrates the schema on first
use and tells outages (``StoreUnavailable``) from other errors. Saves of one namespace are serialised
by a row lock on its ``memory_namespaces`` row, so the bounds hold under concurrent saves.

Deleted rows stay in the tables' files as dead tuples until a ``VACUUM``: ``forget`` and ``expire`` run
one on the memory tables after deleting, which frees their space without overwriting it; the run
store's ``forget`` then rewrites the tables (``VACUUM FULL``, ``RunStore.scrub(full=True)``). PostgreSQL's
WAL can still hold the bytes until it is recycled; only encryption at rest makes them unreadable there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

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
from activities.memory.terms import query_terms, term_counts, terms, tsquery_text
from activities.store.base import StoreError
from activities.store.postgres import Connection, PostgresRunStore

_COLUMNS = "e.id, e.key, e.text, e.created_at, e.expires_at, e.tenant, e.user_name"
_LIVE = "(e.expires_at IS NULL OR e.expires_at > %s)"
# 'simple': no stemming or stop words; the text it gets is already our terms (activities.memory.terms).
_CONFIG = "simple"


def _text(value: str) -> str:
    return value.replace("\x00", "\ufffd")  # a text column cannot hold NUL


class PostgresMemoryStore:
    def __init__(
        self,
        url: str,
        sealer: Sealer | None = None,
        limits: MemoryLimits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._db = PostgresRunStore(url, min_size=1, max_size=4)
        self.sealer = sealer
        self.limits = limits or MemoryLimits()
        self.clock = clock

    def _entry(self, row: Sequence[Any], score: float = 0.0) -> MemoryEntry:
        _, key, text, created_at, expires_at, tenant, user = row[:7]
        if self.sealer is not None:
            text = self.sealer.open(tenant, user, text, key)
        elif text.startswith(MARK):
            raise StoreError(f"memory entry {key!r} is encrypted, and no key ring is configured (AGENT_PAYLOAD_KEYS)")
        return MemoryEntry(
            key=key, text=text, created_at=created_at, expires_at=expires_at, user=user, score=float(score)
        )

    # --- save ----------------------------------------------------------------------

    async def save(self, tenant: str, user: str, key: str, text: str, idem_key: str) -> MemoryEntry:
        text = _text(check_text(text))
        key = check_key(key or key_for(idem_key))
        async with self._db.connection() as conn, conn.transaction():
            return await self._save(conn, tenant, user, key, text, idem_key)

    async def _save(self, conn: Connection, tenant: str, user: str, key: str, text: str, idem_key: str) -> MemoryEntry:
        await conn.execute(
            "INSERT INTO memory_namespaces (tenant, user_name) VALUES (%s, %s) ON CONFLICT DO NOTHING", (tenant, user)
        )
        cur = await conn.execute(
            "SELECT entries, bytes FROM memory_namespaces WHERE tenant = %s AND user_name = %s FOR UPDATE",
            (tenant, user),
        )
        usage = await cur.fetchone()
        assert usage is not None
        entries, used = int(usage[0]), int(usage[1])
        cur = await conn.execute(
            f"SELECT {_COLUMNS} FROM memory_entries e WHERE tenant = %s AND user_name = %s AND idem_key = %s",
            (tenant, user, idem_key),
        )
        done = await cur.fetchone()
        if done is not None:
            return self._entry(done)  # a retry of a save that happened
        cur = await conn.execute(
            "SELECT id, size, length FROM memory_entries WHERE tenant = %s AND user_name = %s AND key = %s",
            (tenant, user, key),
        )
        old = await cur.fetchone()
        if old is not None:
            entries, used = entries - 1, used - int(old[1])
        why = over_bounds(self.limits, entries, used, len(text.encode()))
        if why:
            raise MemoryStoreError(why)
        if old is not None:
            await conn.execute("DELETE FROM memory_terms WHERE entry = %s", (old[0],))
            await conn.execute("DELETE FROM memory_entries WHERE id = %s", (old[0],))
            await self._account(conn, tenant, user, -1, -int(old[1]), -int(old[2]))
        counts, length = term_counts(text)
        # Our own terms, not PostgreSQL's parser's (which keeps "3.12", URLs or e-mail addresses whole): the
        # query is cut into words the same way, so every word of the text can be found.
        words = " ".join(terms(text))
        size = len(text.encode())
        now = self.clock()
        expires = None if self.limits.ttl_s is None else now + self.limits.ttl_s
        sealer = self.sealer
        sealed = sealer is not None
        stored = text if sealer is None else sealer.seal(tenant, user, text)
        cur = await conn.execute(
            "INSERT INTO memory_entries (tenant, user_name, key, idem_key, text, size, length, sealed, created_at,"
            " expires_at, tsv) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
            f" CASE WHEN %s THEN NULL ELSE to_tsvector('{_CONFIG}', %s) END) RETURNING id",
            (tenant, user, key, idem_key, stored, size, length, sealed, now, expires, sealed, "" if sealed else words),
        )
        row = await cur.fetchone()
        assert row is not None
        if sealer is not None:
            async with conn.cursor() as many:
                await many.executemany(
                    "INSERT INTO memory_terms (term, entry, tf) VALUES (%s, %s, %s)",
                    [(sealer.term_hash(tenant, user, term), row[0], tf) for term, tf in counts.items()],
                )
        await self._account(conn, tenant, user, 1, size, length)
        return MemoryEntry(key=key, text=text, created_at=now, expires_at=expires, user=user)

    @staticmethod
    async def _account(conn: Connection, tenant: str, user: str, entries: int, size: int, length: int) -> None:
        await conn.execute(
            "UPDATE memory_namespaces SET entries = entries + %s, bytes = bytes + %s, terms = terms + %s"
            " WHERE tenant = %s AND user_name = %s",
            (entries, size, length, tenant, user),
        )

    # --- search and list -------------------------------------------------------------

    async def search(self, tenant: str, user: str, query: str, limit: int) -> list[MemoryEntry]:
        words = query_terms(query)
        if not words:
            return []
        limit = bound_limit(limit)
        now = self.clock()
        async with self._db.connection() as conn:
            if self.sealer is None:
                cur = await conn.execute(
                    f"SELECT {_COLUMNS}, ts_rank(e.tsv, q) AS rank"
                    f" FROM memory_entries e, to_tsquery('{_CONFIG}', %s) q"
                    f" WHERE e.tsv @@ q AND e.tenant = %s AND e.user_name = %s AND {_LIVE}"
                    " ORDER BY rank DESC, e.id DESC LIMIT %s",
                    (tsquery_text(words), tenant, user, now, limit),
                )
                return [self._entry(row, row[7]) for row in await cur.fetchall()]
            hashes = [h for word in words for h in self.sealer.query_hashes(tenant, user, word)]
            cur = await conn.execute(
                "SELECT term, COUNT(*) FROM memory_terms WHERE term = ANY(%s) GROUP BY term", (hashes,)
            )
            frequencies = {bytes(term): int(count) for term, count in await cur.fetchall()}
            if not frequencies:
                return []
            cur = await conn.execute(
                "SELECT entries, terms FROM memory_namespaces WHERE tenant = %s AND user_name = %s", (tenant, user)
            )
            usage = await cur.fetchone()
            weights = scoring.weights(scoring.selective(frequencies, int(usage[0]) if usage else 0), usage)
            cur = await conn.execute(
                scoring.keyed_query(_COLUMNS, "%s", len(weights)),
                [*scoring.flat(weights), scoring.avg_length(usage), tenant, user, now, limit],
            )
            return [self._entry(row, row[7]) for row in await cur.fetchall()]

    async def list(self, tenant: str, user: str | None, limit: int) -> list[MemoryEntry]:
        where, params = _namespace(tenant, user)
        async with self._db.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_COLUMNS} FROM memory_entries e WHERE {where} AND {_LIVE}"
                " ORDER BY e.created_at DESC, e.id DESC LIMIT %s",
                (*params, self.clock(), bound_limit(limit)),
            )
            return [self._entry(row) for row in await cur.fetchall()]

    async def count(self, tenant: str, user: str | None) -> int:
        where, params = _namespace(tenant, user)
        async with self._db.connection() as conn:
            cur = await conn.execute(f"SELECT COUNT(*) FROM memory_entries e WHERE {where}", params)
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    # --- deleting ----------------------------------------------------------------------

    async def delete(self, tenant: str, user: str, key: str) -> bool:
        where = "e.tenant = %s AND e.user_name = %s AND e.key = %s"
        return await self._delete_where(where, (tenant, user, key), vacuum=False) > 0

    async def forget(self, tenant: str, user: str | None) -> int:
        where, params = _namespace(tenant, user)
        return await self._delete_where(where, params, vacuum=True)

    async def expire(self, now: float) -> int:
        where = "e.expires_at IS NOT NULL AND e.expires_at <= %s"
        return await self._delete_where(where, (now,), vacuum=True)

    async def _delete_where(self, where: str, params: tuple[Any, ...], *, vacuum: bool) -> int:
        async with self._db.connection() as conn:
            async with conn.transaction():
                cur = await conn.execute(
                    f"DELETE FROM memory_entries e WHERE {where}"
                    " RETURNING e.id, e.tenant, e.user_name, e.size, e.length",
                    params,
                )
                rows = await cur.fetchall()
                if rows:
                    await conn.execute("DELETE FROM memory_terms WHERE entry = ANY(%s)", ([r[0] for r in rows],))
                for (tenant, user), (entries, size, length) in deleted_totals(rows).items():
                    await self._account(conn, tenant, user, -entries, -size, -length)
                await conn.execute("DELETE FROM memory_namespaces WHERE entries <= 0")
            if rows and vacuum:
                # Outside any transaction (the pool's connections are autocommit). A role that does not own
                # the tables gets a warning, not an error: autovacuum removes the dead rows later.
                await conn.execute("VACUUM memory_entries, memory_terms, memory_namespaces")
        return len(rows)

    async def close(self) -> None:
        await self._db.close()


def _namespace(tenant: str, user: str | None) -> tuple[str, tuple[str, ...]]:
    if user is None:
        return "e.tenant = %s", (tenant,)
    return "e.tenant = %s AND e.user_name = %s", (tenant, user)
