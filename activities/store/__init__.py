"""The run store: transcripts (and, later, the idempotency ledger) outside workflow history."""

from activities.store.base import RunStore, StoredMessage, StoreError, StoreUnavailable
from activities.store.factory import open_store

__all__ = ["RunStore", "StoreError", "StoreUnavailable", "StoredMessage", "open_store"]
