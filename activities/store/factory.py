"""Open the run store named by ``AGENT_STORE_URL`` (encrypted at rest when a key ring is configured)."""

from __future__ import annotations

from activities.crypto.keyring import KeyRing
from activities.store.base import RunStore
from activities.store.sqlite import SQLiteRunStore


def open_store(url: str, keyring: KeyRing | None = None) -> RunStore:
    """A SQLite path (or ``sqlite:///path``) opens the embedded store; a ``postgresql://`` URL the shared one.
    With ``keyring`` (``AGENT_PAYLOAD_KEYS``) it is wrapped in an ``EncryptedRunStore``.

    Neither connects here: the PostgreSQL store opens its pool (and migrates) on first use.
    """
    store: RunStore
    if url.startswith(("postgresql://", "postgres://")):
        from activities.store.postgres import PostgresRunStore

        store = PostgresRunStore(url)
    else:
        path = url.removeprefix("sqlite:///").removeprefix("sqlite://")
        store = SQLiteRunStore(path)
    if keyring is None:
        return store
    from activities.store.encrypted import EncryptedRunStore

    return EncryptedRunStore(store, keyring)


def display_url(url: str) -> str:
    """The store URL as logs may show it (a PostgreSQL password is masked)."""
    if url.startswith(("postgresql://", "postgres://")):
        from activities.store.postgres import redact_url

        return redact_url(url)
    return url
