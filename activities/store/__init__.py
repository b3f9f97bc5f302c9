"""The run store: transcripts (and, later, the idempotency ledger) outside workflow history."""

from activities.store.base import RunStore, StoredMessage, StoreError
from activities.store.factory import open_store

__all__ = ["RunStore", "StoreError", "StoredMessage", "open_store"]
