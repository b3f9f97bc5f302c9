"""Who a run belongs to: ``tenant`` and ``user`` reach its sub-agents, bind its session, gate its forks.

A sub-agent's start input carries its parent's tenant and user (set by the parent, never by the
model); a session's conversation remembers both, so the same session id restarted by another user
fails before it reads a message; a fork must name a source of the same tenant and user, and a
refused fork copies nothing.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from tests.conftest import WorkerFactory, require_bwrap, start_agent
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.test_trust_inputs import copied_nothing, fork_of, forkable
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.session_types import SendResult, SessionMessage, SessionSpec
from workflows.types import AgentInput, AgentResult, StatusView, SubagentDef


async def start_input(client: Client, workflow_id: str) -> AgentInput:
    """The run's input as its history's start event holds it."""
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        assert event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED
        [inp] = await client.data_converter.decode(
            list(event.workflow_execution_started_event_attributes.input.payloads), [AgentInput]
        )
        assert isinstance(inp, AgentInput)
        return inp
    raise AssertionError(f"{workflow_id} has no history")


async def failure(handle: WorkflowHandle[Any, Any]) -> str:
    try:
        await handle.result()
    except WorkflowFailureError as err:
        return str(getattr(err.cause, "message", err.cause))
    raise AssertionError(f"{handle.id} should have failed")


def delegate_once(body: dict[str, Any]) -> Scripted:
    messages = body["messages"]
    if messages[0]["content"] == "You are the helper.":
        return Scripted(text="helped")
    if any(m["role"] == "tool" for m in messages):
        return Scripted(text="done with help")
    return Scripted(tool_calls=[("helper", json.dumps({"task": "help me"}))])


async def test_a_sub_agent_runs_for_its_parents_tenant_and_user(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = delegate_once
    client = dev_env.client
    helper = {"helper": SubagentDef(description="Helps.", system_prompt="You are the helper.")}
    async with run_worker(client, runtime) as tq:
        handle = await start_agent(
            client, tq, id_prefix="owned", task="get help", tenant="acme", user="ann", subagents=helper
        )
        assert (await handle.result()).output == "done with help"
    child = await start_input(client, f"{handle.id}/helper/s1c0")
    assert (child.tenant, child.user) == ("acme", "ann")


async def test_a_fork_of_another_users_run_fails_and_copies_nothing(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    require_bwrap()
    secret = f"ANN-ONLY-{uuid.uuid4().hex}"
    llm.default = forkable(secret)
    client = dev_env.client
    async with run_worker(client, runtime) as tq:
        source = await start_agent(client, tq, id_prefix="user-ann", task="write it", tenant="acme", user="ann")
        assert (await source.result()).status == "completed"
        requests_before = len(llm.requests)
        bob, nobody = await fork_of(client, tq, source.id, "acme", "bob"), await fork_of(client, tq, source.id, "acme")
        bob_message, nobody_message = await failure(bob), await failure(nobody)
        await copied_nothing(client, runtime, bob)
        await copied_nothing(client, runtime, nobody)
        assert len(llm.requests) == requests_before
        forked = await (await fork_of(client, tq, source.id, "acme", "ann")).result()
    expected = f"invalid run input: fork: {source.id} is not a run of this run's user"
    assert bob_message == f"{expected} (user 'bob'); a fork's source must have its user", bob_message
    assert nobody_message.startswith(f"{expected} (no user)"), nobody_message
    assert secret not in bob_message + nobody_message
    assert forked.status == "completed" and secret in forked.output


async def test_a_session_restarted_by_another_user_or_tenant_reads_nothing(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(Scripted(text="ann's private reply"), Scripted(text="ann again"))
    client = dev_env.client
    session_id = f"user-session-{uuid.uuid4().hex[:8]}"

    async def session(user: str, tenant: str = "acme") -> WorkflowHandle[Any, AgentResult]:
        return await client.start_workflow(
            AgentWorkflow.run,
            AgentInput(session=SessionSpec(), tenant=tenant, user=user),
            id=session_id,
            task_queue=tq,
        )

    async def replied(handle: WorkflowHandle[Any, Any], seq: int) -> StatusView | None:
        view: StatusView = await handle.query(AgentWorkflow.status)
        return view if view.replied >= seq and view.state == "idle" else None

    async with run_worker(client, runtime) as tq:
        ann = await session("ann")
        sent: SendResult = await ann.execute_update(
            "send", SessionMessage(message_id="a", text="hi"), result_type=SendResult
        )
        assert sent.accepted
        await eventually(lambda: replied(ann, 1), "ann's reply")
        await ann.signal("close")
        assert (await ann.result()).output == "ann's private reply"
        requests_before = len(llm.requests)

        message = await failure(await session("bob"))
        assert len(llm.requests) == requests_before  # bob's run saw nothing of ann's conversation
        assert "belongs to another user than this run's (user 'bob')" in message, message
        message = await failure(await session("ann", tenant="globex"))  # the same user name, another tenant
        assert len(llm.requests) == requests_before
        assert "belongs to another tenant than this run's (tenant 'globex')" in message, message

        again = await session("ann")  # ann's own session goes on where it was
        sent = await again.execute_update("send", SessionMessage(message_id="b", text="back"), result_type=SendResult)
        assert sent.accepted and sent.seq == 2
        await eventually(lambda: replied(again, 2), "ann's second reply")
        await again.signal("close")
        assert (await again.result()).output == "ann again"
