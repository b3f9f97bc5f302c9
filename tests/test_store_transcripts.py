"""Whole transcripts, copies into forks, conversation listing and blob sweeping, against both backends."""

from __future__ import annotations

import hashlib
import time

import psycopg
import pytest

from activities.store import RunStore, StoreError, open_store
from activities.store.postgres import PostgresRunStore
from activities.store.schema import POSTGRES_MIGRATIONS
from tests.test_store_blobs import query
from workflows.types import Message, RecordedToolCall

# ``store_url`` and ``store`` (SQLite and PostgreSQL) come from tests/pg.py.


def msg(text: str, role: str = "tool") -> Message:
    return Message.model_validate({"role": role, "content": text, "tool_call_id": "c1", "name": "t"})


async def fill(store: RunStore, conversation_id: str, seqs: range | list[int], tag: str = "") -> None:
    for seq in seqs:
        await store.put_message(conversation_id, seq, msg(f"{tag}{seq}"), {"n": seq, "checkpoint": f"ck{seq}"})


def texts(entries: list[object]) -> list[str]:
    return [e.message.content for e in entries]  # type: ignore[attr-defined]


async def set_written(url: str, conversation_id: str, seq: int, when: str) -> None:
    """Backdate one entry's write time (``when``: ``YYYY-MM-DD HH:MM:SS``, UTC)."""
    value = when if not url.startswith("postgresql://") else when + "+00"
    await query(
        url, "UPDATE transcript SET created_at = ? WHERE conversation_id = ? AND seq = ?", (value, conversation_id, seq)
    )


# --- transcript ---------------------------------------------------------------------------


async def test_transcript_is_every_entry_from_zero_in_order_with_meta(store: RunStore) -> None:
    await fill(store, "wf/run", [2, 0, 1])
    await fill(store, "wf/other", range(5), tag="x")
    got = await store.transcript("wf/run")
    assert [(e.seq, e.message.content, e.meta) for e in got] == [
        (0, "0", {"n": 0, "checkpoint": "ck0"}),
        (1, "1", {"n": 1, "checkpoint": "ck1"}),
        (2, "2", {"n": 2, "checkpoint": "ck2"}),
    ]


async def test_transcript_stops_at_the_first_gap(store: RunStore) -> None:
    await fill(store, "wf/run", [0, 1, 3, 4])
    assert [e.seq for e in await store.transcript("wf/run")] == [0, 1]
    await fill(store, "wf/gapless-start", [1, 2])
    assert await store.transcript("wf/gapless-start") == []
    await store.put_message("wf/negative", -1, msg("before zero"))
    await fill(store, "wf/negative", [0])
    assert [e.seq for e in await store.transcript("wf/negative")] == [0]


async def test_transcript_limit(store: RunStore) -> None:
    await fill(store, "wf/run", range(6))
    assert [e.seq for e in await store.transcript("wf/run", limit=4)] == [0, 1, 2, 3]
    assert await store.transcript("wf/run", limit=0) == []
    assert await store.transcript("wf/run", limit=-3) == []
    assert len(await store.transcript("wf/run", limit=100)) == 6


async def test_transcript_of_an_unknown_conversation_is_empty(store: RunStore) -> None:
    assert await store.transcript("nobody/here") == []


async def test_entries_after_pages_through_gaps(store: RunStore) -> None:
    await fill(store, "wf/run", [0, 1, 3, 7, 8])
    assert [e.seq for e in await store.entries_after("wf/run")] == [0, 1, 3, 7, 8]
    assert [e.seq for e in await store.entries_after("wf/run", -1, 2)] == [0, 1]
    assert [e.seq for e in await store.entries_after("wf/run", 1, 2)] == [3, 7]
    assert [e.seq for e in await store.entries_after("wf/run", 7, 2)] == [8]
    assert await store.entries_after("wf/run", 8, 2) == []
    assert (await store.entries_after("wf/run", 2, 1))[0].meta == {"n": 3, "checkpoint": "ck3"}


# --- copy_messages --------------------------------------------------------------------------


