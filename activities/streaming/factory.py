"""Open the delta channel beside the run store named by ``AGENT_STORE_URL`` (same file or database)."""

from __future__ import annotations

from activities.settings import Settings
from activities.store_urls import is_postgres, sqlite_path
from activities.streaming.base import DeltaChannel, DeltaSealer


def open_channel(settings: Settings) -> DeltaChannel:
    """The channel of ``settings``' run store, its text sealed when ``AGENT_PAYLOAD_KEYS`` is set.

    PostgreSQL connects (and migrates) on first use; SQLite opens its file here.
    """
    sealer = DeltaSealer(settings.encryption.keyring)
    if is_postgres(settings.store_url):
        from activities.streaming.postgres import PostgresDeltaChannel

        return PostgresDeltaChannel(settings.store_url, sealer)
    from activities.streaming.sqlite import SQLiteDeltaChannel

    return SQLiteDeltaChannel(sqlite_path(settings.store_url), sealer)
