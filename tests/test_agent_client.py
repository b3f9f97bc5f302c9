"""``AgentClient`` on the real dev server: start, status, pending, decide, cancel, list, result, tenants.

A worker runs on a dev server of its own that has the ``Agent*`` search attributes (tenant scoping
of ``list`` and ``pending`` reads ``AgentTenant``); the model is the fake LLM server, which asks for
``http_request`` POSTs to a real HTTP sink, so a decision's effect is seen where it lands.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pydantic import SecretStr
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from durable_agents.agent_client import (
    AgentClient,
    DecisionRefused,
    InvalidRequest,
    MessageRefused,
    NoAnswer,
    NoSuchStep,
    PendingItem,
    RunExists,
    RunNotFound,
    RunNotOpen,
)
from tests.conftest import TEMPORAL_CLI, WorkerFactory, with_settings
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually
from workflows.progress import COST_USD, FORK_OF, MODEL, PENDING_APPROVALS, STATE, TENANT
from workflows.session_types import SessionSpec
from workflows.types import AgentInput

KEY = "agent-client-test-key"


@pytest.fixture
def cache_mode() -> str:
    return "cached"


@pytest.fixture
async def indexed_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI),
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
        search_attributes=[STATE, PENDING_APPROVALS, TENANT, MODEL, COST_USD, FORK_OF],
    )
    yield env
    await env.shutdown()


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


def orders(sink: HttpSink) -> Any:
    """A task ``order N`` POSTs ``/orders/N`` (asked first: a write) and then says what it got back."""

    def reply(request: dict[str, Any]) -> Scripted:
        messages = request["messages"]
        task = next(m["content"] for m in messages if m["role"] == "user")
        results = [m["content"] for m in messages if m["role"] == "tool"]
        if results:
            return Scripted(text=f"{task}: {results[-1][:60]}")
        if task.startswith("order "):
            url = f"{sink.url}/orders/{task.split()[1]}"
            return Scripted(tool_calls=[("http_request", json.dumps({"method": "POST", "url": url, "json": {}}))])
        return Scripted(text=f"{task}: done")

    return reply


async def waiting_item(agents: AgentClient, workflow_id: str) -> PendingItem:
    async def one() -> PendingItem | None:
        try:
            items, _ = await agents.pending(workflow_id)
        except NoAnswer:  # the worker has just started: its first poll has not reached the server yet
            return None
        return items[0] if items else None

    return await eventually(one, f"{workflow_id} waits for an approval")


async def test_start_status_pending_decide_result(
    indexed_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    llm.default = orders(sink)
    client = indexed_env.client
    runtime = with_settings(runtime, approval_key=SecretStr(KEY))
    runtime.search_attributes_ready = True
    async with run_worker(client, runtime) as task_queue:
        agents = AgentClient(client, task_queue=task_queue, approval_key=SecretStr(KEY))
        ref = await agents.start(AgentInput(task="order 7"), workflow_id=f"ac-{uuid.uuid4().hex[:8]}")
        assert ref.run_id
        with pytest.raises(RunExists, match="already running"):
            await agents.start(AgentInput(task="order 7"), workflow_id=ref.workflow_id)

        item = await waiting_item(agents, ref.workflow_id)
        assert item.workflow_id == ref.workflow_id and item.tool == "http_request"
        assert item.args["url"].endswith("/orders/7")
        view = await agents.status(ref.workflow_id)
        assert view.state == "waiting_approval" and [a.approval_id for a in view.pending_approvals] == [
            item.approval_id
        ]
        everyone, token = await agents.pending()
        assert [i.approval_id for i in everyone] == [item.approval_id] and token == ""

        with pytest.raises(DecisionRefused, match="refused"):
            await agents.decide(ref.workflow_id, "ap_nope", "approve", reviewer="alice")
        assert sink.writes() == []
        message = await agents.decide(ref.workflow_id, item.approval_id, "approve", reviewer="alice")
        assert item.approval_id in message, message  # the run names the decision it applied
        result = await agents.result(ref.workflow_id)
        assert result.status == "completed" and result.output.startswith("order 7:"), result
        assert [w.path for w in sink.writes()] == ["/orders/7"]  # signed (the worker requires it) and run once
        closed = await agents.status(ref.workflow_id)
        assert closed.state == "completed" and closed.step == result.steps
        assert [(d.decision, d.reviewer) for d in closed.decisions] == [("approved", "alice")]

        with pytest.raises(RunNotOpen, match="has already ended: completed"):
            await agents.cancel(ref.workflow_id)
        with pytest.raises(RunNotOpen, match="is not running"):
            await agents.decide(ref.workflow_id, item.approval_id, "approve", reviewer="alice")
        with pytest.raises(RunNotFound, match="no run with id"):
            await agents.status("no-such-run")


async def test_a_rejection_reaches_the_model_and_cancel_stops_a_run(
    indexed_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    llm.default = orders(sink)
    client = indexed_env.client
    runtime.search_attributes_ready = True
    async with run_worker(client, runtime) as task_queue:
        agents = AgentClient(client, task_queue=task_queue)
        rejected = await agents.start(AgentInput(task="order 1"))
        cancelled = await agents.start(AgentInput(task="order 2"))
        item = await waiting_item(agents, rejected.workflow_id)
        await agents.decide(rejected.workflow_id, item.approval_id, "reject", reviewer="bob", reason="out of stock")
        result = await agents.result(rejected.workflow_id)
        assert "out of stock" in result.output, result.output  # the model read the reason
        await waiting_item(agents, cancelled.workflow_id)
        await agents.cancel(cancelled.workflow_id, reason="not needed")
        assert (await agents.result(cancelled.workflow_id)).status == "cancelled"
        assert (await agents.status(cancelled.workflow_id)).state == "cancelled"
        assert sink.writes() == []


async def test_a_tenant_sees_and_touches_only_its_own_runs(
    indexed_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    llm.default = orders(sink)
    client = indexed_env.client
    runtime.search_attributes_ready = True
    async with run_worker(client, runtime) as task_queue:
        agents = AgentClient(client, task_queue=task_queue)
        a, b = agents.for_tenant("a"), agents.for_tenant("b")
        assert a.tenant == "a" and agents.tenant is None and a.task_queue == task_queue

        mine = await a.start(AgentInput(task="order 10"))
        theirs = await b.start(AgentInput(task="order 20"))
        done = await b.start(AgentInput(task="hello"))
        with pytest.raises(InvalidRequest, match="names tenant 'b'"):
            await a.start(AgentInput(task="order 30", tenant="b"))
        own = await waiting_item(a, mine.workflow_id)
        other = await waiting_item(b, theirs.workflow_id)
        await b.result(done.workflow_id)

        # Every call on another tenant's run is the same RunNotFound as a run that does not exist.
        for run in (theirs.workflow_id, done.workflow_id):
            with pytest.raises(RunNotFound, match=f"no run with id '{run}'"):
                await a.status(run)
            with pytest.raises(RunNotFound):
                await a.describe(run)
            with pytest.raises(RunNotFound):
                await a.result(run)
            with pytest.raises(RunNotFound):
                await a.cancel(run)
            with pytest.raises(RunNotFound):
                await a.pending(run)
        with pytest.raises(RunNotFound):
            await a.decide(theirs.workflow_id, other.approval_id, "approve", reviewer="alice")
        with pytest.raises(RunNotFound):  # an entry made by hand does not get past the check either
            await a.decide(theirs.workflow_id, other.approval_id, "approve", reviewer="alice", approval=other)
        assert sink.writes() == []
        assert (await agents.status(theirs.workflow_id)).state == "waiting_approval"  # untouched

        async def listed(scoped: AgentClient, count: int) -> set[str]:
            runs, _ = await scoped.list()
            assert len(runs) == count, runs
            return {r.workflow_id for r in runs}

        assert await eventually(lambda: listed(a, 1), "a's run is listed") == {mine.workflow_id}
        assert await eventually(lambda: listed(b, 2), "b's runs are listed") == {theirs.workflow_id, done.workflow_id}
        runs, _ = await b.list(state="completed")
        assert [(r.workflow_id, r.tenant, r.state) for r in runs] == [(done.workflow_id, "b", "completed")]

        async def pending_of(scoped: AgentClient) -> list[str]:
            items, _ = await scoped.pending()
            assert items, "nothing listed yet"
            return [i.approval_id for i in items]

        assert await eventually(lambda: pending_of(a), "a's approval is listed") == [own.approval_id]
        assert await eventually(lambda: pending_of(b), "b's approval is listed") == [other.approval_id]
        everyone = await eventually(lambda: pending_of(agents), "every approval is listed")
        assert sorted(everyone) == sorted([own.approval_id, other.approval_id])

        await a.decide(mine.workflow_id, own.approval_id, "approve", reviewer="alice")
        assert (await a.result(mine.workflow_id)).status == "completed"
        assert [w.path for w in sink.writes()] == ["/orders/10"]
        await b.cancel(theirs.workflow_id)


async def test_pending_pages_through_the_waiting_runs(
    indexed_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    llm.default = orders(sink)
    client = indexed_env.client
    runtime.search_attributes_ready = True
    async with run_worker(client, runtime) as task_queue:
        agents = AgentClient(client, task_queue=task_queue).for_tenant("paged")
        refs = [await agents.start(AgentInput(task=f"order {n}")) for n in range(3)]
        for ref in refs:
            await waiting_item(agents, ref.workflow_id)

        async def visible() -> bool:
            page = await agents.pending_page(limit=10)
            return len(page.items) == 3

        await eventually(visible, "three runs wait")
        first, token = await agents.pending(limit=2)
        assert len(first) == 2 and token == "2"
        second, end = await agents.pending(limit=2, page_token=token)
        assert len(second) == 1 and end == ""
        assert {i.workflow_id for i in first + second} == {r.workflow_id for r in refs}
        with pytest.raises(InvalidRequest, match="not a page token"):
            await agents.pending(page_token="x")
        runs, token = await agents.list(limit=2)
        assert len(runs) == 2 and token
        rest, end = await agents.list(limit=2, page_token=token)
        assert len(rest) == 1 and end == ""
        assert {r.workflow_id for r in runs + rest} == {r.workflow_id for r in refs}
        await asyncio.gather(*(agents.cancel(r.workflow_id) for r in refs))


async def replied(agents: AgentClient, session_id: str, seq: int) -> str:
    async def done() -> str | None:
        try:
            view = await agents.status(session_id)
        except NoAnswer:
            return None
        return view.output if view.replied >= seq and view.state == "idle" else None

    return await eventually(done, f"{session_id} replies to message {seq}")


async def test_send_transcript_fork_and_rewind(
    indexed_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    llm.default = orders(sink)
    client = indexed_env.client
    runtime.search_attributes_ready = True
    async with run_worker(client, runtime) as task_queue:
        agents = AgentClient(client, task_queue=task_queue).for_tenant("t1")
        other = agents.for_tenant("t2")
        session = f"chat-{uuid.uuid4().hex[:8]}"
        with pytest.raises(RunNotFound):  # no session and no start: nothing is started
            await agents.send(session, "hello")
        first = await agents.send(session, "hello", message_id="m1", start=AgentInput(session=SessionSpec()))
        assert first.accepted and first.seq == 1 and not first.duplicate
        again = await agents.send(session, "hello", message_id="m1", start=AgentInput(session=SessionSpec()))
        assert again.duplicate and again.seq == 1  # a retry with the same id is the same message
        assert await replied(agents, session, 1) == "hello: done"
        second = await agents.send(session, "more please", sender="ann")  # running: no start needed
        assert second.seq == 2
        await replied(agents, session, 2)
        entries = await agents.transcript(session)
        messages = [(e["seq"], e["text"], e["sender"]) for e in entries if e["kind"] == "message"]
        assert messages == [(1, "hello", ""), (2, "more please", "ann")], entries
        assert [e["seq"] for e in entries if e["kind"] == "reply"] == [1, 2]
        with pytest.raises(InvalidRequest, match="session"):
            await agents.send(session, "x", start=AgentInput(task="not a session"))

        plain = await agents.start(AgentInput(task="hello"))
        done = await agents.result(plain.workflow_id)
        assert done.status == "completed" and done.steps == 1
        fork = await agents.fork(plain.workflow_id, step=1, task="and now?")
        assert fork.workflow_id.startswith(f"{plain.workflow_id}-fork1-")
        forked = await agents.result(fork.workflow_id)
        assert forked.status == "completed" and forked.steps == 2, forked  # its first turn is step 2
        with pytest.raises(NoSuchStep, match="has 1 complete step"):
            await agents.fork(plain.workflow_id, step=5)
        rewound = await agents.rewind(plain.workflow_id, step=0)
        assert rewound.workflow_id == plain.workflow_id and rewound.run_id not in ("", plain.run_id)
        assert (await agents.result(plain.workflow_id)).status == "completed"
        with pytest.raises(NoSuchStep, match="no step after 3"):
            await agents.rewind(plain.workflow_id, step=3)

        # Another tenant's client: every one of these is the same RunNotFound as a missing run.
        for workflow_id in (session, plain.workflow_id):
            with pytest.raises(RunNotFound):
                await other.transcript(workflow_id)
            with pytest.raises(RunNotFound):
                await other.fork(workflow_id, step=0)
            with pytest.raises(RunNotFound):
                await other.rewind(workflow_id, step=0)
            with pytest.raises(RunNotFound):
                [event async for event in other.events(workflow_id)]
        with pytest.raises(RunNotFound):
            await other.send(session, "let me in", start=AgentInput(session=SessionSpec()))
        assert len(await agents.transcript(session)) == len(entries)  # nothing reached the session
        mine = [event.kind async for event in agents.events(plain.workflow_id)]
        assert mine and mine[-1] == "finished"
        with pytest.raises(MessageRefused, match="not_a_session"):
            await agents.close(plain.workflow_id)
        with pytest.raises(RunNotFound):
            await other.close(session)
        await agents.close(session, reason="done here")
        assert (await agents.result(session)).status == "completed"
        with pytest.raises(RunNotOpen, match="has already ended"):
            await agents.close(session)
