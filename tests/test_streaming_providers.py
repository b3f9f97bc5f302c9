"""Streamed model turns against the fake LLM server's SSE wire formats, the delta channel on SQLite and
PostgreSQL, and the publisher's batching and redaction (no Temporal here; ``test_streaming`` runs runs)."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from pathlib import Path

import pytest

from activities.models.anthropic import AnthropicProvider
from activities.models.base import RetryableProviderError
from activities.models.http_provider import HttpProvider
from activities.models.openai import OpenAIProvider
from activities.models.sse import MAX_LINE_BYTES
from activities.redaction import redact
from activities.store_urls import is_postgres
from activities.streaming.base import DeltaChannel, DeltaSealer
from activities.streaming.postgres import PostgresDeltaChannel
from activities.streaming.publisher import DeltaPublisher
from activities.streaming.sqlite import SQLiteDeltaChannel
from tests.crypto_keys import TEST_ONLY_PAYLOAD_KEYS, ring
from tests.fakes.llm_server import FakeLLMServer, Scripted
from workflows.types import Message

TOOLS = [{"name": "echo", "description": "Echo.", "parameters": {"type": "object", "properties": {}}}]
PROMPT = [Message(role="system", content="Be brief."), Message(role="user", content="hi")]


def provider_for(wire: str, llm: FakeLLMServer) -> HttpProvider:
    return OpenAIProvider(llm.openai_url, None) if wire == "openai" else AnthropicProvider(llm.anthropic_url, None)


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_a_streamed_turn_answers_what_the_plain_one_does(wire: str, llm: FakeLLMServer) -> None:
    provider = provider_for(wire, llm)
    script = Scripted(text="Hello, streaming wörld!", tool_calls=[("echo", '{"text": "hi", "n": 2}')], output_tokens=7)
    llm.enqueue(script, script)
    pieces: list[str] = []

    async def sink(text: str) -> None:
        pieces.append(text)

    assert isinstance(provider, OpenAIProvider | AnthropicProvider)
    streamed = await provider.stream("m", PROMPT, TOOLS, on_text=sink, max_output_tokens=100)
    plain = await provider.complete("m", PROMPT, TOOLS, max_output_tokens=100)
    await provider.aclose()
    assert len(pieces) > 3 and "".join(pieces) == plain.text == streamed.text
    ignore = {"response_id": True, "tool_calls": {0: {"id"}}}
    assert streamed.model_dump(exclude=ignore) == plain.model_dump(exclude=ignore)  # type: ignore[arg-type]
    assert streamed.tool_calls[0].arguments_json == plain.tool_calls[0].arguments_json
    assert (streamed.input_tokens, streamed.output_tokens) == (10, 7)
    stream_body, plain_body = llm.requests[0]["body"], llm.requests[1]["body"]
    assert stream_body["stream"] is True and "stream" not in plain_body
    if wire == "openai":
        assert stream_body["stream_options"] == {"include_usage": True}
    assert llm.requests[0]["headers"]["accept"] == "text/event-stream"


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_a_stream_cut_mid_reply_or_refused_is_an_error_a_retry_can_fix(wire: str, llm: FakeLLMServer) -> None:
    provider = provider_for(wire, llm)
    assert isinstance(provider, OpenAIProvider | AnthropicProvider)
    llm.enqueue(
        Scripted(text="a reply that never ends", cut_after=4),
        Scripted(status=429, text="slow down", headers={"retry-after": "3"}),
    )
    pieces: list[str] = []

    async def sink(text: str) -> None:
        pieces.append(text)

    with pytest.raises(RetryableProviderError, match="stream ended before the reply was complete"):
        await provider.stream("m", PROMPT, [], on_text=sink)
    assert pieces and "".join(pieces) != "a reply that never ends"
    with pytest.raises(RetryableProviderError, match="429: slow down") as refused:
        await provider.stream("m", PROMPT, [], on_text=sink)
    assert refused.value.retry_after_s == 3.0
    await provider.aclose()


def open_channel_at(url: str, sealer: DeltaSealer | None = None) -> DeltaChannel:
    return PostgresDeltaChannel(url, sealer) if is_postgres(url) else SQLiteDeltaChannel(url, sealer)


async def test_the_channel_orders_wakes_prunes_erases_and_seals(store_url: str) -> None:
    channel = open_channel_at(store_url, DeltaSealer(ring(TEST_ONLY_PAYLOAD_KEYS)))
    run, other = f"wf-{uuid.uuid4().hex[:8]}", f"wf-{uuid.uuid4().hex[:8]}"
    try:
        assert not await channel.listening(run)
        await channel.listen(run, ttl_s=60)
        await channel.listen(run, ttl_s=-60)  # a shorter renewal does not cut a reader's time
        assert await channel.listening(run) and not await channel.listening(other)
        seqs = [await channel.append(run, turn, 1, False, f"piece {turn}") for turn in (1, 1, 2)]
        await channel.append(other, 1, 2, True, "someone else's")
        assert seqs == [1, 2, 3]
        got = await channel.read(run, 1)
        assert [(d.seq, d.turn, d.text) for d in got] == [(2, 1, "piece 1"), (3, 2, "piece 2")]
        assert [(d.attempt, d.restart) for d in await channel.read(other, 0)] == [(2, True)]

        waiting = asyncio.create_task(channel.wait(run, 3, timeout_s=600))
        await asyncio.sleep(0)  # the waiter registers before the append it must see
        await channel.append(run, 3, 1, False, "woken")
        await asyncio.wait_for(waiting, 60)  # woken by the append, far before its own timeout
        assert (await channel.read(run, 3))[0].text == "woken"

        assert await channel.prune(run, before_turn=2, older_than=float("inf")) == 2  # turn 1's rows
        assert [d.seq for d in await channel.read(run, 0)] == [3, 4]
        assert await channel.count(run) == 2
        assert await channel.delete(run) == 2
        assert await channel.read(run, 0) == [] and not await channel.listening(run)
        assert await channel.count(other) == 1
        assert "someone else" not in await raw_texts(store_url)  # sealed at rest
        assert await channel.expire(float("inf")) == 1
    finally:
        await channel.close()


async def raw_texts(url: str) -> str:
    if not is_postgres(url):
        with sqlite3.connect(url) as conn:
            return " ".join(r[0] for r in conn.execute("SELECT text FROM stream_deltas"))
    import psycopg

    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute("SELECT text FROM stream_deltas")
        return " ".join(r[0] for r in await cur.fetchall())


async def test_the_publisher_batches_and_never_writes_a_secret_split_over_deltas(tmp_path: Path) -> None:
    secret = "sk-test-0123456789abcdefSECRET"
    channel = SQLiteDeltaChannel(tmp_path / "store.sqlite3")
    publisher = DeltaPublisher(channel, "wf-secret", 3, 2, [secret])
    text = "Your key is " + secret + ", keep it. " + "More words follow here. " * 60
    for start in range(0, len(text), 5):  # the secret arrives in seven pieces
        await publisher.text(text[start : start + 5])
    await publisher.finish(redact(text, [secret]))
    rows = await channel.read("wf-secret", 0)
    await channel.close()
    joined = "".join(d.text for d in rows)
    assert joined == redact(text, [secret]) and secret[:12] not in joined
    assert 1 < len(rows) < len(text) // 5 // 4  # batched: far fewer rows than deltas
    assert rows[0].restart and not any(d.restart for d in rows[1:])  # attempt 2: its first row restarts
    assert {(d.turn, d.attempt) for d in rows} == {(3, 2)}


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
@pytest.mark.parametrize(
    ("body", "errors"),
    [
        ("data: " + "x" * (MAX_LINE_BYTES + 10), ("line over the size limit",) * 2),
        ("event: x\ndata: {not json\n\n", ("malformed response from provider",) * 2),
        # OpenAI's choices must be a list; an Anthropic stream that never says message_stop is cut short.
        ('data: {"type": "message_start", "choices": "none"}\n\n', ("choices is not a list", "ended before")),
    ],
)
async def test_a_hostile_stream_is_a_clear_error_not_a_hang_or_a_crash(
    wire: str, body: str, errors: tuple[str, str], llm: FakeLLMServer
) -> None:
    provider = provider_for(wire, llm)
    assert isinstance(provider, OpenAIProvider | AnthropicProvider)
    llm.enqueue(Scripted(raw_body=body))
    pieces: list[str] = []

    async def sink(text: str) -> None:
        pieces.append(text)

    with pytest.raises(RetryableProviderError, match=errors[0] if wire == "openai" else errors[1]):
        await provider.stream("m", PROMPT, [], on_text=sink)
    await provider.aclose()
    assert pieces == []
