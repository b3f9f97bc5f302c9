"""An idle session: its sandbox stops, then it ends; a later send wakes it on its conversation and workspace.

The idle part runs on the time-skipping test server (days pass in no time); the sandbox is the
local bubblewrap one, so the file is a real file in a real workspace, restored from its checkpoint.
The ``AgentState`` search attribute of an idle session is checked on the dev server, which lets the
worker register its search attributes.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WithStartWorkflowOperation, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.sandbox.local.backend import LocalSandboxBackend
from durable_agents.search_attributes import ensure_search_attributes
from tests.conftest import WorkerFactory, require_bwrap
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.progress import STATE
from workflows.session_types import SendResult, SessionMessage, SessionSpec
from workflows.types import AgentInput, AgentResult, StatusView

SANDBOX_IDLE_S = 600
IDLE_TIMEOUT_S = 2 * 24 * 3600
NOTE = "the answer is 42"


def chat(llm: FakeLLMServer) -> list[list[dict[str, Any]]]:
    return [r["body"]["messages"] for r in llm.requests if r["path"].endswith("/chat/completions")]


async def status(handle: WorkflowHandle[Any, Any]) -> StatusView:
    view: StatusView = await handle.query(AgentWorkflow.status)
    return view


async def replied(handle: WorkflowHandle[Any, Any], seq: int) -> StatusView:
    async def check() -> StatusView | None:
        view = await status(handle)
        return view if view.replied >= seq and view.state == "idle" else None

    return await eventually(check, f"the reply to message {seq}")


def wake_with(session_id: str, task_queue: str, spec: SessionSpec) -> WithStartWorkflowOperation[Any, Any]:
    return WithStartWorkflowOperation(
        AgentWorkflow.run,
        AgentInput(session=spec),
        id=session_id,
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )


async def test_idle_session_stops_its_sandbox_ends_and_wakes_with_its_file(
    time_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    require_bwrap()
    llm.enqueue(
        Scripted(tool_calls=[("write_file", json.dumps({"path": "notes.txt", "content": NOTE}))]),
        Scripted(text="noted"),
        Scripted(tool_calls=[("read_file", json.dumps({"path": "notes.txt"}))]),
        Scripted(text="it says 42"),
    )
    client = time_env.client
    backend = runtime.sandbox_backend()
    assert isinstance(backend, LocalSandboxBackend)
    spec = SessionSpec(idle_timeout_s=IDLE_TIMEOUT_S, sandbox_idle_s=SANDBOX_IDLE_S)
    session_id = f"idle-s-{uuid.uuid4().hex[:8]}"
    async with run_worker(client, runtime) as tq:
        with time_env.auto_time_skipping_disabled():
            handle = await client.start_workflow(
                AgentWorkflow.run, AgentInput(session=spec), id=session_id, task_queue=tq
            )
            first = await handle.execute_update(
                "send", SessionMessage(message_id="m1", text="remember this in a file"), result_type=SendResult
            )
            assert first.accepted and first.seq == 1
            view = await replied(handle, 1)
            assert view.checkpoint, "the write left a workspace checkpoint"
            [sandbox] = await backend.list_sandboxes()
            assert (backend.root / sandbox.sandbox_id).is_dir()

        await time_env.sleep(timedelta(seconds=SANDBOX_IDLE_S + 60))  # skipped, not waited
        with time_env.auto_time_skipping_disabled():
            await eventually(lambda: _no_sandboxes(backend), "the idle session's sandbox killed")
            assert not (backend.root / sandbox.sandbox_id).exists()
            view = await status(handle)
            assert view.state == "idle" and view.session  # the session itself still waits

        ended = await handle.result()  # the idle timeout passes (skipped)
        assert ended.status == "completed" and ended.output == "noted"
        described = await handle.describe()
        assert described.status is not None and described.status.name == "COMPLETED"

        with time_env.auto_time_skipping_disabled():
            second = await client.execute_update_with_start_workflow(
                "send",
                SessionMessage(message_id="m2", text="what did I write?"),
                start_workflow_operation=wake_with(session_id, tq, spec),
                result_type=SendResult,
            )
            assert second.accepted and second.seq == 2
            woken = client.get_workflow_handle(session_id, result_type=AgentResult)
            view = await replied(woken, 2)
            assert view.output == "it says 42" and view.messages == 2
        # Nothing is left waiting on the shared time-skipping server (its timers would stall the next test's skip).
        await woken.signal("close")
        assert (await woken.result()).status == "completed"
        assert await _no_sandboxes(backend)

    prompts = chat(llm)
    assert len(prompts) == 4
    # The woken session's first model turn sees the earlier conversation, then the new message.
    woken_prompt = prompts[2]
    assert [m["role"] for m in woken_prompt[1:]] == ["user", "assistant", "tool", "assistant", "user"]
    assert woken_prompt[1]["content"] == "remember this in a file" and woken_prompt[4]["content"] == "noted"
    # The file written before the session ended is read back from its workspace by a tool.
    read = [m["content"] for m in prompts[3] if m["role"] == "tool"][-1]
    assert NOTE in read, read


async def _no_sandboxes(backend: LocalSandboxBackend) -> bool:
    return not await backend.list_sandboxes()


async def test_an_idle_session_is_listed_by_its_agent_state(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    client = dev_env.client
    runtime.search_attributes_ready = await ensure_search_attributes(client)
    assert runtime.search_attributes_ready
    llm.enqueue(Scripted(text="hello", delay_s=5))
    session_id = f"state-s-{uuid.uuid4().hex[:8]}"
    idle = f"AgentState = 'idle' AND WorkflowId = '{session_id}'"
    async with run_worker(client, runtime) as tq:
        handle = await client.start_workflow(
            AgentWorkflow.run, AgentInput(session=SessionSpec()), id=session_id, task_queue=tq
        )
        await eventually(lambda: _listed(client, idle), "the new session listed as idle")
        await handle.execute_update("send", SessionMessage(message_id="m1", text="hi"), result_type=SendResult)
        await eventually(lambda: chat(llm), "the slow model turn in flight")
        assert (await handle.describe()).typed_search_attributes.get(STATE) == "running"  # not idle while it works
        await replied(handle, 1)
        await eventually(lambda: _listed(client, idle), "the session listed as idle after its reply")
        assert (await handle.describe()).typed_search_attributes.get(STATE) == "idle"


async def _listed(client: Client, query: str) -> bool:
    return bool([w async for w in client.list_workflows(query)])
