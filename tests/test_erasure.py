"""``activities.erasure.erase`` on both stores, plain and encrypted: a forgotten run's blobs go, a blob another
run uses stays.

Two tenants' runs each checkpoint a workspace with a file of their own and one file of the same bytes
(one blob: content-addressed). Erasing A's conversation deletes its transcript, checkpoint usage, blob
references, ledger entries and its own blobs; the shared file and B's manifest stay readable through
B's conversation, and garbage collection afterwards keeps them. A second erase deletes nothing.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from activities.checkpoints import gc
from activities.erasure import erase
from activities.sandbox.checkpointable import Manifest, ManifestEntry
from activities.store import open_store
from activities.store.base import RunStore
from activities.store.ledger import ClaimRequest
from tests.crypto_keys import TEST_ONLY_K1, ring
from workflows.types import Message

SHARED = b"the same bytes in both tenants' workspaces"


async def checkpointed_run(store: RunStore, conversation: str, tenant: str, own: bytes) -> tuple[str, str]:
    """A conversation whose tool result names a checkpoint of two files (its own, and the shared one)."""
    own_digest = await store.put_blob(own)
    shared_digest = await store.put_blob(SHARED)
    manifest = Manifest(
        entries=[
            ManifestEntry(path="own.txt", kind="file", mode=0o644, size=len(own), hash=own_digest),
            ManifestEntry(path="shared.txt", kind="file", mode=0o644, size=len(SHARED), hash=shared_digest),
        ]
    )
    checkpoint = await store.put_blob(manifest.encode())
    run = conversation
    await store.blob_ref(run, tenant, "", [checkpoint, own_digest, shared_digest])
    await store.checkpoint_record(run, checkpoint, len(own) + len(SHARED))
    await store.put_message(conversation, 0, Message(role="system", content="sys"))
    await store.put_message(conversation, 1, Message(role="user", content=f"write {own.decode()}"))
    await store.put_message(conversation, 2, Message(role="tool", content="wrote"), {"checkpoint": checkpoint})
    return checkpoint, own_digest


@pytest.fixture(params=["plain", "encrypted"])
async def store(request: pytest.FixtureRequest, store_url: str) -> AsyncIterator[RunStore]:
    """The store at ``store_url`` (SQLite, PostgreSQL), as it is and encrypted at rest."""
    opened = open_store(store_url, ring(TEST_ONLY_K1) if request.param == "encrypted" else None)
    yield opened
    await opened.close()


async def test_erase_keeps_what_another_run_uses_and_is_idempotent(store: RunStore) -> None:
    a_checkpoint, a_own = await checkpointed_run(store, "wf-a/r1", "A", b"MARKER-A only in tenant A")
    b_checkpoint, b_own = await checkpointed_run(store, "wf-b/r1", "B", b"MARKER-B only in tenant B")
    request = ClaimRequest(
        key="wf-a/r1/k1", tool="http_request", args_hash="h", workflow_id="wf-a", owner="o", attempt=1, lease_s=30
    )
    assert (await store.claim(request)).status == "fresh"
    await store.finish(request.key, "o", "done", "MARKER-A result", False)

    dry = await erase(store, ["wf-a/r1"], ["wf-a"], dry_run=True, grace_s=0)
    assert (dry.conversations, dry.messages, dry.checkpoints, dry.blobs, dry.ledger_entries) == (1, 3, 1, 2, 1)
    assert dry.shared_blobs_kept == 1
    assert await store.count_messages("wf-a/r1") == 3 and await store.get_blob(a_own) is not None

    done = await erase(store, ["wf-a/r1"], ["wf-a"], grace_s=0)
    assert (done.conversations, done.messages, done.checkpoints, done.blobs, done.ledger_entries) == (1, 3, 1, 2, 1)
    assert await store.count_messages("wf-a/r1") == 0 and await store.ledger("wf-a") == []
    assert await store.get_blob(a_own) is None and await store.get_blob(a_checkpoint) is None
    assert await store.blob_refs_of("wf-a/r1") == [] and (await store.checkpoint_usage("wf-a/r1")).count == 0
    # B reads its checkpoint and both its files, the shared one included.
    manifest = Manifest.decode(await store.get_blob(b_checkpoint) or b"")
    files = {e.path: await store.get_blob(e.hash) for e in manifest.entries}
    assert files == {"own.txt": b"MARKER-B only in tenant B", "shared.txt": SHARED}
    assert [m.message.content for m in await store.transcript("wf-b/r1")][1] == "write MARKER-B only in tenant B"

    again = await erase(store, ["wf-a/r1"], ["wf-a"], grace_s=0)
    assert (again.conversations, again.messages, again.checkpoints, again.blobs, again.ledger_entries) == (0,) * 5

    async def keep_all(conversation_id: str, last_write: float) -> bool:
        return True

    report = await gc.collect(store, keep_conversation=keep_all, grace_s=0, now=time.time() + 1)
    assert report.deleted == 0
    assert await store.get_blob(b_own) is not None and await store.get_blob(manifest.entries[1].hash) == SHARED

    # The last user of the shared blob forgotten: it goes too.
    last = await erase(store, ["wf-b/r1"], ["wf-b"], grace_s=0)
    assert last.blobs == 3 and last.shared_blobs_kept == 0
    assert await store.blob_digests(float("inf")) == []


async def test_a_run_recorded_to_use_a_blob_keeps_it_though_no_entry_names_it_yet(store: RunStore) -> None:
    """A checkpoint of B's being taken (its references recorded, its tool result not stored yet) keeps the
    bytes A's forgotten run shares with it."""
    await checkpointed_run(store, "wf-a/r1", "A", b"MARKER-A")
    digest = await store.put_blob(SHARED)
    await store.blob_ref("wf-b/r9", "B", "", [digest])
    done = await erase(store, ["wf-a/r1"], [], grace_s=0)
    assert done.blobs == 2 and done.shared_blobs_kept == 1
    assert await store.get_blob(digest) == SHARED
    assert await store.blob_ref_runs([digest]) == {digest: {"wf-b/r9"}}
    assert await store.delete_blobs([digest]) == 1
    assert await store.blob_ref_runs([digest]) == {}, "deleting a blob deletes its references"


class _FailsOnce:
    """A store whose first ``delete_ledger`` fails: an erase killed part way."""

    def __init__(self, inner: RunStore) -> None:
        self._inner, self.failed = inner, False

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def delete_ledger(self, workflow_id: str) -> int:
        if not self.failed:
            self.failed = True
            raise RuntimeError("killed part way")
        return await self._inner.delete_ledger(workflow_id)


async def test_an_erase_stopped_part_way_is_finished_by_the_next_one(store: RunStore) -> None:
    a_checkpoint, a_own = await checkpointed_run(store, "wf-a/r1", "A", b"MARKER-A only in tenant A")
    flaky = _FailsOnce(store)
    with pytest.raises(RuntimeError, match="killed part way"):
        await erase(flaky, ["wf-a/r1"], ["wf-a"], grace_s=0)  # type: ignore[arg-type]
    # The transcript, by which the next erase finds the run, is what goes last.
    assert await store.count_messages("wf-a/r1") == 3
    done = await erase(store, ["wf-a/r1"], ["wf-a"], grace_s=0)
    assert done.messages == 3 and await store.count_messages("wf-a/r1") == 0
    assert await store.get_blob(a_own) is None and await store.get_blob(a_checkpoint) is None
    assert await store.blob_refs_of("wf-a/r1") == [] and (await store.checkpoint_usage("wf-a/r1")).count == 0
