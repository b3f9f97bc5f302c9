"""``EncryptedRunStore``: any ``RunStore`` with its contents encrypted at rest by the payload key ring.

Built by ``open_store`` when ``AGENT_PAYLOAD_KEYS`` is set. What is encrypted, and how:

- **Transcript entries**: the whole message (content, tool calls, names) and its meta are one AES-256-GCM
  ciphertext (zlib first when that is smaller). The row keeps only the role and the ciphertext, as
  ``content = "<key id>:<base64>"``, and its meta is ``{"da.enc": 1}``. ``copy_messages`` copies rows as
  they are, so forks and branches stay encrypted under the key that wrote them.
- **Ledger results and notes**: ``"da.enc1:<key id>:<base64>"``. Keys, tool names, argument hashes,
  workflow ids, owners, states and leases stay plaintext: the claims are decided on them.
- **Blobs**: a header naming the key id, then the ciphertext, encrypted deterministically (a synthetic
  nonce) so that identical bytes under one key are still stored once. Their digests are therefore the
  ``sha256`` of the *stored* bytes, not of the plaintext: a digest reveals nothing about the content, and
  the same bytes written under a new key get a new digest (history keeps the one it was given, which reads
  back as long as its key is in the ring).

Reads decrypt with whichever key the row names; a key missing from the ring or a row that does not
authenticate is a ``StoreError`` naming the key id, never ciphertext handed on as if it were content.
Rows written before encryption was turned on (no marker) are read as they are. Budget, tree-run and tenant-run rows hold
numbers and ids only and pass through.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from activities.crypto.keyring import KeyRing, KeyRingError
from activities.store.base import MAX_BLOB_BYTES, RunStore, StoredMessage, StoreError
from activities.store.budget import BudgetSpent, BudgetVerdict
from activities.store.checkpoint_usage import CheckpointUsage
from activities.store.ledger import Claim, ClaimRequest, LedgerEntry, LedgerState
from activities.store.packing import pack_bytes, unpack_bytes
from workflows.types import Message

META_MARK = "da.enc"
TEXT_MARK = "da.enc1:"
BLOB_MAGIC = b"DAENC1"
_MESSAGE, _TEXT, _BLOB = b"transcript", b"ledger", b"blob"


class EncryptedRunStore:
    """A ``RunStore`` that encrypts what it writes into ``inner`` and decrypts what it reads back."""

    def __init__(self, inner: RunStore, keyring: KeyRing) -> None:
        self.inner = inner
        self.keyring = keyring

    # --- sealing ------------------------------------------------------------------

    def _seal(self, data: bytes, context: bytes, *, deterministic: bool = False) -> tuple[str, bytes]:
        return self.keyring.encrypt(pack_bytes(data), context, deterministic=deterministic)

    def _open(self, key_id: str, sealed: bytes, context: bytes, what: str) -> bytes:
        try:
            framed = self.keyring.decrypt(key_id, sealed, context)
        except KeyRingError as exc:
            raise StoreError(f"cannot decrypt {what}: {exc}") from None
        return unpack_bytes(framed, f"{what} (decrypted)")

    def _seal_text(self, text: str) -> str:
        if not text:
            return text
        key_id, sealed = self._seal(text.encode(), _TEXT)
        return f"{TEXT_MARK}{key_id}:{base64.b64encode(sealed).decode()}"

    def _open_text(self, stored: str, what: str) -> str:
        if not stored.startswith(TEXT_MARK):
            return stored  # written before encryption was turned on
        key_id, _, encoded = stored[len(TEXT_MARK) :].partition(":")
        return self._open(key_id, _b64(encoded, what), _TEXT, what).decode()

    def _seal_message(self, message: Message, meta: dict[str, object]) -> tuple[Message, dict[str, object]]:
        plain = json.dumps({"message": message.model_dump(mode="json"), "meta": meta}, separators=(",", ":"))
        key_id, sealed = self._seal(plain.encode(), _MESSAGE)
        stored = Message(role=message.role, content=f"{key_id}:{base64.b64encode(sealed).decode()}")
        return stored, {META_MARK: 1}

    def _open_message(self, stored: StoredMessage | None) -> StoredMessage | None:
        if stored is None or META_MARK not in stored.meta:
            return stored  # absent, or written before encryption was turned on
        what = f"transcript entry {stored.seq}"
        key_id, _, encoded = stored.message.content.partition(":")
        plain: Any = json.loads(self._open(key_id, _b64(encoded, what), _MESSAGE, what))
        return StoredMessage(seq=stored.seq, message=Message.model_validate(plain["message"]), meta=plain["meta"])

    def _open_messages(self, stored: list[StoredMessage]) -> list[StoredMessage]:
        return [m for m in map(self._open_message, stored) if m is not None]

    def _open_entry(self, entry: LedgerEntry) -> LedgerEntry:
        if not (entry.result.startswith(TEXT_MARK) or entry.note.startswith(TEXT_MARK)):
            return entry
        what = f"the ledger result of {entry.key}"
        return entry.model_copy(
            update={"result": self._open_text(entry.result, what), "note": self._open_text(entry.note, what)}
        )

    # --- transcripts ----------------------------------------------------------------

    async def put_message(
        self, conversation_id: str, seq: int, message: Message, meta: dict[str, object] | None = None
    ) -> StoredMessage:
        stored, stored_meta = self._seal_message(message, dict(meta or {}))
        opened = self._open_message(await self.inner.put_message(conversation_id, seq, stored, stored_meta))
        assert opened is not None
        return opened

    async def get_message(self, conversation_id: str, seq: int) -> StoredMessage | None:
        return self._open_message(await self.inner.get_message(conversation_id, seq))

    async def messages(self, conversation_id: str, upto: int) -> list[StoredMessage]:
        return self._open_messages(await self.inner.messages(conversation_id, upto))

    async def transcript(self, conversation_id: str, limit: int = 100_000) -> list[StoredMessage]:
        return self._open_messages(await self.inner.transcript(conversation_id, limit))

    async def entries_after(self, conversation_id: str, after: int = -1, limit: int = 1000) -> list[StoredMessage]:
        return self._open_messages(await self.inner.entries_after(conversation_id, after, limit))

    async def copy_messages(self, source: str, target: str, upto: int) -> int:
        return await self.inner.copy_messages(source, target, upto)

    async def conversations(self) -> list[tuple[str, float]]:
        return await self.inner.conversations()

    # --- ledger --------------------------------------------------------------------

    async def claim(self, request: ClaimRequest) -> Claim:
        claim = await self.inner.claim(request)
        return Claim(status=claim.status, entry=self._open_entry(claim.entry))

    async def started(self, key: str, owner: str) -> bool:
        return await self.inner.started(key, owner)

    async def renew(self, key: str, owner: str, lease_s: float) -> bool:
        return await self.inner.renew(key, owner, lease_s)

    async def finish(
        self, key: str, owner: str, state: LedgerState, result: str, is_error: bool, note: str = ""
    ) -> None:
        await self.inner.finish(key, owner, state, self._seal_text(result), is_error, self._seal_text(note))

    async def ledger(self, workflow_id: str | None = None) -> list[LedgerEntry]:
        return [self._open_entry(entry) for entry in await self.inner.ledger(workflow_id)]

    # --- budget (numbers only) -------------------------------------------------------

    async def budget_reserve(
        self, root: str, key: str, cap_tokens: int, cap_cost_usd: float, tokens: int = 0, cost_usd: float = 0.0
    ) -> BudgetVerdict:
        return await self.inner.budget_reserve(root, key, cap_tokens, cap_cost_usd, tokens, cost_usd)

    async def budget_settle(self, root: str, key: str, tokens: int, cost_usd: float) -> None:
        await self.inner.budget_settle(root, key, tokens, cost_usd)

    async def budget_release(self, root: str, key: str) -> None:
        await self.inner.budget_release(root, key)

    async def budget_spent(self, root: str) -> BudgetSpent:
        return await self.inner.budget_spent(root)

    # --- runs of a tree (ids only) ---------------------------------------------------

    async def tree_run_reserve(self, root: str, key: str, cap: int) -> bool:
        return await self.inner.tree_run_reserve(root, key, cap)

    async def tree_runs(self, root: str) -> int:
        return await self.inner.tree_runs(root)

    async def tenant_run_reserve(self, tenant: str, workflow_id: str, cap: int) -> tuple[bool, list[str]]:
        return await self.inner.tenant_run_reserve(tenant, workflow_id, cap)

    async def tenant_run_release(self, tenant: str, workflow_id: str) -> bool:
        return await self.inner.tenant_run_release(tenant, workflow_id)

    async def tenant_runs(self, tenant: str | None = None) -> list[tuple[str, str]]:
        return await self.inner.tenant_runs(tenant)

    # --- blobs ---------------------------------------------------------------------

    async def put_blob(self, data: bytes) -> str:
        return (await self.add_blob(data))[0]

    async def add_blob(self, data: bytes) -> tuple[str, bool]:
        if len(data) > MAX_BLOB_BYTES:
            raise ValueError(f"blob of {len(data)} bytes is over the limit of {MAX_BLOB_BYTES} bytes")
        key_id, sealed = self._seal(bytes(data), _BLOB, deterministic=True)
        return await self.inner.add_blob(BLOB_MAGIC + bytes([len(key_id)]) + key_id.encode() + sealed)

    # --- checkpoint usage (numbers and checkpoint ids only) ------------------------

    async def checkpoint_usage(self, run: str) -> CheckpointUsage:
        return await self.inner.checkpoint_usage(run)

    async def checkpoint_record(self, run: str, checkpoint_id: str, new_bytes: int) -> None:
        await self.inner.checkpoint_record(run, checkpoint_id, new_bytes)

    async def get_blob(self, digest: str) -> bytes | None:
        stored = await self.inner.get_blob(digest)
        if stored is None or not stored.startswith(BLOB_MAGIC):
            return stored  # absent, or written before encryption was turned on
        size = stored[len(BLOB_MAGIC)] if len(stored) > len(BLOB_MAGIC) else 0
        start = len(BLOB_MAGIC) + 1
        key_id = stored[start : start + size].decode("utf-8", "replace")
        return self._open(key_id, stored[start + size :], _BLOB, f"blob {digest}")

    async def blob_digests(self, older_than: float) -> list[str]:
        return await self.inner.blob_digests(older_than)

    async def delete_blobs(self, digests: list[str]) -> int:
        return await self.inner.delete_blobs(digests)

    # --- forgetting and retention (ids, digests and counts only) ----------------------
    # Tenant and user names in blob references stay plaintext, as they are in the AgentTenant search attribute.

    async def blob_ref(self, run: str, tenant: str, user: str, digests: list[str]) -> None:
        await self.inner.blob_ref(run, tenant, user, digests)

    async def blob_refs_of(self, run: str) -> list[str]:
        return await self.inner.blob_refs_of(run)

    async def blob_ref_runs(self, digests: list[str]) -> dict[str, set[str]]:
        return await self.inner.blob_ref_runs(digests)

    async def delete_blob_refs(self, run: str) -> int:
        return await self.inner.delete_blob_refs(run)

    async def count_messages(self, conversation_id: str) -> int:
        return await self.inner.count_messages(conversation_id)

    async def delete_conversation(self, conversation_id: str) -> int:
        return await self.inner.delete_conversation(conversation_id)

    async def delete_ledger(self, workflow_id: str) -> int:
        return await self.inner.delete_ledger(workflow_id)

    async def delete_checkpoint_usage(self, run: str) -> int:
        return await self.inner.delete_checkpoint_usage(run)

    async def scrub(self, full: bool = False) -> bool:
        return await self.inner.scrub(full)

    async def close(self) -> None:
        await self.inner.close()


def _b64(encoded: str, what: str) -> bytes:
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise StoreError(f"{what} is marked encrypted but is not base64") from None