async def test_copy_messages_copies_entries_and_meta(store: RunStore) -> None:
    calls = [RecordedToolCall(id="t1", name="write_file", arguments_json='{"path": "a", "text": "\\u0000é"}')]
    source = "my/wf/run-1"
    await store.put_message(source, 0, Message(role="user", content="task"))
    await store.put_message(
        source, 1, Message(role="assistant", tool_calls=calls), {"mcp_snapshot": "sha256:" + "a" * 64}
    )
    await store.put_message(source, 2, msg("done"), {"checkpoint": "sha256:" + "b" * 64})
    await store.put_message(source, 3, msg("after the fork point"))
    assert await store.copy_messages(source, source + "~abcd1234", 3) == 3
    copied = await store.transcript(source + "~abcd1234")
    assert copied == (await store.transcript(source))[:3]
    assert copied[1].message.tool_calls == calls and copied[2].meta == {"checkpoint": "sha256:" + "b" * 64}


async def test_copy_messages_is_idempotent(store: RunStore, store_url: str) -> None:
    await fill(store, "wf/run", range(4))
    assert await store.copy_messages("wf/run", "wf/run~fork0001", 4) == 4
    assert await store.copy_messages("wf/run", "wf/run~fork0001", 4) == 4
    assert await store.copy_messages("wf/run", "wf/run~fork0001", 2) == 2
    [(rows,)] = await query(
        store_url, "SELECT COUNT(*) FROM transcript WHERE conversation_id = ?", ("wf/run~fork0001",)
    )
    assert rows == 4


async def test_copy_messages_keeps_what_the_target_holds(store: RunStore) -> None:
    await fill(store, "wf/run", range(3), tag="src")
    await store.put_message("wf/run~fork0001", 1, msg("first writer"), {"mine": True})
    await store.put_message("wf/run~fork0001", 5, msg("beyond the copy"))
    assert await store.copy_messages("wf/run", "wf/run~fork0001", 3) == 3
    got = await store.entries_after("wf/run~fork0001")
    assert [(e.seq, e.message.content) for e in got] == [
        (0, "src0"),
        (1, "first writer"),
        (2, "src2"),
        (5, "beyond the copy"),
    ]
    assert got[1].meta == {"mine": True}


async def test_copy_messages_with_a_missing_source_position_copies_nothing(store: RunStore) -> None:
    await fill(store, "wf/run", [0, 1, 3])
    with pytest.raises(StoreError, match=r"wf/run is missing entries \[2, 4\]"):
        await store.copy_messages("wf/run", "wf/run~fork0001", 5)
    assert await store.entries_after("wf/run~fork0001") == []
    with pytest.raises(StoreError, match=r"missing entries \[0\]"):
        await store.copy_messages("nobody/here", "wf/run~fork0002", 1)
    assert await store.entries_after("wf/run~fork0002") == []


async def test_copy_messages_of_nothing(store: RunStore) -> None:
    assert await store.copy_messages("nobody/here", "wf/run~fork0001", 0) == 0
    assert await store.conversations() == []
    with pytest.raises(ValueError, match="negative"):
        await store.copy_messages("nobody/here", "wf/run~fork0001", -1)


async def test_copy_messages_onto_itself_changes_nothing(store: RunStore) -> None:
    await fill(store, "wf/run", range(3))
    before = await store.entries_after("wf/run")
    assert await store.copy_messages("wf/run", "wf/run", 3) == 3
    assert await store.entries_after("wf/run") == before


async def test_a_copy_is_a_write_of_the_target(store: RunStore, store_url: str) -> None:
    await fill(store, "wf/run", range(2))
    for seq in range(2):
        await set_written(store_url, "wf/run", seq, "2020-01-02 03:04:05")
    await store.copy_messages("wf/run", "wf/run~fork0001", 2)
    written = dict(await store.conversations())
    assert written["wf/run"] == 1577934245.0
    assert abs(written["wf/run~fork0001"] - time.time()) < 60


# --- conversations ----------------------------------------------------------------------------


