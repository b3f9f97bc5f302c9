"""Long-term memory: entries a run's tools save and search in the namespace (tenant, user) of the run.

``open_memory(settings)`` opens the store beside the run store (same SQLite file or PostgreSQL database);
:mod:`activities.memory.base` is its interface, :mod:`activities.memory.sqlite` and
:mod:`activities.memory.postgres` the two databases, :mod:`activities.memory.sealing` the encryption at rest.
"""

from activities.memory.base import MemoryEntry, MemoryLimits, MemoryStore, MemoryStoreError
from activities.memory.factory import open_memory
from activities.memory.run_memory import RunMemory

__all__ = ["MemoryEntry", "MemoryLimits", "MemoryStore", "MemoryStoreError", "RunMemory", "open_memory"]
