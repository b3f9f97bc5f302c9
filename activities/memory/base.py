"""What a memory store is: ``MemoryEntry``, the ``MemoryStore`` protocol, its bounds and its one error.

A namespace is the (tenant, user) pair of a run, matched exactly: ``""`` is a value of its own (unset),
never a wildcard. Every call names its namespace; nothing reads across two of them except the
operator's ``list(tenant, None)``, ``forget(tenant, None)`` and ``count(tenant, None)``, which cover a
whole tenant.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

MAX_TEXT_BYTES = 8 * 1024  # one entry's text, UTF-8
MAX_KEY_CHARS = 128
MAX_QUERY_CHARS = 2000
MAX_QUERY_TERMS = 32  # of a search query's distinct terms, the first ones are used
MAX_LIMIT = 100  # entries one search or list returns (the tool allows 20)


class MemoryStoreError(Exception):
    """A call the store refuses (over a bound, a bad key or text): its message is for the model or operator."""


class MemoryEntry(BaseModel):
    """One remembered text of a namespace, as a save returns it or a search or list finds it."""

    key: str
    text: str
    created_at: float  # unix time of the save that wrote this text
    expires_at: float | None = None  # None: never (AGENT_MEMORY_TTL_DAYS unset)
    score: float = 0.0  # search only: higher is a better match
    user: str = ""  # the namespace's user (what a tenant-wide list tells apart)


@dataclass(frozen=True)
class MemoryLimits:
    """Per namespace: entries, bytes of text in all; and how long an entry lives (None: for ever)."""

    max_entries: int = 10_000
    max_bytes: int = 64 * 1024 * 1024
    ttl_s: float | None = None


class MemoryStore(Protocol):
    """Long-term memory by namespace (tenant, user); ``ctx.memory`` in a tool. Both databases' stores
    (``activities.memory.sqlite``, ``activities.memory.postgres``) have these methods, encrypted or not."""

    async def save(self, tenant: str, user: str, key: str, text: str, idem_key: str) -> MemoryEntry:
        """Store ``text`` under ``key`` ("": one derived from ``idem_key``), replacing the key's text.

        Idempotent by ``idem_key``: a second call with it stores nothing and returns the entry as it is.
        """
        ...

    async def search(self, tenant: str, user: str, query: str, limit: int) -> list[MemoryEntry]:
        """The namespace's entries that share a term with ``query``, best match first ([] for no terms)."""
        ...

    async def delete(self, tenant: str, user: str, key: str) -> bool: ...

    async def list(self, tenant: str, user: str | None, limit: int) -> list[MemoryEntry]:
        """Newest first; ``user=None``: every user of the tenant."""
        ...

    async def expire(self, now: float) -> int:
        """Delete every entry (of any namespace) whose ``expires_at`` is past ``now``; how many."""
        ...

    async def forget(self, tenant: str, user: str | None) -> int:
        """Delete the namespace's entries (``user=None``: the whole tenant's), unrecoverably; how many."""
        ...

    async def count(self, tenant: str, user: str | None) -> int: ...

    async def close(self) -> None: ...


def check_key(key: str) -> str:
    """``key`` if it is a usable entry key; ``MemoryStoreError`` saying why not."""
    if not key or len(key) > MAX_KEY_CHARS:
        raise MemoryStoreError(f"a memory key is 1-{MAX_KEY_CHARS} characters")
    if not key.isprintable():
        raise MemoryStoreError("a memory key may not hold control characters")
    return key


def check_text(text: str) -> str:
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise MemoryStoreError("a memory entry's text is not valid Unicode (a lone surrogate)") from None
    if not text.strip():
        raise MemoryStoreError("a memory entry needs some text")
    if size > MAX_TEXT_BYTES:
        raise MemoryStoreError(f"a memory entry is at most {MAX_TEXT_BYTES} bytes of text; this one is {size}")
    return text


def key_for(idem_key: str) -> str:
    """The key of a save that names none: derived from its idempotency key, so a retry gets the same one."""
    return "m-" + hashlib.sha256(idem_key.encode()).hexdigest()[:12]


def bound_limit(limit: int) -> int:
    return max(1, min(int(limit), MAX_LIMIT))


def over_bounds(limits: MemoryLimits, entries: int, size: int, new_size: int) -> str:
    """Why a namespace holding ``entries`` entries of ``size`` bytes (the replaced one not counted) cannot take
    one of ``new_size`` bytes more, or ``""``."""
    if entries + 1 > limits.max_entries:
        return (
            f"memory is full: this namespace holds {entries} entries, the limit (AGENT_MEMORY_MAX_ENTRIES) is "
            f"{limits.max_entries}; delete some with memory_delete first"
        )
    if size + new_size > limits.max_bytes:
        return (
            f"memory is full: this namespace's entries hold {size} bytes, the limit (AGENT_MEMORY_MAX_MB) is "
            f"{limits.max_bytes} bytes; delete some with memory_delete first"
        )
    return ""


def deleted_totals(rows: Sequence[Sequence[Any]]) -> dict[tuple[str, str], tuple[int, int, int]]:
    """Entries, bytes and terms deleted per namespace, from rows of (id, tenant, user, size, length)."""
    totals: dict[tuple[str, str], tuple[int, int, int]] = {}
    for _, tenant, user, size, length in rows:
        entries, total, terms = totals.get((tenant, user), (0, 0, 0))
        totals[(tenant, user)] = (entries + 1, total + int(size), terms + int(length))
    return totals
