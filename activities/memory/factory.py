"""Open long-term memory beside the run store named by ``AGENT_STORE_URL`` (same file or database)."""

from __future__ import annotations

from activities.memory.base import MemoryLimits, MemoryStore
from activities.memory.sealing import Sealer
from activities.settings import Settings
from activities.store_urls import is_postgres, sqlite_path


def limits_of(settings: Settings) -> MemoryLimits:
    memory = settings.memory
    return MemoryLimits(max_entries=memory.max_entries, max_bytes=memory.max_bytes, ttl_s=memory.ttl_s)


def open_memory(settings: Settings) -> MemoryStore:
    """The memory store of ``settings``' run store, sealed when ``AGENT_PAYLOAD_KEYS`` is set.

    The PostgreSQL one connects (and applies missing migrations) on first use; SQLite opens its file here.
    """
    keyring = settings.encryption.keyring
    sealer = Sealer(keyring) if keyring is not None else None
    url = settings.store_url
    if is_postgres(url):
        from activities.memory.postgres import PostgresMemoryStore

        return PostgresMemoryStore(url, sealer, limits_of(settings))
    from activities.memory.sqlite import SQLiteMemoryStore

    return SQLiteMemoryStore(sqlite_path(url), sealer, limits_of(settings))
