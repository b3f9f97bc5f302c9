"""Garbage collection of checkpoint and other blobs (``activities.checkpoints.gc``) on a real SQLite store."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from activities.checkpoints import gc
from activities.checkpoints.gc import GcReport, collect, workflow_of
from activities.sandbox.checkpointable import Manifest, ManifestEntry
from activities.store.base import RunStore, StoreError, blob_digest
from activities.store.sqlite import SQLiteRunStore
from workflows.types import Message, RecordedToolCall

NOW = time.time() + 10 * 24 * 3600  # collections run "ten days from now": every blob stored by a test is old
OLD = 1_000_000.0  # a created_at long past


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteRunStore]:
    s = SQLiteRunStore(tmp_path / "store.sqlite3")
    yield s
    await s.close()


def keep_only(*kept: str) -> Callable[[str, float], Awaitable[bool]]:
    async def keep(conversation_id: str, last_write: float) -> bool:
        return conversation_id in kept

    return keep


async def present(store: RunStore, *digests: str) -> list[bool]:
    return [await store.get_blob(d) is not None for d in digests]


async def checkpoint(store: RunStore, files: dict[str, bytes]) -> tuple[str, list[str]]:
    """Store ``files`` and their manifest as ``engine.take`` does; (checkpoint id, file digests)."""
    hashes = [await store.put_blob(data) for data in files.values()]
    entries = [
        ManifestEntry(path=path, kind="file", mode=0o644, size=len(data), hash=h)
        for (path, data), h in zip(files.items(), hashes, strict=True)
    ]
    entries.append(ManifestEntry(path="src", kind="dir", mode=0o755))
    return await store.put_blob(Manifest(entries=entries).encode()), hashes


async def run_with_everything(store: RunStore, conversation_id: str, tag: str) -> list[str]:
    """A conversation whose entries reference a checkpoint, an MCP snapshot, an image and a whole result.

    Returns every digest it references (manifest first).
    """
    ck, files = await checkpoint(store, {f"src/{tag}.py": f"print({tag!r})".encode(), "README": tag.encode() * 50})
    snapshot = await store.put_blob(json.dumps({"tools": [tag]}).encode())
    image = await store.put_blob(b"\x89PNG" + tag.encode())
    result = await store.put_blob(b"a long result " * 1000 + tag.encode())
    call = RecordedToolCall(id="c1", name="fetch", arguments_json="{}")
    await store.put_message(conversation_id, 0, Message(role="user", content="do it"))
    await store.put_message(
        conversation_id, 1, Message(role="assistant", tool_calls=[call]), {"mcp_snapshot": snapshot}
    )
    content = f"[image {image}] the whole result is stored as {result}"
    await store.put_message(
        conversation_id, 2, Message(role="tool", content=content, tool_call_id="c1"), {"checkpoint": ck}
    )
    return [ck, *files, snapshot, image, result]


# --- mark and sweep --------------------------------------------------------------------------


async def test_a_kept_conversation_keeps_everything_it_references(store: SQLiteRunStore) -> None:
    referenced = await run_with_everything(store, "wf/run-1", "kept")
    garbage = await store.put_blob(b"referenced by nobody")
    report = await collect(store, keep_conversation=keep_only("wf/run-1"), now=NOW)
    assert await present(store, *referenced) == [True] * 6
    assert await present(store, garbage) == [False]
    assert (report.conversations, report.kept, report.marked, report.deleted) == (1, 1, 6, 1)
    assert report.problems == () and report.seconds >= 0


async def test_a_dropped_conversation_loses_everything_it_references(store: SQLiteRunStore) -> None:
    kept = await run_with_everything(store, "wf/run-1", "kept")
    dropped = await run_with_everything(store, "other/wf/run-2~abcd1234", "dropped")
    report = await collect(store, keep_conversation=keep_only("wf/run-1"), now=NOW)
    assert await present(store, *kept) == [True] * 6
    assert await present(store, *dropped) == [False] * 6
    assert (report.conversations, report.kept, report.deleted) == (2, 1, 6)


async def test_keep_conversation_is_asked_about_each_with_its_last_write(store: SQLiteRunStore) -> None:
    await run_with_everything(store, "a/run", "a")
    await run_with_everything(store, "b/run~fork0001", "b")
    asked: list[tuple[str, float]] = []

    async def keep(conversation_id: str, last_write: float) -> bool:
        asked.append((conversation_id, last_write))
        return True

    await collect(store, keep_conversation=keep, now=NOW)
    assert [c for c, _ in asked] == ["a/run", "b/run~fork0001"]
    assert all(abs(t - time.time()) < 60 for _, t in asked)


async def test_nothing_kept_deletes_every_old_blob(store: SQLiteRunStore) -> None:
    digests = await run_with_everything(store, "wf/run", "x")
    report = await collect(store, keep_conversation=keep_only(), now=NOW)
    assert report.deleted == 6 and report.kept == 0
    assert await store.blob_digests(NOW + 1) == []
    assert await present(store, *digests) == [False] * 6


async def test_a_blob_younger_than_the_grace_period_survives(store: SQLiteRunStore, tmp_path: Path) -> None:
    young = await store.put_blob(b"a file of a checkpoint being taken right now")
    older = await store.put_blob(b"unreferenced and past the grace period")
    store._conn.execute("UPDATE blobs SET created_at = ? WHERE digest = ?", (NOW - 3599, young))
    store._conn.execute("UPDATE blobs SET created_at = ? WHERE digest = ?", (NOW - 3601, older))
    report = await collect(store, keep_conversation=keep_only(), grace_s=3600, now=NOW)
    assert await present(store, young, older) == [True, False]
    assert report.deleted == 1


async def test_the_default_is_now_and_an_hour_of_grace(store: SQLiteRunStore) -> None:
    fresh = await store.put_blob(b"just stored")
    stale = await store.put_blob(b"stored two hours ago")
    store._conn.execute("UPDATE blobs SET created_at = ? WHERE digest = ?", (time.time() - 7200, stale))
    await collect(store, keep_conversation=keep_only())
    assert await present(store, fresh, stale) == [True, False]


async def test_a_blob_shared_by_a_kept_and_a_dropped_conversation_survives(store: SQLiteRunStore) -> None:
    shared_file = b"the same file in both workspaces"
    kept_ck, (kept_shared, _) = await checkpoint(store, {"shared.txt": shared_file, "a.txt": b"only kept"})
    dropped_ck, (dropped_shared, dropped_only) = await checkpoint(
        store, {"shared.txt": shared_file, "b.txt": b"only dropped"}
    )
    assert kept_shared == dropped_shared
    image = await store.put_blob(b"an image both runs fetched")
    for conversation_id, ck in (("wf/kept", kept_ck), ("wf/dropped", dropped_ck)):
        await store.put_message(conversation_id, 0, Message(role="tool", content=f"see {image}"), {"checkpoint": ck})
    await collect(store, keep_conversation=keep_only("wf/kept"), now=NOW)
    assert await present(store, kept_ck, kept_shared, image) == [True, True, True]
    assert await present(store, dropped_ck, dropped_only) == [False, False]


async def test_every_entry_is_read_past_gaps_and_pages(store: SQLiteRunStore) -> None:
    far = [await store.put_blob(f"blob {i}".encode()) for i in range(3)]
    await store.put_message("wf/run", 0, Message(role="user", content="start"))
    # seq 1 not written (yet): a sibling tool result can land before it
    await store.put_message("wf/run", 2, Message(role="tool", content=f"image {far[0]}"))
    for seq in range(3, 1203):  # more than two pages
        await store.put_message("wf/run", seq, Message(role="assistant", content=f"turn {seq}"))
    await store.put_message("wf/run", 1203, Message(role="tool", content="last"), {"checkpoint": far[1]})
    await store.put_message("wf/run", 1204, Message(role="tool", content="x"), {"nested": {"list": [far[2]]}})
    report = await collect(store, keep_conversation=keep_only("wf/run"), now=NOW)
    assert await present(store, *far) == [True, True, True]
    assert report.deleted == 0


async def test_no_entry_is_skipped_between_pages(store: SQLiteRunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gc, "PAGE", 2)
    seqs = [0, 1, 2, 4, 5, 6, 7, 9]
    blobs = {seq: await store.put_blob(f"blob of entry {seq}".encode()) for seq in seqs}
    for seq, digest in blobs.items():
        await store.put_message("wf/run", seq, Message(role="tool", content=f"result {digest}"))
    await collect(store, keep_conversation=keep_only("wf/run"), now=NOW)
    assert await present(store, *blobs.values()) == [True] * len(seqs)


async def test_digests_in_tool_call_arguments_and_any_meta_are_marked(store: SQLiteRunStore) -> None:
    argument = await store.put_blob(b"an argument")
    meta_value = await store.put_blob(b"named in meta")
    garbage = await store.put_blob(b"garbage")
    call = RecordedToolCall(id="c", name="show", arguments_json=json.dumps({"image": argument}))
    await store.put_message("wf/run", 0, Message(role="assistant", tool_calls=[call]), {"whole_result": meta_value})
    await collect(store, keep_conversation=keep_only("wf/run"), now=NOW)
    assert await present(store, argument, meta_value, garbage) == [True, True, False]


async def test_malformed_digests_mark_nothing(store: SQLiteRunStore) -> None:
    data = b"would be kept by a well-formed mention"
    digest = blob_digest(data)
    await store.put_blob(data)
    upper = "sha256:" + digest.removeprefix("sha256:").upper()
    await store.put_message(
        "wf/run", 0, Message(role="tool", content=f"{upper} {digest[:-1]}"), {"checkpoint": digest.upper()}
    )
    report = await collect(store, keep_conversation=keep_only("wf/run"), now=NOW)
    assert await present(store, digest) == [False]
    assert report.marked == 0 and report.problems == ()


async def test_an_empty_checkpoint_id_is_no_checkpoint(store: SQLiteRunStore) -> None:
    await store.put_message("wf/run", 0, Message(role="tool", content="ok"), {"checkpoint": ""})
    report = await collect(store, keep_conversation=keep_only("wf/run"), now=NOW)
    assert report.problems == () and report.marked == 0


# --- unusable manifests ------------------------------------------------------------------------


async def test_a_missing_manifest_is_reported_and_gc_goes_on(
    store: SQLiteRunStore, caplog: pytest.LogCaptureFixture
) -> None:
    ck, files = await checkpoint(store, {"a.txt": b"a", "b.txt": b"b"})
    healthy_ck, healthy_files = await checkpoint(store, {"b.txt": b"b", "c.txt": b"c"})
    await store.delete_blobs([ck])
    await store.put_message("wf/run", 0, Message(role="tool", content="1"), {"checkpoint": ck})
    await store.put_message("wf/run", 1, Message(role="tool", content="2"), {"checkpoint": healthy_ck})
    with caplog.at_level(logging.WARNING, logger="activities.checkpoints.gc"):
        report = await collect(store, keep_conversation=keep_only("wf/run"), now=NOW)
    [problem] = report.problems
    assert ck in problem and "missing" in problem and "wf/run entry 0" in problem
    assert problem in caplog.text
    # a.txt only the lost checkpoint named: nothing can restore it any more, it goes
    assert await present(store, *files) == [False, True]
    assert await present(store, healthy_ck, *healthy_files) == [True, True, True]
    assert report.deleted == 1


@pytest.mark.parametrize(
    "garbage",
    [b"not json at all", b'{"entries": [{"path": "../escape", "kind": "file", "mode": 420}]}', b"[1, 2]", b"\xff\xfe"],
)
async def test_a_blob_that_is_not_a_manifest_is_reported_and_kept(store: SQLiteRunStore, garbage: bytes) -> None:
    ck = await store.put_blob(garbage)
    other = await store.put_blob(b"unreferenced")
    await store.put_message("wf/run", 0, Message(role="tool", content="1"), {"checkpoint": ck})
    report = await collect(store, keep_conversation=keep_only("wf/run"), now=NOW)
    [problem] = report.problems
    assert ck in problem and "not a manifest" in problem
    assert await present(store, ck, other) == [True, False]


async def test_a_corrupt_manifest_row_is_reported_and_kept(store: SQLiteRunStore) -> None:
    ck, (only_here, shared) = await checkpoint(store, {"a.txt": b"only here", "b.txt": b"shared"})
    healthy_ck, _ = await checkpoint(store, {"b.txt": b"shared"})
    store._conn.execute("UPDATE blobs SET size = size + 1 WHERE digest = ?", (ck,))
    with pytest.raises(StoreError):
        await store.get_blob(ck)
    await store.put_message("wf/run", 0, Message(role="tool", content="1"), {"checkpoint": ck})
    await store.put_message("wf/run", 1, Message(role="tool", content="2"), {"checkpoint": healthy_ck})
    report = await collect(store, keep_conversation=keep_only("wf/run"), now=NOW)
    [problem] = report.problems
    assert ck in problem and "corrupt" in problem
    [(rows,)] = store._conn.execute("SELECT COUNT(*) FROM blobs WHERE digest = ?", (ck,)).fetchall()
    assert rows == 1
    assert await present(store, only_here, shared, healthy_ck) == [False, True, True]


class CountingStore(SQLiteRunStore):
    """Counts blob reads; ``unavailable`` makes reads of those digests fail as an unreachable store would."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.reads: list[str] = []
        self.unavailable: set[str] = set()

    async def get_blob(self, digest: str) -> bytes | None:
        self.reads.append(digest)
        if digest in self.unavailable:
            raise StoreError("run store unavailable (connection refused)")
        return await super().get_blob(digest)


