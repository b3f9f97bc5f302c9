"""``EncryptedRunStore`` over SQLite and PostgreSQL: nothing readable at rest, claims intact, rotation, bad keys."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from activities.store import StoreError, open_store
from activities.store.encrypted import EncryptedRunStore
from activities.store.ledger import ClaimRequest
from tests.crypto_keys import TEST_ONLY_K1, TEST_ONLY_K2, TEST_ONLY_WRONG_K1, ring
from workflows.types import Message, RecordedToolCall

MARKER = "MARKER-at-rest-7f3a"


def raw_bytes(url: str) -> bytes:
    """Every byte the store holds: the SQLite files (WAL included), or every row of every PostgreSQL table."""
    if url.startswith("postgresql://"):
        with psycopg.connect(url) as conn:
            tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
            rows = [str(conn.execute(f'SELECT * FROM "{t}"').fetchall()) for t in tables]
        return "".join(rows).encode()
    path = Path(url)
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


def claim(key: str, owner: str = "w1") -> ClaimRequest:
    return ClaimRequest(key=key, tool="echo", args_hash="h", workflow_id="wf-1", owner=owner, attempt=1, lease_s=30)


async def test_nothing_readable_at_rest_and_everything_reads_back(store_url: str) -> None:
    store = open_store(store_url, ring(TEST_ONLY_K1))
    assert isinstance(store, EncryptedRunStore)
    long = f"{MARKER} " * 200  # compressed before it is encrypted
    message = Message(
        role="assistant",
        content=long,
        tool_calls=[RecordedToolCall(id="c1", name="echo", arguments_json=f'{{"text": "{MARKER}"}}')],
    )
    try:
        stored = await store.put_message("conv-1", 0, message, {"checkpoint": MARKER})
        assert stored.message == message and stored.meta == {"checkpoint": MARKER}
        await store.put_message("conv-1", 1, Message(role="tool", content=MARKER, tool_call_id="c1"))
        again = await store.put_message("conv-1", 0, Message(role="assistant", content="later writer"))
        assert again.message == message, "insert-if-absent: the first writer still wins"
        assert [m.message.content for m in await store.messages("conv-1", 2)] == [long, MARKER]
        assert await store.copy_messages("conv-1", "conv-1~fork", 2) == 2
        assert (await store.transcript("conv-1~fork"))[1].message.content == MARKER
        assert [m.seq for m in await store.entries_after("conv-1")] == [0, 1]
        assert (await store.claim(claim("key-1"))).status == "fresh"
        assert (await store.claim(claim("key-1", owner="w2"))).status == "busy"
        await store.finish("key-1", "w1", "done", f"result {MARKER}", False, note=f"note {MARKER}")
        done = await store.claim(claim("key-1", owner="w2"))
        assert done.status == "done" and done.entry.result == f"result {MARKER}"
        assert (await store.ledger("wf-1"))[0].note == f"note {MARKER}"
        digest = await store.put_blob(MARKER.encode() * 100)
        assert await store.put_blob(MARKER.encode() * 100) == digest, "same bytes, same key: stored once"
        assert await store.get_blob(digest) == MARKER.encode() * 100
        assert await store.blob_digests(float("inf")) == [digest]
        assert b"MARKER" not in raw_bytes(store_url)
    finally:
        await store.close()


async def test_rotation_reads_old_rows_and_writes_with_the_new_key(store_url: str) -> None:
    old = open_store(store_url, ring(TEST_ONLY_K1))
    await old.put_message("conv-1", 0, Message(role="user", content=MARKER))
    await old.claim(claim("key-1"))
    await old.finish("key-1", "w1", "done", MARKER, False)
    digest = await old.put_blob(MARKER.encode())
    await old.close()
    rotated = open_store(store_url, ring(f"{TEST_ONLY_K2},{TEST_ONLY_K1}"))
    try:
        assert (await rotated.messages("conv-1", 1))[0].message.content == MARKER
        assert (await rotated.ledger())[0].result == MARKER
        assert await rotated.get_blob(digest) == MARKER.encode()
        await rotated.put_message("conv-1", 1, Message(role="user", content=MARKER))
        assert isinstance(rotated, EncryptedRunStore)
        raw = await rotated.inner.messages("conv-1", 2)
        assert [m.message.content.split(":")[0] for m in raw] == ["test-k1", "test-k2"]
    finally:
        await rotated.close()
    new_only = open_store(store_url, ring(TEST_ONLY_K2))
    try:
        with pytest.raises(StoreError, match="key 'test-k1', which is not in the key ring"):
            await new_only.messages("conv-1", 2)
        assert (await new_only.get_message("conv-1", 1)) is not None  # the new row reads with the new key
    finally:
        await new_only.close()


async def test_a_wrong_key_is_a_store_error_not_garbage(tmp_path: Path) -> None:
    url = str(tmp_path / "store.sqlite3")
    good = open_store(url, ring(TEST_ONLY_K1))
    await good.put_message("conv-1", 0, Message(role="user", content=MARKER))
    await good.claim(claim("key-1"))
    await good.finish("key-1", "w1", "done", MARKER, False)
    digest = await good.put_blob(MARKER.encode())
    await good.close()
    wrong = open_store(url, ring(TEST_ONLY_WRONG_K1))
    try:
        with pytest.raises(StoreError, match="does not authenticate"):
            await wrong.get_message("conv-1", 0)
        with pytest.raises(StoreError, match="does not authenticate"):
            await wrong.ledger()
        with pytest.raises(StoreError, match=f"blob {digest}"):
            await wrong.get_blob(digest)
    finally:
        await wrong.close()


async def test_rows_written_before_encryption_still_read(tmp_path: Path) -> None:
    url = str(tmp_path / "store.sqlite3")
    plain = open_store(url)
    await plain.put_message("conv-1", 0, Message(role="user", content="old"))
    digest = await plain.put_blob(b"old blob")
    await plain.close()
    store = open_store(url, ring(TEST_ONLY_K1))
    try:
        assert (await store.messages("conv-1", 1))[0].message.content == "old"
        assert await store.get_blob(digest) == b"old blob"
    finally:
        await store.close()
    with sqlite3.connect(url) as db:  # and the plaintext store shows no key material either
        assert b"durable-agents-test" not in str(db.execute("SELECT * FROM transcript").fetchall()).encode()
