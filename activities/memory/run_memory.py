"""``RunMemory``: long-term memory as a tool sees it (``ctx.memory``), bound to its run's namespace.

A tool cannot name a namespace: the (tenant, user) pair is the run's, set by the runtime from the
invocation, so an operator's tool given a model's arguments cannot be talked into another tenant's
entries. Operators reach every namespace through ``durable-agents memory`` and ``forget`` instead.
"""

from __future__ import annotations

from collections.abc import Callable

from activities.memory.base import MemoryEntry, MemoryStore


class RunMemory:
    """The run's own (tenant, user) namespace of the worker's memory store, opened on first use."""

    def __init__(self, store: Callable[[], MemoryStore], tenant: str, user: str) -> None:
        self._store = store
        self.tenant = tenant
        self.user = user

    async def save(self, text: str, *, idempotency_key: str, key: str = "") -> MemoryEntry:
        """Store ``text`` under ``key`` ("": one derived from ``idempotency_key``), replacing that key's text.

        A second save with the same ``idempotency_key`` (a retry) stores nothing and returns the entry.
        ``MemoryStoreError`` over a bound (entry size, ``AGENT_MEMORY_MAX_ENTRIES``, ``AGENT_MEMORY_MAX_MB``).
        """
        return await self._store().save(self.tenant, self.user, key, text, idempotency_key)

    async def search(self, query: str, limit: int = 5) -> list[MemoryEntry]:
        """The entries that share a word with ``query``, best match first ([] for a query without words)."""
        return await self._store().search(self.tenant, self.user, query, limit)

    async def delete(self, key: str) -> bool:
        """Delete the entry under ``key``; whether there was one."""
        return await self._store().delete(self.tenant, self.user, key)

    async def list(self, limit: int = 50) -> list[MemoryEntry]:
        """The namespace's entries, newest first."""
        return await self._store().list(self.tenant, self.user, limit)


__all__ = ["RunMemory"]