async def test_each_manifest_is_loaded_once(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "store.sqlite3")
    try:
        ck, _ = await checkpoint(store, {"a.txt": b"a"})
        for conversation_id in ("wf/run", "wf/run~fork0001", "wf/run~fork0002"):
            for seq in range(3):
                await store.put_message(conversation_id, seq, Message(role="tool", content="x"), {"checkpoint": ck})
        await collect(store, keep_conversation=keep_only("wf/run", "wf/run~fork0001", "wf/run~fork0002"), now=NOW)
        assert store.reads == [ck]
    finally:
        await store.close()


async def test_an_unreachable_store_while_marking_deletes_nothing(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "store.sqlite3")
    try:
        ck, files = await checkpoint(store, {"a.txt": b"a"})
        garbage = await store.put_blob(b"garbage")
        await store.put_message("wf/run", 0, Message(role="tool", content="x"), {"checkpoint": ck})
        store.unavailable.add(ck)
        with pytest.raises(StoreError, match="unavailable"):
            await collect(store, keep_conversation=keep_only("wf/run"), now=NOW)
        store.unavailable.clear()
        assert await present(store, ck, *files, garbage) == [True, True, True]
    finally:
        await store.close()


async def test_a_failing_keep_decision_deletes_nothing(store: SQLiteRunStore) -> None:
    digests = await run_with_everything(store, "wf/run", "x")

    async def keep(conversation_id: str, last_write: float) -> bool:
        raise RuntimeError("temporal is down")

    with pytest.raises(RuntimeError, match="temporal is down"):
        await collect(store, keep_conversation=keep, now=NOW)
    assert await present(store, *digests) == [True] * 6


