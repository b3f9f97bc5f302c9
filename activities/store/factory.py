"""Open the run store named by ``AGENT_STORE_URL``."""

from __future__ import annotations

from activities.store.base import RunStore, StoreError
from activities.store.sqlite import SQLiteRunStore


def open_store(url: str) -> RunStore:
    """A SQLite path (or ``sqlite:///path``) opens the embedded store.

    ``postgresql://`` URLs are reserved for the PostgreSQL backend.
    """
    if url.startswith(("postgresql://", "postgres://")):
        raise StoreError("the PostgreSQL run store is not available in this version; use a SQLite path")
    path = url.removeprefix("sqlite:///").removeprefix("sqlite://")
    return SQLiteRunStore(path)
