"""Open the run store named by ``AGENT_STORE_URL`` (encrypted at rest when a key ring is configured)."""

from __future__ import annotations

from activities.crypto.keyring import KeyRing
from activities.store.base import RunStore
from activities.store.sqlite import SQLiteRunStore
from activities.store_urls import is_postgres, sqlite_path


def open_store(url: str, keyring: KeyRing | None = None) -> RunStore:
    """A SQLite path (or ``sqlite:///path``) opens the embedded store; a ``postgresql://`` URL or a libpq
    conninfo (``host=... dbname=...``) the shared one; ``StoreUrlError`` for a path that looks like connection
    settings (see :mod:`activities.store_urls`).
    With ``keyring`` (``AGENT_PAYLOAD_KEYS``) it is wrapped in an ``EncryptedRunStore``.

    Neither connects here: the PostgreSQL store opens its pool (and migrates) on first use.
    """
    store: RunStore
    if is_postgres(url):
        _require_postgres()
        from activities.store.postgres import PostgresRunStore

        store = PostgresRunStore(url)
    else:
        store = SQLiteRunStore(sqlite_path(url))
    if keyring is None:
        return store
    from activities.store.encrypted import EncryptedRunStore

    return EncryptedRunStore(store, keyring)


def display_url(url: str) -> str:
    """The store URL as logs may show it (a PostgreSQL password is masked)."""
    if is_postgres(url):
        _require_postgres()
        from activities.store.postgres import redact_url

        return redact_url(url)
    return url


def _require_postgres() -> None:
    from activities.extras import require

    for module in ("psycopg", "psycopg_pool"):
        require(module, "postgres", "AGENT_STORE_URL (a PostgreSQL run store)")