async def test_conversations_lists_each_with_its_last_write(store: RunStore, store_url: str) -> None:
    assert await store.conversations() == []
    await fill(store, "b/wf/run", range(3))
    await fill(store, "a/run", range(1))
    await set_written(store_url, "b/wf/run", 0, "2021-06-01 00:00:00")
    await set_written(store_url, "b/wf/run", 1, "2021-06-01 00:00:09")  # the newest
    await set_written(store_url, "b/wf/run", 2, "2021-05-31 23:59:59")
    listed = await store.conversations()
    assert [c for c, _ in listed] == ["a/run", "b/wf/run"]
    assert dict(listed)["b/wf/run"] == 1622505609.0
    assert abs(dict(listed)["a/run"] - time.time()) < 60
    assert all(isinstance(t, float) for _, t in listed)


# --- blob_digests / delete_blobs --------------------------------------------------------------


async def test_blob_digests_lists_those_created_before(store: RunStore, store_url: str) -> None:
    old = await store.put_blob(b"old")
    edge = await store.put_blob(b"edge")
    new = await store.put_blob(b"new")
    await query(store_url, "UPDATE blobs SET created_at = ? WHERE digest = ?", (1000.0, old))
    await query(store_url, "UPDATE blobs SET created_at = ? WHERE digest = ?", (2000.0, edge))
    assert await store.blob_digests(2000.0) == [old]
    assert await store.blob_digests(2000.5) == sorted([old, edge])
    assert await store.blob_digests(0) == []
    assert await store.blob_digests(time.time() + 60) == sorted([old, edge, new])


async def test_a_second_put_does_not_make_a_blob_younger(store: RunStore, store_url: str) -> None:
    digest = await store.put_blob(b"again")
    await query(store_url, "UPDATE blobs SET created_at = ? WHERE digest = ?", (1000.0, digest))
    await store.put_blob(b"again")
    assert await store.blob_digests(2000.0) == [digest]


async def test_delete_blobs_counts_what_it_deleted(store: RunStore) -> None:
    a, b, c = [await store.put_blob(x) for x in (b"a", b"b", b"c")]
    absent = "sha256:" + hashlib.sha256(b"absent").hexdigest()
    assert await store.delete_blobs([]) == 0
    assert await store.delete_blobs([a, absent, a, "not a digest"]) == 1
    assert await store.get_blob(a) is None and await store.get_blob(b) == b"b"
    assert await store.delete_blobs([a]) == 0
    assert await store.delete_blobs([b, c]) == 2
    assert await store.blob_digests(time.time() + 60) == []


async def test_delete_blobs_in_bulk(store: RunStore) -> None:
    digests = [await store.put_blob(str(i).encode()) for i in range(2500)]
    keep = await store.put_blob(b"keep")
    assert await store.delete_blobs(digests) == 2500
    assert await store.blob_digests(time.time() + 60) == [keep]


async def test_blob_listing_uses_an_index(store_url: str) -> None:
    s = open_store(store_url)
    await s.put_blob(b"x")
    await s.close()
    if store_url.startswith("postgresql://"):
        rows = await query(store_url, "SELECT indexdef FROM pg_indexes WHERE indexname = 'blobs_created'")
    else:
        rows = await query(store_url, "SELECT sql FROM sqlite_master WHERE name = 'blobs_created'")
    assert len(rows) == 1 and "created_at" in str(rows[0][0])


async def test_the_index_migration_applies_to_a_database_of_the_previous_version(postgres_db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_db_url, autocommit=True) as conn:
        await conn.execute(
            "CREATE TABLE schema_migrations"
            " (version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        for version, sql in enumerate(POSTGRES_MIGRATIONS[:3], start=1):
            await conn.execute(sql)
            await conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (version,))
        await conn.execute("INSERT INTO blobs VALUES ('sha256:x', 1, 'raw', 'x', 1.0)")
    store = PostgresRunStore(postgres_db_url)
    try:
        assert await store.blob_digests(2.0) == ["sha256:x"]
    finally:
        await store.close()
    rows = await query(postgres_db_url, "SELECT version FROM schema_migrations ORDER BY version")
    assert [v for (v,) in rows] == list(range(1, len(POSTGRES_MIGRATIONS) + 1))
    assert await query(postgres_db_url, "SELECT 1 FROM pg_indexes WHERE indexname = 'blobs_created'") == [(1,)]
