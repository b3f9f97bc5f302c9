"""The ``RunStore`` interface: transcripts and the idempotency ledger.

Transcript entries are addressed by ``(conversation_id, seq)`` and written
insert-if-absent: the first writer of a position wins and every later writer
(a retry, a zombie attempt, a replay) reads back that same entry. This is what
lets history carry only positions while replays see exactly the same transcript.

Ledger entries are addressed by idempotency key (see ``activities.store.ledger``).

Budget rows are one per model turn of a tree of runs, under the tree's root (see
``activities.store.budget``).
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, Field

from activities.store.budget import BudgetSpent, BudgetVerdict
from activities.store.ledger import Claim, ClaimRequest, LedgerEntry, LedgerState
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

    async def claim(self, request: ClaimRequest) -> Claim:
        """Atomically record intent for ``request.key`` or report who holds it (see ``Claim``)."""
        ...

    async def started(self, key: str, owner: str) -> None:
        """Count one started execution of the side effect (called right before it)."""
        ...

    async def renew(self, key: str, owner: str, lease_s: float) -> bool:
        """Extend the holder's lease; False when ``owner`` no longer holds the key."""
        ...

    async def finish(
        self, key: str, owner: str, state: LedgerState, result: str, is_error: bool, note: str = ""
    ) -> None:
        """Record the outcome (``done``) or that it is unknown (``unknown``)."""
        ...

    async def ledger(self, workflow_id: str | None = None) -> list[LedgerEntry]:
        """Entries, optionally of one workflow (inspection and tests)."""
        ...

    async def budget_reserve(self, root: str, key: str, cap_tokens: int, cap_cost_usd: float) -> BudgetVerdict:
        """Reserve model turn ``key`` under the tree budget ``root`` (see ``activities.store.budget``)."""
        ...

    async def budget_settle(self, root: str, key: str, tokens: int, cost_usd: float) -> None:
        """Record what turn ``key`` spent (idempotent: the first settlement wins)."""
        ...

    async def budget_release(self, root: str, key: str) -> None:
        """Drop turn ``key``'s reservation unless it was settled (its model call failed)."""
        ...

    async def budget_spent(self, root: str) -> BudgetSpent:
        """What the tree ``root`` has spent (inspection and tests)."""
        ...

    async def close(self) -> None: ...
