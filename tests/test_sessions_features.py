"""The runtime's features inside sessions, each across at least two messages of one session.

Approvals, sub-agents, MCP tools, workspace checkpoints (across continue-as-new), payload encryption
and the tree budget, each as in a one-shot run (issue 23). Real parts as everywhere: the Temporal dev
server, the scripted model server, bubblewrap sandboxes, a real MCP server, an HTTP sink that records
every delivery.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WithStartWorkflowOperation, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.crypto.codec import payload_key_id
from activities.runtime import Runtime
from activities.settings import Settings
from tests.conftest import WorkerFactory, require_bwrap, with_settings
from tests.crypto_keys import TEST_ONLY_K1
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.mcp_servers import read_ledger
from tests.test_encryption_e2e import client_with, files_bytes, payloads_of, runtime_with
from tests.test_mcp import ALLOW_SHOP, mcp_runtime, orders_stdio
from tests.waiting import eventually
from worker import build_worker
from workflows.agent import AgentWorkflow
from workflows.identity import idempotency_key
from workflows.session_types import SendResult, SessionMessage, SessionSpec
from workflows.types import AgentInput, AgentResult, ApproveSignal, Limits, StatusView, SubagentDef

Reply = Any  # a FakeLLMServer default: body -> Scripted
RESULT_DEADLINE_S = 90


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


async def start_session(client: Client, tq: str, **fields: Any) -> WorkflowHandle[Any, AgentResult]:
    fields.setdefault("session", SessionSpec())
    return await client.start_workflow(
        AgentWorkflow.run, AgentInput(**fields), id=f"sf-{uuid.uuid4().hex[:10]}", task_queue=tq
    )


async def send(handle: WorkflowHandle[Any, Any], text: str) -> SendResult:
    message = SessionMessage(message_id=uuid.uuid4().hex, text=text)
    result: SendResult = await handle.execute_update("send", message, result_type=SendResult)
    assert result.accepted, result
    return result


async def status(handle: WorkflowHandle[Any, Any]) -> StatusView:
    view: StatusView = await handle.query(AgentWorkflow.status)
    return view


async def replied(handle: WorkflowHandle[Any, Any], seq: int) -> StatusView:
    async def check() -> StatusView | None:
        view = await status(handle)
        return view if view.replied >= seq and view.state == "idle" else None

    return await eventually(check, f"the reply to message {seq}")


async def waiting_approval(handle: WorkflowHandle[Any, Any]) -> StatusView:
    async def check() -> StatusView | None:
        view = await status(handle)
        return view if view.pending_approvals else None

    return await eventually(check, "an approval waiting")


def chat(llm: FakeLLMServer) -> list[dict[str, Any]]:
    return [r["body"] for r in llm.requests if r["path"].endswith("/chat/completions")]


def last_user(body: dict[str, Any]) -> str:
    return str([m["content"] for m in body["messages"] if m["role"] == "user"][-1])


def tool_results(body: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in body["messages"] if m["role"] == "tool"]


def post(sink: HttpSink, order: int) -> tuple[str, str]:
    return ("http_request", json.dumps({"method": "POST", "url": f"{sink.url}/orders", "json": {"order": order}}))


# --- approvals --------------------------------------------------------------------------


async def test_an_approval_in_message_2_waits_and_a_message_sent_meanwhile_is_answered_after_it(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    llm.enqueue(
        Scripted(text="hello"),
        Scripted(tool_calls=[post(sink, 7)]),
        Scripted(text="ordered 7; and about your other question: yes"),
    )
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_session(dev_env.client, tq)
        first_run = (await handle.describe()).run_id
        await send(handle, "hi")
        await replied(handle, 1)
        await send(handle, "order number 7")
        view = await waiting_approval(handle)
        assert view.state == "waiting_approval" and view.session and view.messages == 2
        [approval] = view.pending_approvals
        assert approval.tool == "http_request" and approval.args["json"] == {"order": 7}
        assert sink.writes() == []  # nothing runs before the decision

        meanwhile = await send(handle, "and is it in stock?")
        assert meanwhile.seq == 3
        view = await status(handle)
        assert view.state == "waiting_approval" and view.queued == 1  # taken, waiting for the next model turn
        # A new message leaves the approval pending: the same call, still waiting.
        assert [(a.approval_id, a.tool, a.args, a.expires_at) for a in view.pending_approvals] == [
            (approval.approval_id, approval.tool, approval.args, approval.expires_at)
        ], (view.pending_approvals, approval)
        assert len(chat(llm)) == 2  # no model turn ran for it while the approval waits

        await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=approval.approval_id, reviewer="alice"))
        view = await replied(handle, 3)
        assert view.output == "ordered 7; and about your other question: yes"
        assert view.queued == 0 and view.messages == 3 and not view.pending_approvals
        ledger = await runtime.store.ledger(handle.id)
    assert len(sink.writes()) == 1  # the approved call ran once
    assert [(e.tool, e.state, e.executions) for e in ledger] == [("http_request", "done", 1)]
    # The call's key derives from the session's key scope, <workflow id>/<first run id>, so that the same call
    # in a session woken again under this id (the same steps of a new run) is a new call.
    expected = idempotency_key(f"{handle.id}/{first_run}", 2, 0, "http_request", approval.args)
    assert sink.writes()[0].headers["idempotency-key"] == ledger[0].key == expected
    after = chat(llm)[2]["messages"]
    assert [m["role"] for m in after[-3:]] == ["assistant", "tool", "user"]  # the result, then the queued message
    assert '"ok": true' in after[-2]["content"] or '"ok":true' in after[-2]["content"]
    assert after[-1]["content"] == "and is it in stock?"


@pytest.mark.parametrize("cache_mode", ["cached"], indirect=True)
async def test_close_while_an_approval_waits_ends_the_session_at_once_and_runs_nothing(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    llm.enqueue(Scripted(text="hello"), Scripted(tool_calls=[post(sink, 8)]))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_session(dev_env.client, tq)
        await send(handle, "hi")
        await replied(handle, 1)
        await send(handle, "order number 8")
        [approval] = (await waiting_approval(handle)).pending_approvals
        await handle.signal("close", {"reason": "done for today"})
        result = await asyncio.wait_for(handle.result(), RESULT_DEADLINE_S)  # a hang guard: the approval waits a day
        late = await handle.query(AgentWorkflow.status)
        stored = await runtime.store.transcript(f"{handle.id}/session")
    assert result.status == "completed" and result.output == "hello"
    assert sink.received == [] and not late.pending_approvals  # the call never ran, and nothing waits
    assert len(chat(llm)) == 2  # no model turn after the close
    # The transcript says what became of the call: it was not run, because the session closed.
    [answer] = [e.message.content for e in stored if e.message.role == "tool"]
    assert "not run" in answer and "session was closed" in answer, answer
    assert approval.tool == "http_request"


# --- sub-agents -------------------------------------------------------------------------

RESEARCHER = SubagentDef(description="Finds facts.", system_prompt="You are the researcher.", tools=["http_request"])


def delegating_model(sink: HttpSink) -> Reply:
    """The session delegates each message to the researcher; the second time the researcher POSTs (an approval)."""

    def reply(body: dict[str, Any]) -> Scripted:
        messages = body["messages"]
        if messages[0]["content"] == "You are the researcher.":
            task = messages[1]["content"]
            if "order" in task and not tool_results(body):
                return Scripted(tool_calls=[post(sink, 2)])
            return Scripted(text=f"researcher found: {task}")
        if messages[-1]["role"] == "tool":
            return Scripted(text=f"reply: {messages[-1]['content']}")
        return Scripted(tool_calls=[("researcher", json.dumps({"task": f"look into {last_user(body)}"}))])

    return reply


async def test_sub_agents_in_two_messages_reach_the_model_and_their_approvals_the_session(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    llm.default = delegating_model(sink)
    async with run_worker(dev_env.client, runtime) as tq:
        # Each message takes two of the session's steps and its sub-agent two of its own: max_steps=3 is each
        # message's, and so is what its sub-agent may get.
        handle = await start_session(
            dev_env.client, tq, subagents={"researcher": RESEARCHER}, limits=Limits(max_steps=3)
        )
        await send(handle, "the weather")
        view = await replied(handle, 1)
        assert view.output == "reply: researcher found: look into the weather"

        await send(handle, "an order")
        view = await waiting_approval(handle)  # the sub-agent's approval, shown by the session
        assert view.state == "waiting_approval"
        [approval] = view.pending_approvals
        child_id = f"{handle.id}/researcher/s3c0"  # one child per (session, step, call): new for each message
        assert approval.workflow_id == child_id and approval.tool == "http_request"
        await dev_env.client.get_workflow_handle(child_id).signal(
            AgentWorkflow.approve, ApproveSignal(approval_id=approval.approval_id, reviewer="alice")
        )
        view = await replied(handle, 2)
        child_handles = [
            dev_env.client.get_workflow_handle(f"{handle.id}/researcher/s{s}c0", result_type=AgentResult)
            for s in (1, 3)
        ]
        children = [await child.result() for child in child_handles]
        conversations = [(await status(child)).conversation_id for child in child_handles]
        ledger = await runtime.store.ledger(child_id)
    assert view.output.startswith("reply: researcher found: look into an order")
    assert [c.status for c in children] == ["completed", "completed"]
    assert len(sink.writes()) == 1 and [(e.state, e.executions) for e in ledger] == [("done", 1)]
    # The children's usage is the session's (each message's parent turns plus its child's turns).
    assert view.children_usage.total_tokens == 15 * 3 and view.usage.total_tokens == 15 * 7
    assert view.conversation_id == f"{handle.id}/session"
    # Each child is a run of its own (its own conversation, not the session's), named after the session's step.
    assert [c.rsplit("/", 1)[0] for c in conversations] == [c.id for c in child_handles]
    assert len(set(conversations)) == 2
    # Each child's result reached the session's model in its own message.
    parent_turns = [b for b in chat(llm) if b["messages"][0]["content"] != "You are the researcher."]
    results = [tool_results(b)[-1] for b in parent_turns if b["messages"][-1]["role"] == "tool"]
    assert results[0] == "researcher found: look into the weather"
    assert results[1].startswith("researcher found: look into an order")


# --- MCP --------------------------------------------------------------------------------


async def test_an_mcp_tool_works_in_message_1_and_message_2(
    dev_env: WorkflowEnvironment, settings: Settings, tmp_path: Path, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    ledger = tmp_path / "orders.jsonl"
    runtime = mcp_runtime(settings, tmp_path, {"shop": orders_stdio(ledger)}, policy=ALLOW_SHOP)
    order = ("mcp__shop__place_order", json.dumps({"item": "mug", "quantity": 2}))
    llm.enqueue(
        Scripted(tool_calls=[("mcp__shop__lookup_order", json.dumps({"order_id": "A1"})), order]),
        Scripted(text="looked up and ordered"),
        Scripted(tool_calls=[order]),  # the very same call, in the next message: a new order
        Scripted(text="ordered again"),
    )
    try:
        async with run_worker(dev_env.client, runtime) as tq:
            handle = await start_session(dev_env.client, tq, tools=["mcp__shop__*"])
            await send(handle, "look up A1 and order two mugs")
            assert (await replied(handle, 1)).output == "looked up and ordered"
            await send(handle, "two more mugs please")
            assert (await replied(handle, 2)).output == "ordered again"
            entries = await runtime.store.ledger(handle.id)
    finally:
        await runtime.aclose()
    bodies = chat(llm)
    assert tool_results(bodies[1]) == ["order A1: 1 x widget, shipped", "placed order: 2 x mug"]
    assert tool_results(bodies[3])[-1] == "placed order: 2 x mug"
    deliveries = [e for e in read_ledger(ledger) if e.get("tool") == "place_order"]
    assert len(deliveries) == 2, deliveries  # once per message: the second is not taken for a retry of the first
    assert len({d["key"] for d in deliveries}) == 2
    assert sorted(d["key"] for d in deliveries) == sorted(e.key for e in entries if e.tool.endswith("place_order"))


# --- checkpoints ------------------------------------------------------------------------


@pytest.mark.parametrize("cache_mode", ["cached"], indirect=True)
async def test_a_file_of_message_1_is_there_at_message_2_across_continue_as_new_and_a_stopped_sandbox(
    can_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    require_bwrap()
    llm.enqueue(
        Scripted(tool_calls=[("write_file", json.dumps({"path": "notes.txt", "content": "remember 42"}))]),
        Scripted(text="written"),
        Scripted(tool_calls=[("run_shell", json.dumps({"command": "cat notes.txt"}))]),
        Scripted(text="read it"),
    )
    async with run_worker(can_env.client, runtime) as tq:
        # This server suggests continue-as-new after a few dozen events: the session continues as new
        # between the messages; its idle sandbox is stopped, so message 2 needs the checkpoint.
        handle = await start_session(can_env.client, tq, session=SessionSpec(sandbox_idle_s=1))
        await send(handle, "write it down")
        view = await replied(handle, 1)
        first_run = (await handle.describe()).run_id  # the run that answered message 1
        checkpoint = view.checkpoint
        assert checkpoint

        async def sandbox_stopped() -> bool:
            return (
                not await runtime.sandbox_backend().list_sandboxes()
                and "sandbox stopped" in (await status(handle)).last_event
            )

        # No sandbox is left, so what message 2 reads can only come from message 1's checkpoint.
        await eventually(sandbox_stopped, "the idle session's sandbox stopped")
        await send(handle, "what did I write?")
        view = await replied(handle, 2)
        current = await handle.describe()
    assert current.run_id != first_run  # it continued as new between the messages
    bodies = chat(llm)
    wrote, read = tool_results(bodies[3])  # the whole conversation: message 1's call, then message 2's
    assert "notes.txt" in wrote and "remember 42" in read, read
    assert view.output == "read it" and view.messages == 2
    assert view.conversation_id == f"{handle.id}/session"
    history = await can_env.client.get_workflow_handle(handle.id, run_id=first_run).fetch_history()
    assert any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW for e in history.events)


# --- encryption -------------------------------------------------------------------------


async def test_an_encrypted_session_keeps_its_messages_and_replies_out_of_plaintext(
    dev_env: WorkflowEnvironment, settings: Settings, llm: FakeLLMServer
) -> None:
    marker = f"MARKER-{uuid.uuid4().hex[:12]}"
    llm.enqueue(Scripted(text=f"first reply {marker}"), Scripted(text=f"second reply {marker}"))
    client = client_with(dev_env, TEST_ONLY_K1)
    runtime = runtime_with(settings, TEST_ONLY_K1)
    task_queue = f"enc-s-{uuid.uuid4().hex[:8]}"
    try:
        async with build_worker(client, runtime, task_queue=task_queue):
            handle = await start_session(client, task_queue)
            with pytest.raises(WorkflowUpdateFailedError) as refused:  # a refusal's answer comes through the codec
                await handle.execute_update("send", {"message_id": "x", "text": " "}, result_type=SendResult)
            cause = refused.value.cause
            assert isinstance(cause, ApplicationError) and cause.type == "MessageRefused"
            assert SendResult.model_validate(cause.details[0]).reason == "malformed"
            await send(handle, f"message one {marker}")
            view = await replied(handle, 1)
            assert view.output == f"first reply {marker}" and view.last_message == f"message one {marker}"
            await handle.signal("message", SessionMessage(message_id="two", text=f"message two {marker}"))
            view = await replied(handle, 2)
            assert view.output == f"second reply {marker}" and view.messages == 2
            # Without the key the answers do not read: the status the worker sends back is encrypted too.
            with pytest.raises(KeyError, match="binary/encrypted"):
                await dev_env.client.get_workflow_handle(handle.id).query(AgentWorkflow.status)
    finally:
        await runtime.aclose()
    bodies = chat(llm)
    assert [m["content"] for m in bodies[1]["messages"][1:]] == [
        f"message one {marker}",
        f"first reply {marker}",
        f"message two {marker}",
    ]
    # What Temporal holds, read without the codec: every payload of the user's is encrypted.
    events = list((await dev_env.client.get_workflow_handle(handle.id).fetch_history()).events)
    payloads = [p for e in events for p in payloads_of(e)]
    assert not [p for p in payloads if marker.encode() in p.data], "a message or reply is in plaintext in history"
    kinds = {EventType.Name(e.event_type) for e in events}
    assert {"EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED", "EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED"} <= kinds
    plaintext = {EventType.Name(e.event_type) for e in events for p in payloads_of(e) if payload_key_id(p) is None}
    assert plaintext <= {"EVENT_TYPE_MARKER_RECORDED", "EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES"}, plaintext
    assert marker.encode() not in files_bytes(Path(settings.store_url)), "the run store holds it in plaintext"


# --- the tree budget and max_steps ----------------------------------------------------------

HELPER = SubagentDef(description="Helps.", system_prompt="You are the helper.", tools=[])


def budget_model(body: dict[str, Any]) -> Scripted:
    """The helper spends 60 tokens; every session turn 15. Message 1 delegates; message 2 calls a tool."""
    messages = body["messages"]
    if messages[0]["content"] == "You are the helper.":
        return Scripted(text="helped", input_tokens=50, output_tokens=10)
    if messages[-1]["role"] == "tool":
        return Scripted(text="done with that")
    if last_user(body) == "first":
        return Scripted(tool_calls=[("helper", json.dumps({"task": "help"}))])
    return Scripted(tool_calls=[("always_fails", "{}")])


async def test_max_tokens_covers_the_whole_session_and_its_sub_agents(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = budget_model
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_session(dev_env.client, tq, subagents={"helper": HELPER}, limits=Limits(max_tokens=100))
        await send(handle, "first")
        view = await replied(handle, 1)
        assert view.usage.total_tokens == 15 + 60 + 15 and view.output == "done with that"  # under 100
        await send(handle, "second")  # 15 more: together over 100
        result = await asyncio.wait_for(handle.result(), RESULT_DEADLINE_S)  # a hang guard: over budget, it ends
        root = f"{handle.id}/{(await handle.describe()).run_id}"  # the session's first run: its key scope
        spent = await runtime.store.budget_spent(root)
    assert result.status == "limit_exceeded" and "max_tokens=100" in result.output, result
    assert result.usage.total_tokens == 105
    assert spent.tokens == 105 and spent.in_flight == 0  # the tree's ledger: the session's and its helper's turns
    assert len(chat(llm)) == 4  # no model turn after the budget was spent


async def test_max_steps_is_each_messages_own(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    fail = Scripted(tool_calls=[("always_fails", "{}")])
    llm.enqueue(fail, Scripted(text="one"), fail, Scripted(text="two"), fail, fail, Scripted(text="three"))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_session(dev_env.client, tq, limits=Limits(max_steps=2))
        for seq, text in enumerate(("one", "two"), start=1):
            await send(handle, f"message {seq}")
            view = await replied(handle, seq)
            assert view.output == text and view.step == 2 * seq  # two steps each: four in all, over max_steps=2
        await send(handle, "message 3")  # wants three steps: its own max_steps stops it; the session goes on
        view = await replied(handle, 3)
        assert view.step == 6 and view.output == "max_steps=2 reached", view
        await send(handle, "message 4")
        view = await replied(handle, 4)
        assert view.output == "three" and view.step == 7
        description = await handle.describe()
    assert description.status is not None and description.status.name == "RUNNING"
    assert len(chat(llm)) == 7


@pytest.mark.parametrize("cache_mode", ["cached"], indirect=True)
async def test_max_cost_usd_covers_the_whole_session(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, tmp_path: Path
) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"openai:test-model": {"input": 10_000, "output": 10_000}}))  # $0.15 a turn
    rt = with_settings(runtime, prices_file=str(prices))
    llm.enqueue(Scripted(text="one"), Scripted(tool_calls=[("always_fails", "{}")]), Scripted(text="never"))
    async with run_worker(dev_env.client, rt) as tq:
        handle = await start_session(dev_env.client, tq, limits=Limits(max_cost_usd=0.25))
        await send(handle, "first")
        view = await replied(handle, 1)
        assert view.output == "one" and view.usage.cost_usd == pytest.approx(0.15)  # under 0.25
        await send(handle, "second")  # $0.15 more: together over $0.25
        result = await asyncio.wait_for(handle.result(), RESULT_DEADLINE_S)
    await rt.aclose()
    assert result.status == "limit_exceeded" and "max_cost_usd=0.25" in result.output, result
    assert result.usage.cost_usd == pytest.approx(0.30)
    assert len(chat(llm)) == 2


async def test_a_woken_session_counts_its_budget_from_its_wake_as_its_usage_does(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = budget_model
    session_id = f"sf-wake-{uuid.uuid4().hex[:8]}"
    session = AgentInput(session=SessionSpec(), subagents={"helper": HELPER}, limits=Limits(max_tokens=100))

    async def wake(message_id: str, text: str) -> SendResult:
        start = WithStartWorkflowOperation(
            AgentWorkflow.run,
            session,
            id=session_id,
            task_queue=tq,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        )
        sent: SendResult = await dev_env.client.execute_update_with_start_workflow(
            "send",
            SessionMessage(message_id=message_id, text=text),
            start_workflow_operation=start,
            result_type=SendResult,
        )
        return sent

    async with run_worker(dev_env.client, runtime) as tq:
        await wake("a", "first")
        handle = dev_env.client.get_workflow_handle(session_id, result_type=AgentResult)
        first_run = (await handle.describe()).run_id
        assert (await replied(handle, 1)).usage.total_tokens == 90  # with its helper's 60
        await handle.signal("close")
        assert (await asyncio.wait_for(handle.result(), RESULT_DEADLINE_S)).usage.total_tokens == 90

        assert (await wake("b", "second")).seq == 2  # a new run of the session, on its conversation
        woken = dev_env.client.get_workflow_handle(session_id)
        view = await replied(woken, 2)
        second_run = (await woken.describe()).run_id
        spent = [await runtime.store.budget_spent(f"{session_id}/{run}") for run in (first_run, second_run)]
    # The woken run's max_tokens counts what it spends, as its status does: its tree ledger is its own.
    assert view.output == "done with that" and view.usage.total_tokens == 30
    assert [s.tokens for s in spent] == [90, 30]
