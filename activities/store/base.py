"""The ``RunStore`` interface: transcripts and the idempotency ledger.

Transcript entries are addressed by ``(conversation_id, seq)`` and written
insert-if-absent: the first writer of a position wins and every later writer
(a retry, a zombie attempt, a replay) reads back that same entry. This is what
lets history carry only positions while replays see exactly the same transcript.
Entries are never updated or deleted; each records when it was written (a copy
into a fork is a write to the fork, so it is stamped when it is copied).

Ledger entries are addressed by idempotency key (see ``activities.store.ledger``).

Budget rows are one per model turn of a tree of runs, under the tree's root (see
``activities.store.budget``); tree-run rows one per sub-agent run a tree started, under the same root.
Tenant-run rows are one per open top-level run or session of a tenant (``AGENT_TENANT_MAX_OPEN_RUNS``).

Blobs are content-addressed: stored once under ``"sha256:<64 hex>"`` of their
bytes, zlib-compressed when that makes them smaller, and checked against that
digest whenever they are read back (the helpers below are shared by both stores).
"""

from __future__ import annotations

import hashlib
import re
import zlib
from typing import Literal, Protocol

from pydantic import BaseModel, Field

from activities.store.budget import BudgetSpent, BudgetVerdict
from activities.store.checkpoint_usage import CheckpointUsage
from activities.store.ledger import Claim, ClaimRequest, LedgerEntry, LedgerState
from workflows.types import Message

# The meta keys of a session conversation's first entry: whose conversation it is (activities.sessions).
TENANT_META = "tenant"
USER_META = "user"
MAX_BLOB_BYTES = 64 * 1024 * 1024
_BLOB_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_SAMPLE_BYTES = 64 * 1024
_BLOB_ZLIB_LEVEL = 6

BlobEncoding = Literal["zlib", "raw"]


class StoreError(Exception):
    """The store is unreachable or inconsistent."""


class StoreUnavailable(StoreError):
    """The store could not be reached: a connection-level failure (PostgreSQL down or restarting, no pooled
    connection within the acquire timeout; SQLite locked past its busy timeout).

    Never raised for a logic error (a missing transcript entry, a corrupt blob, a constraint): those are
    plain ``StoreError`` instances. An operation that raised it may or may not have been applied (a commit whose
    answer was lost), so callers treat it like any failed write: retry it, idempotently.
    """


class BlobCorrupt(StoreError):
    """A stored blob row is not the bytes of its digest (the store itself answered: it is not unreachable)."""


class StoredMessage(BaseModel):
    seq: int
    message: Message
    meta: dict[str, object] = Field(default_factory=dict)


