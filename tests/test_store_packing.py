"""Transcript entries are compressed at rest in SQLite, and the WAL stays bounded."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from activities.store.base import StoreError
from activities.store.packing import PACK_AT_CHARS, pack_text, unpack_text
from activities.store.sqlite import WAL_SIZE_LIMIT, SQLiteRunStore
from workflows.types import Message

LOG_LINE = "2026-12-01 12:00:00 INFO worker polling task queue agents; nothing to do\n"


def test_short_and_incompressible_text_stays_text_and_everything_round_trips() -> None:
    assert pack_text("short") == "short"
    noisy = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(PACK_AT_CHARS * 2))  # barely compresses
    assert isinstance(pack_text(LOG_LINE * 100), bytes)
    for text in ("short", noisy, LOG_LINE * 100, "ü" * 5000):
        assert unpack_text(pack_text(text)) == text


def test_a_tampered_compressed_entry_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="does not decompress"):
        unpack_text(b"not zlib at all")


async def test_sqlite_store_keeps_tool_outputs_compressed_and_the_wal_bounded(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    store = SQLiteRunStore(path)
    output = LOG_LINE * 140  # ~10 KB, like a tool's log output
    try:
        for seq in range(300):
            await store.put_message("wf/run", seq, Message(role="tool", content=f"{seq}\n{output}", tool_call_id="c"))
        wal = path.with_name(path.name + "-wal")
        assert wal.stat().st_size <= WAL_SIZE_LIMIT + 512 * 1024  # SQLite truncates it back after checkpoints
        back = await store.messages("wf/run", 300)
        assert [m.message.content for m in back[:2]] == [f"0\n{output}", f"1\n{output}"]
    finally:
        await store.close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        stored = db.execute("SELECT SUM(LENGTH(message)) FROM transcript").fetchone()[0]
    raw = 300 * len(output)
    assert stored < raw * 0.2, (stored, raw)  # the log text compresses to under a fifth
