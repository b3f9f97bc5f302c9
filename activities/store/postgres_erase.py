"""The PostgreSQL store's part of forgetting and retention: blob references, deleting a run's rows, scrubbing.

Mixed into :class:`activities.store.postgres.PostgresRunStore`. :meth:`scrub` runs ``VACUUM`` on the
tables retention deletes from (outside a transaction: the pool's connections autocommit), so the dead
rows' space is freed instead of waiting for autovacuum; ``forget`` asks for ``VACUUM FULL`` of every
table that holds a tenant's data, because only a rewrite leaves none of a deleted row's bytes in the
tables' files (a plain ``VACUUM`` leaves them in the freed space of the page). What neither reaches
(the server's WAL, its archive, base backups, replicas) is the operator's; see ``docs/tenants.md``.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, LiteralString

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from activities.store.checkpoint_usage import STOPPED

Connection = psycopg.AsyncConnection[TupleRow]
SCRUBBED_TABLES = ("transcript", "ledger", "blobs", "blob_refs", "checkpoint_usage")
# Every table that holds a tenant's text, for ``forget``: long-term memory and streamed text live in the
# same database (the memory and streaming stores delete their rows before ``forget`` scrubs).
REWRITTEN_TABLES = (
    *SCRUBBED_TABLES,
    "memory_entries",
    "memory_terms",
    "memory_namespaces",
    "stream_deltas",
    "stream_listeners",
)


class PostgresErasure:
    if TYPE_CHECKING:

        def _conn(self) -> AbstractAsyncContextManager[Connection]: ...

    async def blob_ref(self, run: str, tenant: str, user: str, digests: list[str]) -> None:
        if not digests:
            return
        async with self._conn() as conn:
            await conn.execute(
                "INSERT INTO blob_refs (digest, run, tenant, user_name, at)"
                " SELECT d, %s, %s, %s, extract(epoch FROM now()) FROM unnest(%s::text[]) AS d"
                " ON CONFLICT DO NOTHING",
                (run, tenant, user, sorted(set(digests))),
            )

    async def blob_refs_of(self, run: str) -> list[str]:
        async with self._conn() as conn:
            cur = await conn.execute("SELECT digest FROM blob_refs WHERE run = %s ORDER BY digest", (run,))
            rows = await cur.fetchall()
        return [r[0] for r in rows]

    async def blob_ref_runs(self, digests: list[str]) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        if not digests:
            return found
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT digest, run FROM blob_refs WHERE digest = ANY(%s)", (sorted(set(digests)),)
            )
            rows = await cur.fetchall()
        for digest, run in rows:
            found.setdefault(digest, set()).add(run)
        return found

    async def _delete(self, statement: LiteralString, *params: str) -> int:
        async with self._conn() as conn:
            cur = await conn.execute(statement, params)
            return cur.rowcount

    async def delete_blob_refs(self, run: str) -> int:
        return await self._delete("DELETE FROM blob_refs WHERE run = %s", run)

    async def count_messages(self, conversation_id: str) -> int:
        async with self._conn() as conn:
            cur = await conn.execute("SELECT COUNT(*) FROM transcript WHERE conversation_id = %s", (conversation_id,))
            row = await cur.fetchone()
        return int(row[0]) if row is not None else 0

    async def delete_conversation(self, conversation_id: str) -> int:
        return await self._delete("DELETE FROM transcript WHERE conversation_id = %s", conversation_id)

    async def delete_ledger(self, workflow_id: str) -> int:
        return await self._delete("DELETE FROM ledger WHERE workflow_id = %s", workflow_id)

    async def delete_checkpoint_usage(self, run: str) -> int:
        # Counted: the checkpoints recorded, not the marker that the run's checkpoints stopped.
        await self._delete("DELETE FROM checkpoint_usage WHERE run = %s AND checkpoint_id = %s", run, STOPPED)
        return await self._delete("DELETE FROM checkpoint_usage WHERE run = %s", run)

    async def scrub(self, full: bool = False) -> bool:
        statement = sql.SQL("VACUUM FULL {}") if full else sql.SQL("VACUUM {}")
        async with self._conn() as conn:
            for table in REWRITTEN_TABLES if full else SCRUBBED_TABLES:
                await conn.execute(statement.format(sql.Identifier(table)))
        return True
