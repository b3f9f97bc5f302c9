"""The model activity's transcript cache: reads only what is new, never returns what the store does not hold."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from activities.runtime import Runtime
from activities.settings import Settings, WorkerSettings
from activities.store import RunStore, StoreError
from activities.store.base import StoredMessage
from activities.store.transcript_cache import (
    DEFAULT_MAX_CONVERSATIONS,
    MIN_CONVERSATIONS,
    TranscriptCache,
    conversations_for,
)
from tests.test_store_transcripts import fill
from workflows.types import Message

# ``store`` (SQLite and PostgreSQL) comes from tests/pg.py.


class ReadLog:
    """A real store whose transcript reads are written down (which positions each read asked for)."""

    def __init__(self, store: RunStore) -> None:
        self._store = store
        self.reads: list[tuple[str, int, int]] = []

    async def entries_after(self, conversation_id: str, after: int = -1, limit: int = 1000) -> list[StoredMessage]:
        self.reads.append(("entries_after", after, limit))
        return await self._store.entries_after(conversation_id, after, limit)

    async def messages(self, conversation_id: str, upto: int) -> list[StoredMessage]:
        self.reads.append(("messages", 0, upto))
        return await self._store.messages(conversation_id, upto)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def contents(messages: list[Message]) -> list[str]:
    return [m.content for m in messages]


async def test_a_turn_reads_only_the_entries_past_what_it_has(store: RunStore) -> None:
    spy = ReadLog(store)
    cache = TranscriptCache(spy)
    await fill(store, "c", range(5))
    assert contents(await cache.messages("c", 5)) == ["0", "1", "2", "3", "4"]
    # Two more entries written elsewhere (another worker): only those two are read.
    await fill(store, "c", range(5, 7))
    spy.reads.clear()
    assert contents(await cache.messages("c", 7)) == [str(i) for i in range(7)]
    assert spy.reads == [("entries_after", 4, 2)]
    # A shorter prefix comes from memory alone.
    spy.reads.clear()
    assert contents(await cache.messages("c", 3)) == ["0", "1", "2"]
    assert spy.reads == []


async def test_what_the_worker_writes_itself_is_not_read_back(store: RunStore) -> None:
    spy = ReadLog(store)
    cache = TranscriptCache(spy)
    await fill(store, "c", range(2))
    await cache.messages("c", 2)
    cache.remember("c", await store.put_message("c", 2, Message(role="assistant", content="reply"), {}))
    # Not contiguous with the prefix: ignored, so it is read from the store when asked for.
    cache.remember("c", await store.put_message("c", 4, Message(role="tool", content="later"), {}))
    spy.reads.clear()
    assert contents(await cache.messages("c", 3)) == ["0", "1", "reply"]
    assert spy.reads == []


async def test_a_gap_is_the_stores_error_and_nothing_is_cached_past_it(store: RunStore) -> None:
    cache = TranscriptCache(store)
    await fill(store, "c", [0, 1, 3])
    with pytest.raises(StoreError, match=r"missing entries \[2\]"):
        await cache.messages("c", 4)
    await fill(store, "c", [2])
    assert contents(await cache.messages("c", 4)) == ["0", "1", "2", "3"]


async def test_reads_longer_than_a_page_come_back_whole(store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("activities.store.transcript_cache.PAGE", 3)
    cache = TranscriptCache(store)
    await fill(store, "c", range(8))
    assert contents(await cache.messages("c", 8)) == [str(i) for i in range(8)]


async def test_the_bound_evicts_the_least_recently_used_conversation(store: RunStore) -> None:
    spy = ReadLog(store)
    one_entry = len("0") + 512
    cache = TranscriptCache(spy, max_chars=4 * one_entry)
    await fill(store, "a", range(2))
    await fill(store, "b", range(2))
    await fill(store, "big", range(5))
    await cache.messages("a", 2)
    await cache.messages("b", 2)
    assert len(cache) == 2 and cache.chars == 4 * one_entry
    await cache.messages("a", 2)  # a is now the most recent
    await fill(store, "d", range(1))
    await cache.messages("d", 1)  # over the bound: b goes
    spy.reads.clear()
    await cache.messages("a", 2)
    assert spy.reads == []
    await cache.messages("b", 2)
    assert spy.reads and spy.reads[0][0] == "entries_after" and spy.reads[0][1] == -1
    # Larger than the whole bound: never held, always right.
    assert contents(await cache.messages("big", 5)) == [str(i) for i in range(5)]
    assert "big" not in cache._prefixes
    assert cache.chars <= 4 * one_entry


def test_a_workers_conversation_bound_follows_its_workflow_cache() -> None:
    assert conversations_for(500) == 1000
    assert conversations_for(0) == MIN_CONVERSATIONS
    assert conversations_for(100_000) == DEFAULT_MAX_CONVERSATIONS


@pytest.mark.parametrize("cached_workflows", [0, 40])
async def test_a_runtime_keeps_no_more_conversations_than_its_bound(settings: Settings, cached_workflows: int) -> None:
    runtime = Runtime.from_settings(replace(settings, worker=WorkerSettings(max_cached_workflows=cached_workflows)))
    try:
        bound = conversations_for(cached_workflows)
        for n in range(bound + 5):
            await fill(runtime.store, f"c{n}", range(1))
            await runtime.transcripts.messages(f"c{n}", 1)
        assert len(runtime.transcripts) == bound
        # The least recently used went first; the newest are still held.
        assert "c0" not in runtime.transcripts._prefixes and f"c{bound + 4}" in runtime.transcripts._prefixes
    finally:
        await runtime.aclose()
