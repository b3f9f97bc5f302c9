"""The ``RunStore`` interface.

Transcript entries are addressed by ``(conversation_id, seq)`` and written
insert-if-absent: the first writer of a position wins and every later writer
(a retry, a zombie attempt, a replay) reads back that same entry. This is what
lets history carry only positions while replays see exactly the same transcript.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, Field

from workflows.types import Message


class StoreError(Exception):
    """The store is unreachable or inconsistent."""


class StoredMessage(BaseModel):
    seq: int
    message: Message
    meta: dict[str, object] = Field(default_factory=dict)


class RunStore(Protocol):
    async def put_message(
        self, conversation_id: str, seq: int, message: Message, meta: dict[str, object] | None = None
    ) -> StoredMessage:
        """Store at ``seq`` unless something is there already; return what is stored there."""
        ...

    async def get_message(self, conversation_id: str, seq: int) -> StoredMessage | None: ...

    async def messages(self, conversation_id: str, upto: int) -> list[StoredMessage]:
        """Entries ``[0, upto)`` in order; ``StoreError`` if any position is missing."""
        ...

    async def close(self) -> None: ...
