"""Token streaming out of band, on the real dev server with the fake model server's SSE wire formats and
the run store's delta channel on SQLite and PostgreSQL.

A reader sees a turn's first delta while the fake server still holds the rest of the reply (the turn
cannot have completed); all the deltas together are the reply; the run's history is the size of the same
run's unstreamed history (within 5%); a run nobody listens to makes a plain request and writes no delta;
a model call cut mid-stream and retried marks its new attempt's first delta as a restart; forgetting a
tenant deletes its runs' deltas and leaves another tenant's.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import replace

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.settings import Settings
from durable_agents import forgetting
from durable_agents.agent_client import AgentClient, RunEvent
from durable_agents.search_attributes import ensure_search_attributes
from durable_agents.streaming import DeltaReader
from tests.conftest import WorkerFactory
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.types import AgentInput, AgentResult

MODELS = {"openai": "openai:test-model", "anthropic": "anthropic:test-model"}
TEXT = "The quick brown fox jumps over the lazy dog, and then it streams. " * 30


async def deltas_until(reader: DeltaReader, workflow_id: str, done: object, after: int = 0) -> list[RunEvent]:
    """Deltas read (waiting between reads) until ``done(events)`` is true."""
    events: list[RunEvent] = []
    while not callable(done) or not done(events):
        got = await reader.read(workflow_id, events[-1].cursor.seq if events else after, 500)
        events += got
        if not got:
            await reader.wait(workflow_id, events[-1].cursor.seq if events else after, timeout_s=30.0)
    return events


async def start(
    client: Client, tq: str, workflow_id: str, *, tenant: str = ""
) -> WorkflowHandle[AgentWorkflow, AgentResult]:
    return await client.start_workflow(
        AgentWorkflow.run, AgentInput(task="tell me", tenant=tenant), id=workflow_id, task_queue=tq
    )


def runtime_for(settings: Settings, store_url: str, wire: str) -> Runtime:
    return Runtime.from_settings(replace(settings, store_url=store_url, model=MODELS[wire]))


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_deltas_reach_a_reader_before_the_turn_completes_and_history_stays_the_size(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    store_url: str,
    llm: FakeLLMServer,
    run_worker: WorkerFactory,
    wire: str,
) -> None:
    client = dev_env.client
    runtime = runtime_for(settings, store_url, wire)
    reader = DeltaReader.from_settings(runtime.settings)
    token = uuid.uuid4().hex[:10]
    streamed_id, plain_id = f"stream-on-{token}", f"stream-no-{token}"  # ids of one length: histories compare
    hold = threading.Event()
    try:
        async with run_worker(client, runtime) as tq:
            await reader.listen(streamed_id)
            llm.enqueue(Scripted(text=TEXT, hold=hold))
            handle = await start(client, tq, streamed_id)
            first = await deltas_until(reader, streamed_id, lambda events: events)
            seen_at = time.monotonic()
            # The server holds the rest of the reply until now: the turn is open, and what came is a prefix.
            assert not hold.is_set()
            assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
            assert TEXT.startswith(first[0].text) and len(first[0].text) < len(TEXT)
            assert (first[0].kind, first[0].turn, first[0].attempt, first[0].data) == (
                "delta",
                1,
                1,
                {"restart": False},
            )
            latency_ms = 1000 * (seen_at - llm.requests[-1]["first_text_at"])
            print(f"\n[{wire}] first delta {latency_ms:.1f} ms after the server sent it")
            hold.set()
            head = "".join(e.text for e in first)
            events = first + await deltas_until(
                reader,
                streamed_id,
                lambda events: head + "".join(e.text for e in events) == TEXT,
                after=first[-1].cursor.seq,
            )
            assert [e.cursor.seq for e in events] == list(range(1, len(events) + 1))
            result = await handle.result()
            assert result.output == TEXT
            print(f"[{wire}] {len(TEXT)} characters streamed in {len(events)} rows")

            llm.enqueue(Scripted(text=TEXT))  # the same run, nobody listening
            plain = await start(client, tq, plain_id)
            assert (await plain.result()).output == TEXT
            assert await reader.read(plain_id, 0) == []

        bodies = [r["body"] for r in llm.requests]
        assert [b.get("stream") for b in bodies] == [True, None]  # no listener: the plain, whole-reply request
        streamed_size = len((await handle.fetch_history()).to_json())
        plain_size = len((await plain.fetch_history()).to_json())
        print(f"[{wire}] history {streamed_size} bytes streamed, {plain_size} bytes unstreamed")
        assert abs(streamed_size - plain_size) < 0.05 * plain_size
    finally:
        await reader.close()
        await runtime.aclose()


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_a_turn_cut_mid_stream_and_retried_marks_its_restart(
    dev_env: WorkflowEnvironment, settings: Settings, llm: FakeLLMServer, run_worker: WorkerFactory, wire: str
) -> None:
    client = dev_env.client
    runtime = runtime_for(settings, settings.store_url, wire)
    reader = DeltaReader.from_settings(runtime.settings)
    workflow_id = f"stream-retry-{uuid.uuid4().hex[:10]}"
    hold = threading.Event()
    retried = "A second attempt, told from the start."
    cut = 3 if wire == "openai" else 5  # the event after the first text piece
    llm.enqueue(Scripted(text="A first attempt that breaks off " * 4, hold=hold, cut_after=cut), Scripted(text=retried))
    try:
        async with run_worker(client, runtime) as tq:
            await reader.listen(workflow_id)
            handle = await start(client, tq, workflow_id)
            first = await deltas_until(reader, workflow_id, lambda events: events)
            assert (first[0].attempt, first[0].data["restart"]) == (1, False)
            hold.set()  # the server now drops the connection: the activity fails and is retried
            events = first + await deltas_until(
                reader,
                workflow_id,
                lambda events: "".join(e.text for e in events if e.attempt == 2) == retried,
                after=first[-1].cursor.seq,
            )
            assert (await handle.result()).output == retried
        second = [e for e in events if e.attempt == 2]
        assert second[0].data["restart"] is True and not any(e.data["restart"] for e in second[1:])
        assert all(e.data["restart"] is False for e in events if e.attempt == 1)
        assert {e.turn for e in events} == {1}
        # What a client shows: the text after the last restart mark.
        shown = ""
        for e in events:
            shown = e.text if e.data["restart"] else shown + e.text
        assert shown == retried
        assert [r["body"].get("stream") for r in llm.requests] == [True, True]
    finally:
        await reader.close()
        await runtime.aclose()


async def test_forgetting_a_tenant_deletes_its_streamed_text(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    postgres_db_url: str,
    llm: FakeLLMServer,
    run_worker: WorkerFactory,
) -> None:
    client = dev_env.client
    runtime = runtime_for(settings, postgres_db_url, "openai")
    runtime.search_attributes_ready = await ensure_search_attributes(client)
    assert runtime.search_attributes_ready, "forget finds a tenant's runs by their AgentTenant search attribute"
    reader = DeltaReader.from_settings(runtime.settings)
    token = uuid.uuid4().hex[:8]
    tenants = {f"acme-{token}": f"stream-acme-{token}", f"other-{token}": f"stream-other-{token}"}
    try:
        async with run_worker(client, runtime) as tq:
            for tenant, workflow_id in tenants.items():
                await reader.listen(workflow_id)
                llm.enqueue(Scripted(text=f"{tenant} says hello, streamed."))
                await (await start(client, tq, workflow_id, tenant=tenant)).result()
                assert await runtime.deltas.count(workflow_id) > 0
        (gone_tenant, gone), (kept_tenant, kept) = tenants.items()
        await eventually(lambda: forgetting.find_runs(client, gone_tenant, None), "the run is visible to forget")
        report = await forgetting.forget(client, runtime.store, gone_tenant, deltas=runtime.deltas)
        assert report.counts["stream_deltas"] > 0
        assert await runtime.deltas.count(gone) == 0 and await reader.read(gone, 0) == []
        assert "".join(e.text for e in await reader.read(kept, 0)) == f"{kept_tenant} says hello, streamed."
    finally:
        await reader.close()
        await runtime.aclose()


async def test_agent_client_events_merge_a_turns_text_while_it_streams(
    dev_env: WorkflowEnvironment, settings: Settings, llm: FakeLLMServer, run_worker: WorkerFactory
) -> None:
    client = dev_env.client
    runtime = runtime_for(settings, settings.store_url, "openai")
    reader = DeltaReader.from_settings(runtime.settings)
    workflow_id = f"stream-events-{uuid.uuid4().hex[:10]}"
    hold, first_delta = threading.Event(), asyncio.Event()
    llm.enqueue(Scripted(text=TEXT, hold=hold))
    seen: list[RunEvent] = []

    async def follow(agents: AgentClient) -> None:
        async for event in agents.events(workflow_id):
            seen.append(event)
            if event.kind == "delta":
                first_delta.set()

    try:
        async with run_worker(client, runtime) as tq:
            agents = AgentClient(client, task_queue=tq, deltas=reader)
            await reader.listen(workflow_id)
            await start(client, tq, workflow_id)
            following = asyncio.create_task(follow(agents))
            await asyncio.wait_for(first_delta.wait(), 60)
            assert not hold.is_set() and not any(e.kind == "finished" for e in seen)  # the turn is open
            hold.set()
            await asyncio.wait_for(following, 120)  # events() ends when the run closes
            deltas = [e for e in seen if e.kind == "delta"]
            assert "".join(e.text for e in deltas) == TEXT
            assert [e.cursor.seq for e in deltas] == list(range(1, len(deltas) + 1))
            assert any(e.kind == "finished" for e in seen)
            # A cursor resumes after the deltas it has seen: nothing of the text comes twice.
            again = [e async for e in agents.events(workflow_id, after=deltas[2].cursor) if e.kind == "delta"]
            assert "".join(e.text for e in deltas[:3] + again) == TEXT
    finally:
        await reader.close()
        await runtime.aclose()
