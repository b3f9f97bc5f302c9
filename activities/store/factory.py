"""Open the run store named by ``AGENT_STORE_URL``."""

from __future__ import annotations

from activities.store.base import RunStore
from activities.store.sqlite import SQLiteRunStore


def open_store(url: str) -> RunStore:
    """A SQLite path (or ``sqlite:///path``) opens the embedded store; a ``postgresql://`` URL the shared one.

    Neither connects here: the PostgreSQL store opens its pool (and migrates) on first use.
    """
    if url.startswith(("postgresql://", "postgres://")):
        from activities.store.postgres import PostgresRunStore

        return PostgresRunStore(url)
    path = url.removeprefix("sqlite:///").removeprefix("sqlite://")
    return SQLiteRunStore(path)


def display_url(url: str) -> str:
    """The store URL as logs may show it (a PostgreSQL password is masked)."""
    if url.startswith(("postgresql://", "postgres://")):
        from activities.store.postgres import redact_url

        return redact_url(url)
    return url
