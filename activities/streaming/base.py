"""What a delta is, and what both databases' channels implement."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any, Protocol

from pydantic import BaseModel

from activities.crypto.keyring import KeyRing, KeyRingError
from activities.store.base import StoreError

LISTEN_TTL_S = 20.0  # a reader's interest lasts this long unless it reads again
RETAIN_S = 600.0  # deltas of a run's earlier turns are deleted this long after they were written
MAX_ROWS_PER_RUN = 2000  # a run's newest rows are kept past this; the text is in the transcript anyway
MAX_TEXT_PER_ATTEMPT = 256 * 1024  # characters one model call may stream; the rest comes with the whole reply
READ_LIMIT = 500
_MARK = "enc1:"
_CONTEXT = b"stream-delta|"


class Delta(BaseModel):
    """One stored piece of a turn's streamed text.

    ``restart`` is set on the first delta of an attempt after the first: what earlier attempts of
    the turn streamed is to be discarded.
    """

    seq: int
    turn: int
    attempt: int
    restart: bool = False
    text: str
    created_at: float = 0.0


def delta_of(workflow_id: str, row: Sequence[Any], sealer: DeltaSealer) -> Delta:
    """A ``Delta`` from a ``(seq, turn, attempt, restart, text, created_at)`` row."""
    seq, turn, attempt, restart, text, created_at = row[:6]
    text = sealer.open(workflow_id, text)
    return Delta(seq=seq, turn=turn, attempt=attempt, restart=bool(restart), text=text, created_at=created_at)


class DeltaChannel(Protocol):
    async def append(self, workflow_id: str, turn: int, attempt: int, restart: bool, text: str) -> int:
        """Store one delta at the run's next sequence number (notifying readers); that number."""
        ...

    async def read(self, workflow_id: str, after_seq: int, limit: int = READ_LIMIT) -> list[Delta]:
        """The run's deltas with ``seq > after_seq``, in order, at most ``limit``."""
        ...

    async def wait(self, workflow_id: str, after_seq: int, timeout_s: float) -> None:
        """Return when the run may have a delta after ``after_seq``, or after ``timeout_s``."""
        ...

    async def listen(self, workflow_id: str, ttl_s: float = LISTEN_TTL_S) -> None:
        """Say someone reads the run's deltas for the next ``ttl_s`` seconds."""
        ...

    async def listening(self, workflow_id: str) -> bool:
        """Whether someone said so and its time has not run out."""
        ...

    async def prune(self, workflow_id: str, before_turn: int, older_than: float) -> int:
        """Delete the run's deltas of turns before ``before_turn`` written before unix time ``older_than``, and
        all but its newest ``MAX_ROWS_PER_RUN``; how many went."""
        ...

    async def expire(self, older_than: float) -> int:
        """Delete every run's deltas written before ``older_than`` and listeners gone by then; how many deltas."""
        ...

    async def delete(self, workflow_id: str) -> int:
        """Delete the run's deltas and listener (erasure); how many deltas."""
        ...

    async def count(self, workflow_id: str) -> int:
        """How many deltas the run has stored (a dry run of erasure)."""
        ...

    async def close(self) -> None: ...


class DeltaSealer:
    """Encrypts delta text at rest with the run store's key ring (``AGENT_PAYLOAD_KEYS``), bound to its run."""

    def __init__(self, keyring: KeyRing | None) -> None:
        self.keyring = keyring

    def seal(self, workflow_id: str, text: str) -> str:
        if self.keyring is None:
            return text
        key_id, sealed = self.keyring.encrypt(text.encode(), _CONTEXT + workflow_id.encode())
        return f"{_MARK}{key_id}:{base64.b64encode(sealed).decode()}"

    def open(self, workflow_id: str, stored: str) -> str:
        if not stored.startswith(_MARK):
            return stored  # written before encryption was turned on
        if self.keyring is None:
            raise StoreError("a streamed delta is encrypted, and no key ring is configured (AGENT_PAYLOAD_KEYS)")
        key_id, _, encoded = stored[len(_MARK) :].partition(":")
        try:
            sealed = base64.b64decode(encoded, validate=True)
            plain = self.keyring.decrypt(key_id, sealed, _CONTEXT + workflow_id.encode())
        except (binascii.Error, ValueError, KeyRingError) as exc:
            raise StoreError(f"cannot decrypt a streamed delta of {workflow_id}: {exc}") from None
        return plain.decode("utf-8", "replace")