def blob_digest(data: bytes) -> str:
    """``"sha256:<64 lowercase hex>"`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_blob_digest(value: object) -> bool:
    """Whether ``value`` is a well-formed blob digest (``sha256:`` then 64 lowercase hex digits)."""
    return isinstance(value, str) and _BLOB_DIGEST.fullmatch(value) is not None


def encode_blob(data: bytes) -> tuple[str, BlobEncoding, bytes]:
    """``(digest, encoding, stored bytes)`` for ``data``: zlib when that is smaller, else ``data`` as it is.

    ``ValueError`` when ``data`` is over ``MAX_BLOB_BYTES``.
    """
    if len(data) > MAX_BLOB_BYTES:
        raise ValueError(f"blob of {len(data)} bytes is over the limit of {MAX_BLOB_BYTES} bytes")
    data = bytes(data)
    if len(data) > _SAMPLE_BYTES * 4:
        # Compressing megabytes that do not compress (archives, images, random data) costs ~30 ms/MB for
        # nothing: a sample says whether the whole is worth trying.
        sample = data[: _SAMPLE_BYTES // 2] + data[len(data) // 2 : len(data) // 2 + _SAMPLE_BYTES // 2]
        if len(zlib.compress(sample, 1)) > len(sample) * 0.9:
            return blob_digest(data), "raw", data
    packed = zlib.compress(data, _BLOB_ZLIB_LEVEL)
    if len(packed) < len(data):
        return blob_digest(data), "zlib", packed
    return blob_digest(data), "raw", data


def decode_blob(digest: str, size: int, encoding: str, stored: bytes) -> bytes:
    """The original bytes of a stored blob row; ``BlobCorrupt`` naming ``digest`` unless they are its bytes."""
    if encoding == "raw":
        data = bytes(stored)
    elif encoding == "zlib":
        inflater = zlib.decompressobj()
        try:
            # Inflate at most one byte past the recorded size: a corrupted row must not expand without bound
            # (the +1 also keeps the limit positive, since 0 would mean no limit at all).
            data = inflater.decompress(stored, max(0, min(size, MAX_BLOB_BYTES)) + 1)
        except zlib.error as exc:
            raise BlobCorrupt(f"blob {digest} is corrupt: cannot inflate it ({exc})") from None
    else:
        raise BlobCorrupt(f"blob {digest} is corrupt: unknown encoding {encoding!r}")
    if len(data) != size:
        raise BlobCorrupt(f"blob {digest} is corrupt: {len(data)} bytes where {size} were stored")
    actual = blob_digest(data)
    if actual != digest:
        raise BlobCorrupt(f"blob {digest} is corrupt: its bytes hash to {actual}")
    return data


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

    async def transcript(self, conversation_id: str, limit: int = 100_000) -> list[StoredMessage]:
        """The contiguous entries from seq 0, in order, at most ``limit``: it stops at the first missing position."""
        ...

    async def entries_after(self, conversation_id: str, after: int = -1, limit: int = 1000) -> list[StoredMessage]:
        """Every stored entry with ``seq > after``, in order, gaps and all, at most ``limit``.

        For reading a whole conversation a page at a time (garbage collection must see every entry,
        including those past a gap or a tool result written before its sibling).
        """
        ...

    async def copy_messages(self, source: str, target: str, upto: int) -> int:
        """Copy entries ``[0, upto)`` of ``source`` (message and meta) into ``target``, insert-if-absent.

        One transaction: ``StoreError`` naming the missing positions, and nothing copied, when ``source``
        lacks any of them. A position ``target`` holds already keeps its entry (the first writer wins, as
        for ``put_message``). Idempotent. Returns how many of the positions ``[0, upto)`` ``target`` now
        holds, which after a successful copy is ``upto``. ``ValueError`` for a negative ``upto``.
        """
        ...

    async def conversations(self) -> list[tuple[str, float]]:
        """Every conversation id with the unix time of its last write (its newest entry), sorted by id.

        The SQLite store keeps entry times to the second.
        """
        ...

    async def claim(self, request: ClaimRequest) -> Claim:
        """Atomically record intent for ``request.key`` or report who holds it (see ``Claim``).

        With ``request.start_if_fresh``, a ``fresh`` claim also counts one started execution (as ``started``).
        """
        ...

    async def started(self, key: str, owner: str) -> bool:
        """Count one started execution of the side effect (called right before it).

        False (and nothing counted) when ``owner`` no longer holds the key: the caller must not start it.
        """
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

    async def budget_reserve(
        self, root: str, key: str, cap_tokens: int, cap_cost_usd: float, tokens: int = 0, cost_usd: float = 0.0
    ) -> BudgetVerdict:
        """Reserve model turn ``key`` (at most ``tokens`` and ``cost_usd``) under the tree budget ``root``
        (see ``activities.store.budget``)."""
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

    async def tree_run_reserve(self, root: str, key: str, cap: int) -> bool:
        """Count run ``key`` (a sub-agent's workflow id) among the runs the tree ``root`` started, if fewer than
        ``cap`` are counted; whether it is counted (idempotent: a key counted already is granted again)."""
        ...

    async def tree_runs(self, root: str) -> int:
        """How many runs the tree ``root`` has started (inspection and tests)."""
        ...

    async def tenant_run_reserve(self, tenant: str, workflow_id: str, cap: int) -> tuple[bool, list[str]]:
        """Count the open run ``workflow_id`` among ``tenant``'s if fewer than ``cap`` are counted.

        ``(granted, counted)``: whether it is counted (a run counted already is granted again: a retry, a
        replay) and the workflow ids counted for the tenant when it was not (for telling which runs hold
        the places, and for checking whether they are really still open).
        """
        ...

    async def tenant_run_release(self, tenant: str, workflow_id: str) -> bool:
        """Stop counting ``workflow_id`` among ``tenant``'s open runs; whether it was counted."""
        ...

    async def tenant_runs(self, tenant: str | None = None) -> list[tuple[str, str]]:
        """``(tenant, workflow_id)`` of the counted open runs (of one tenant), sorted."""
        ...

    async def put_blob(self, data: bytes) -> str:
        """Store ``data`` once under its digest ``"sha256:<64 hex>"`` and return the digest.

        Idempotent: a second put of the same bytes stores nothing new.
        ``ValueError`` when ``data`` is over ``MAX_BLOB_BYTES``.
        """
        ...

    async def add_blob(self, data: bytes) -> tuple[str, bool]:
        """``put_blob``, and whether this call stored it (False: those bytes were stored already)."""
        ...

    async def checkpoint_usage(self, run: str) -> CheckpointUsage:
        """What the checkpoints of ``run`` added to the store (see ``activities.store.checkpoint_usage``)."""
        ...

    async def checkpoint_record(self, run: str, checkpoint_id: str, new_bytes: int) -> None:
        """Count checkpoint ``checkpoint_id`` of ``run`` with the bytes it added (the first record wins)."""
        ...

    async def get_blob(self, digest: str) -> bytes | None:
        """The bytes stored under ``digest``, or None (also for a malformed digest).

        ``BlobCorrupt`` (a ``StoreError``) naming the digest when the stored bytes do not hash to it.
        """
        ...

    async def blob_digests(self, older_than: float) -> list[str]:
        """Digests of the blobs first stored before unix time ``older_than``, sorted.

        A later put of the same bytes does not make a blob younger (see ``activities.checkpoints.gc``).
        """
        ...

    async def delete_blobs(self, digests: list[str]) -> int:
        """Delete the blobs stored under ``digests``; how many were deleted (absent ones are not counted)."""
        ...

    # --- forgetting and retention (see ``activities.erasure``) --------------------------

    async def blob_ref(self, run: str, tenant: str, user: str, digests: list[str]) -> None:
        """Record that ``run`` (a :func:`~activities.checkpoints.ids.run_key`) of ``tenant``/``user`` uses
        ``digests`` (idempotent)."""
        ...

    async def blob_refs_of(self, run: str) -> list[str]:
        """The digests ``run`` is recorded to use, sorted."""
        ...

    async def blob_ref_runs(self, digests: list[str]) -> dict[str, set[str]]:
        """For each of ``digests`` that some run is recorded to use: those runs (digests none uses are absent)."""
        ...

    async def delete_blob_refs(self, run: str) -> int:
        """Forget which blobs ``run`` uses; how many references were deleted. (``delete_blobs`` deletes the
        references to the blobs it deletes.)"""
        ...

    async def count_messages(self, conversation_id: str) -> int:
        """How many entries ``conversation_id`` holds, gaps and all."""
        ...

    async def delete_conversation(self, conversation_id: str) -> int:
        """Delete every entry of ``conversation_id``; how many were deleted."""
        ...

    async def delete_ledger(self, workflow_id: str) -> int:
        """Delete the ledger entries (results and notes) of ``workflow_id``; how many were deleted."""
        ...

    async def delete_checkpoint_usage(self, run: str) -> int:
        """Delete what ``run``'s checkpoints were counted as; how many checkpoints it had recorded."""
        ...

    async def scrub(self, full: bool = False) -> bool:
        """Make what was deleted unrecoverable from the store's own files where the database allows it
        (SQLite: checkpoint and truncate the WAL; PostgreSQL: ``VACUUM`` the tables deleted from).

        ``full`` (what ``forget`` asks for) on PostgreSQL runs ``VACUUM FULL`` instead, which rewrites
        each table and its indexes into new files: a plain ``VACUUM`` frees a dead row's space but
        leaves its bytes in the page until a later write reuses it. The rewrite locks each table
        while it runs (the store's other callers wait). SQLite's deletes already zero the freed space
        (``secure_delete``), so ``full`` changes nothing there.

        False when it could not complete (SQLite: another connection kept reading past the busy timeout,
        so the WAL still holds earlier page images until its next checkpoint): run it again."""
        ...

    async def close(self) -> None: ...
