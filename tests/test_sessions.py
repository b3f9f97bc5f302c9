"""Sessions: an AgentWorkflow that answers message after message, against a real dev server and model server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from typing import Any

import pytest
from temporalio.client import WithStartWorkflowOperation, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.settings import ExtensionSettings
from tests.conftest import REPLAY_MODES, TEMPORAL_CLI, TEST_TOOLS, WorkerFactory, with_settings
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.session_types import SendResult, SessionMessage, SessionSpec
from workflows.types import AgentInput, AgentResult, ForkSpec, StatusView


@pytest.fixture(params=REPLAY_MODES)
def cache_mode(request: pytest.FixtureRequest) -> str:
    """The loop itself: each test runs cached and again with no workflow cache (every task replays)."""
    return str(request.param)


def chat_requests(llm: FakeLLMServer) -> list[dict[str, Any]]:
    return [r for r in llm.requests if r["path"].endswith("/chat/completions")]


async def temporal(env: WorkflowEnvironment, *args: str) -> subprocess.CompletedProcess[str]:
    """The Temporal CLI, off the event loop (the worker answering it runs on this loop)."""
    address = env.client.service_client.config.target_host
    command = [str(TEMPORAL_CLI), *args, "--address", address]
    return await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60, check=False)


async def status(handle: WorkflowHandle[Any, Any]) -> StatusView:
    view: StatusView = await handle.query(AgentWorkflow.status)
    return view


async def replied(handle: WorkflowHandle[Any, Any], seq: int) -> StatusView:
    async def check() -> StatusView | None:
        view = await status(handle)
        return view if view.replied >= seq and view.state == "idle" else None

    return await eventually(check, f"the reply to message {seq}")


async def start_session(env: WorkflowEnvironment, tq: str, **fields: Any) -> WorkflowHandle[Any, AgentResult]:
    fields.setdefault("session", SessionSpec())
    return await env.client.start_workflow(
        AgentWorkflow.run, AgentInput(**fields), id=f"s-{uuid.uuid4().hex[:10]}", task_queue=tq
    )


async def send(handle: WorkflowHandle[Any, Any], text: str, message_id: str = "") -> SendResult:
    message = SessionMessage(message_id=message_id or uuid.uuid4().hex, text=text)
    result: SendResult = await handle.execute_update("send", message, result_type=SendResult)
    return result


async def test_three_messages_from_the_temporal_cli(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(
        Scripted(text="hello, I am here"),
        Scripted(tool_calls=[("write_file", json.dumps({"path": "n.txt", "content": "42"}))]),
        Scripted(text="noted 42"),
        Scripted(text="you said 42"),
    )
    session_id = f"cli-s-{uuid.uuid4().hex[:8]}"
    async with run_worker(dev_env.client, runtime) as tq:
        started = await temporal(
            dev_env,
            *("workflow", "start", "--type", "AgentWorkflow", "--task-queue", tq, "--workflow-id", session_id),
            *("--input", json.dumps({"session": {}})),
        )
        assert started.returncode == 0, started.stderr
        handle = dev_env.client.get_workflow_handle(session_id)
        view = await eventually(lambda: _idle(handle), "the new session idle")
        assert view.session and view.messages == 0 and view.step == 0

        texts = ["hi", "remember 42", "what did I say?"]
        for seq, text in enumerate(texts, start=1):
            sent = await temporal(
                dev_env,
                *("workflow", "update", "execute", "--workflow-id", session_id, "--name", "send"),
                *("--input", json.dumps({"message_id": f"m{seq}", "text": text})),
            )
            assert sent.returncode == 0, sent.stderr
            assert "accepted:true" in sent.stdout and f"seq:{seq}" in sent.stdout, sent.stdout
            view = await replied(handle, seq)
            assert view.state == "idle" and view.messages == seq
        desc = await handle.describe()
        assert desc.status is not None and desc.status.name == "RUNNING"  # open between messages

    chat = chat_requests(llm)
    assert len(chat) == 4
    # The model sees the whole conversation at each turn.
    last = chat[-1]["body"]["messages"]
    roles = ["system", "user", "assistant", "user", "assistant", "tool", "assistant", "user"]
    assert [m["role"] for m in last] == roles
    assert [m["content"] for m in last if m["role"] == "user"] == texts
    assert view.output == "you said 42"
    stored = await runtime.store.transcript(view.conversation_id)
    replies = [e.message.content for e in stored if e.message.role == "assistant" and not e.message.tool_calls]
    assert replies == ["hello, I am here", "noted 42", "you said 42"]
    assert view.conversation_id == f"{session_id}/session"


async def _waiting_approval(handle: WorkflowHandle[Any, Any]) -> StatusView | None:
    view = await status(handle)
    return view if view.pending_approvals else None


async def _idle(handle: WorkflowHandle[Any, Any]) -> StatusView | None:
    view = await status(handle)
    return view if view.state == "idle" else None


async def test_same_message_id_is_one_message(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(Scripted(text="one reply"))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_session(dev_env, tq)
        await handle.signal("message", SessionMessage(message_id="same", text="hello"))
        again = await send(handle, "hello", message_id="same")
        assert again.accepted and again.duplicate and again.seq == 1
        await replied(handle, 1)
        third = await send(handle, "hello", message_id="same")
        assert third.duplicate and third.seq == 1
        await handle.signal("message", SessionMessage(message_id="same", text="hello"))
        view = await status(handle)
        assert view.messages == 1 and view.queued == 0
    assert len(chat_requests(llm)) == 1


async def test_refusals_are_answered_and_the_session_goes_on(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(Scripted(text="ok"))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_session(dev_env, tq)
        malformed = ({"message_id": "x", "text": " "}, {"text": "no id"}, {"message_id": "y", "text": "t", "to": "a"})
        for bad in malformed:
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await handle.execute_update("send", bad, result_type=SendResult)
            cause = refused.value.cause
            assert isinstance(cause, ApplicationError) and cause.type == "MessageRefused"
            assert cause.message.startswith("malformed:")
        await handle.signal("message", {"text": "no id"})
        ok = await send(handle, "a real one")
        assert ok.accepted and ok.seq == 1
        view = await replied(handle, 1)
        assert view.refused_counts.get("malformed") == 1  # the signal; refused updates never reach the run

        # A run that is not a session refuses messages.
        llm.enqueue(Scripted(text="done", delay_s=0))
        run = await dev_env.client.start_workflow(
            AgentWorkflow.run, AgentInput(task="t"), id=f"r-{uuid.uuid4().hex[:8]}", task_queue=tq
        )
        with pytest.raises(WorkflowUpdateFailedError) as not_session:
            await send(run, "hello?")
        assert getattr(not_session.value.cause, "message", "").startswith("not_a_session:")
        assert (await run.result()).status == "completed"


@pytest.mark.parametrize("cache_mode", ["cached"], indirect=True)
async def test_queue_hands_a_message_to_the_next_model_turn(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(
        Scripted(tool_calls=[("write_file", json.dumps({"path": "a", "content": "b"}))], delay_s=2),
        Scripted(text="both seen"),
    )
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_session(dev_env, tq)
        await send(handle, "first")
        await eventually(lambda: len(chat_requests(llm)) == 1, "the slow model turn in flight")
        second = await send(handle, "and a second thing")
        assert second.accepted and second.seq == 2
        view = await replied(handle, 2)
    chat = chat_requests(llm)
    assert len(chat) == 2  # one exchange answered both
    roles = [m["role"] for m in chat[1]["body"]["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assert chat[1]["body"]["messages"][-1]["content"] == "and a second thing"
    assert view.output == "both seen" and view.messages == 2


@pytest.mark.parametrize("cache_mode", ["cached"], indirect=True)
async def test_reject_refuses_a_message_while_busy(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(Scripted(text="slow answer", delay_s=2), Scripted(text="second answer"))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_session(dev_env, tq, session=SessionSpec(on_busy="reject"))
        await send(handle, "first")
        await eventually(lambda: len(chat_requests(llm)) == 1, "the slow model turn in flight")
        with pytest.raises(WorkflowUpdateFailedError) as busy:
            await send(handle, "too soon")
        assert getattr(busy.value.cause, "message", "").startswith("busy:")
        details = busy.value.cause.details if isinstance(busy.value.cause, ApplicationError) else ()
        assert details and SendResult.model_validate(details[0]).reason == "busy"
        view = await replied(handle, 1)
        assert view.output == "slow answer" and view.messages == 1
        ok = await send(handle, "now")
        assert ok.seq == 2
        view = await replied(handle, 2)
        assert view.output == "second answer"


@pytest.mark.parametrize("cache_mode", ["cached"], indirect=True)
async def test_interrupt_restarts_the_turn_and_lets_a_side_effect_finish(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    # Turn 1 asks for a slow side-effecting call; while it runs, a message arrives (the call must finish,
    # once); turn 2 is slow and is interrupted by another message; the turn that follows sees both.
    llm.enqueue(
        Scripted(tool_calls=[("slow_side_effect", json.dumps({"seconds": 2}))]),
        Scripted(text="never seen", delay_s=30),
        Scripted(text="answered all"),
    )
    tools = ExtensionSettings(tool_modules=(TEST_TOOLS, "tests.fakes.session_tools"))
    runtime = with_settings(runtime, extensions=tools)
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_session(dev_env, tq, session=SessionSpec(on_busy="interrupt"))
        await send(handle, "do the thing")
        waiting = await eventually(lambda: _waiting_approval(handle), "the side effect's approval")
        during_approval = await send(handle, "while it waits for approval")  # nothing to interrupt: it waits
        assert during_approval.seq == 2
        assert (await status(handle)).pending_approvals == waiting.pending_approvals  # still pending
        approval = waiting.pending_approvals[0].approval_id
        await handle.signal("approve", {"approval_id": approval, "reviewer": "alice"})
        await eventually(lambda: len(chat_requests(llm)) == 2, "the slow second model turn in flight")
        interrupting = await send(handle, "stop, one more thing")
        assert interrupting.seq == 3
        view = await replied(handle, 3)
    chat = chat_requests(llm)
    assert len(chat) == 3
    final = chat[2]["body"]["messages"]
    users = [m["content"] for m in final if m["role"] == "user"]
    assert users == ["do the thing", "while it waits for approval", "stop, one more thing"]
    tool_results = [m for m in final if m["role"] == "tool"]
    assert len(tool_results) == 1 and "slept" in tool_results[0]["content"]
    assert not any(m["role"] == "assistant" and m.get("content") == "never seen" for m in final)
    assert view.output == "answered all"
    ledger = await runtime.store.ledger(handle.id)
    assert [(e.tool, e.state, e.executions) for e in ledger] == [("slow_side_effect", "done", 1)]


@pytest.mark.parametrize("cache_mode", ["cached"], indirect=True)
async def test_close_ends_the_session_with_its_last_reply(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(Scripted(text="the only reply"))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_session(dev_env, tq, task="the first message")
        await replied(handle, 1)
        await handle.signal("close", {"reason": "done here"})
        result = await asyncio.wait_for(handle.result(), 60)
    assert result.status == "completed" and result.output == "the only reply"


async def test_run_config_opens_the_session_in_the_runs_first_workflow_task(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    """A new run of a session makes (and a woken one finds) its conversation in the ``run_config`` local
    activity: no ``session_open`` activity (and the workflow task after it) before its first model turn."""
    llm.enqueue(Scripted(text="first reply"), Scripted(text="second reply"))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_session(dev_env, tq, task="hello", system_prompt="be brief")
        await replied(handle, 1)
        await handle.signal("close")
        assert (await handle.result()).output == "first reply"
        woken = await dev_env.client.start_workflow(
            AgentWorkflow.run,
            AgentInput(session=SessionSpec(), task="again"),
            id=handle.id,
            task_queue=tq,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        )
        assert (await replied(woken, 2)).output == "second reply"
        for run in (handle, woken):
            events = (await run.fetch_history()).events
            scheduled = [
                e.activity_task_scheduled_event_attributes.activity_type.name
                for e in events
                if e.HasField("activity_task_scheduled_event_attributes")
            ]
            assert scheduled[0] == "model" and "session_open" not in scheduled, scheduled
    stored = await runtime.store.transcript(f"{handle.id}/session")
    assert [(e.message.role, e.message.content) for e in stored] == [
        ("system", "be brief"),
        ("user", "hello"),
        ("assistant", "first reply"),
        ("user", "again"),
        ("assistant", "second reply"),
    ]


async def test_send_wakes_an_ended_session_on_its_conversation(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(Scripted(text="first reply"), Scripted(text="second reply"), Scripted(text="fork reply"))
    session_id = f"wake-{uuid.uuid4().hex[:8]}"
    async with run_worker(dev_env.client, runtime) as tq:
        start = WithStartWorkflowOperation(
            AgentWorkflow.run,
            AgentInput(session=SessionSpec()),
            id=session_id,
            task_queue=tq,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        )
        first: SendResult = await dev_env.client.execute_update_with_start_workflow(
            "send", SessionMessage(message_id="a", text="hello"), start_workflow_operation=start, result_type=SendResult
        )
        assert first.accepted and first.seq == 1  # no session yet: the call started it
        handle = dev_env.client.get_workflow_handle(session_id, result_type=AgentResult)
        await replied(handle, 1)
        await handle.signal("close")
        ended = await handle.result()
        assert ended.status == "completed" and ended.output == "first reply"

        again = WithStartWorkflowOperation(
            AgentWorkflow.run,
            AgentInput(session=SessionSpec()),
            id=session_id,
            task_queue=tq,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        )
        second: SendResult = await dev_env.client.execute_update_with_start_workflow(
            "send", SessionMessage(message_id="b", text="again"), start_workflow_operation=again, result_type=SendResult
        )
        assert second.seq == 2  # numbered after the conversation's earlier message
        woken = dev_env.client.get_workflow_handle(session_id)
        view = await replied(woken, 2)
        assert view.output == "second reply" and view.step == 2

        # A fork of a session (at its first step) is a session of its own, with the source's first exchange.
        fork_id = f"{session_id}-fork"
        fork = await dev_env.client.start_workflow(
            AgentWorkflow.run,
            AgentInput(session=SessionSpec(), fork=ForkSpec(workflow_id=session_id, step=1)),
            id=fork_id,
            task_queue=tq,
        )
        forked = await eventually(lambda: _idle(fork), "the fork idle")
        assert forked.session and forked.messages == 1 and forked.step == 1
        third = await send(fork, "in the fork")
        assert third.seq == 2
        assert (await replied(fork, 2)).output == "fork reply"
    chat = chat_requests(llm)
    woken_prompt = chat[1]["body"]["messages"]
    assert [(m["role"], m.get("content")) for m in woken_prompt[1:]] == [
        ("user", "hello"),
        ("assistant", "first reply"),
        ("user", "again"),
    ]
    fork_prompt = chat[2]["body"]["messages"]
    assert [m.get("content") for m in fork_prompt[1:]] == ["hello", "first reply", "in the fork"]