async def test_negative_grace_is_refused(store: SQLiteRunStore) -> None:
    young = await store.put_blob(b"young")
    for grace in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="grace_s"):
            await collect(store, keep_conversation=keep_only(), grace_s=grace)
    assert await present(store, young) == [True]


async def test_many_garbage_blobs_are_deleted_in_batches(store: SQLiteRunStore) -> None:
    for i in range(2345):
        await store.put_blob(f"garbage {i}".encode())
    report = await collect(store, keep_conversation=keep_only(), now=NOW)
    assert report == GcReport(conversations=0, kept=0, marked=0, deleted=2345, seconds=report.seconds)
    assert await store.blob_digests(NOW) == []


# --- workflow_of ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("conversation_id", "expected"),
    [
        ("wf/run-1", ("wf", "run-1")),
        ("wf/run-1~abcd1234", ("wf", "run-1")),
        ("wf/run-1~abcd1234~0000ffff", ("wf", "run-1")),
        (
            "tenant/team/wf-7/6f1c1e4a-1d2b-4c1a-9f0e-1234567890ab",
            ("tenant/team/wf-7", "6f1c1e4a-1d2b-4c1a-9f0e-1234567890ab"),
        ),
        ("tenant/wf~odd/run~deadbeef", ("tenant/wf~odd", "run")),
        ("a//run", ("a/", "run")),
    ],
)
def test_workflow_of(conversation_id: str, expected: tuple[str, str]) -> None:
    assert workflow_of(conversation_id) == expected


@pytest.mark.parametrize("bad", ["", "no-slash", "no-slash~abcd1234", "/run", "wf/", "wf/~abcd1234"])
def test_workflow_of_refuses_what_is_not_a_conversation_id(bad: str) -> None:
    with pytest.raises(ValueError, match="not a conversation id"):
        workflow_of(bad)
