"""Representative runs, shared by the history recorder (``scripts/record_histories.py``) and tests.

Each scenario drives one ``AgentWorkflow`` to completion against a worker on
``task_queue`` with a FakeLLMServer and an HttpSink, and returns its handle.
The recorded histories in ``tests/histories/`` are replayed by
``tests/test_replay.py`` so that a change to the loop's command sequence that
is not guarded with ``workflow.patched`` fails CI.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio.client import Client, WorkflowHandle

from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from workflows.agent import AgentWorkflow
from workflows.types import AgentInput, AgentResult, ApproveSignal, Limits, RejectSignal, StatusView

Handle = WorkflowHandle[AgentWorkflow, AgentResult]
Scenario = Callable[[Client, str, FakeLLMServer, HttpSink, str], Awaitable[Handle]]


async def _start(client: Client, task_queue: str, workflow_id: str, **fields: Any) -> Handle:
    return await client.start_workflow(AgentWorkflow.run, AgentInput(**fields), id=workflow_id, task_queue=task_queue)


async def pending_view(handle: WorkflowHandle[Any, Any], count: int = 1) -> StatusView:
    """The run's status once at least ``count`` approvals wait (20 s at most)."""
    for _ in range(400):
        view: StatusView = await handle.query(AgentWorkflow.status)
        if len(view.pending_approvals) >= count:
            return view
        await asyncio.sleep(0.05)
    raise AssertionError(f"expected {count} pending approval(s)")


async def _pending_ids(handle: Handle, count: int) -> list[str]:
    return [p.approval_id for p in (await pending_view(handle, count)).pending_approvals]


async def tools_and_errors(client: Client, tq: str, llm: FakeLLMServer, sink: HttpSink, wid: str) -> Handle:
    """Tool round trip, a GET, and every bad-output case in one run."""
    llm.enqueue(
        Scripted(tool_calls=[("write_file", json.dumps({"path": "a.txt", "content": "hello"}))]),
        Scripted(
            tool_calls=[
                ("read_file", json.dumps({"path": "a.txt"})),
                ("http_request", json.dumps({"method": "GET", "url": f"{sink.url}/status"})),
                ("read_file", "{not json"),
                ("no_such_tool", "{}"),
            ]
        ),
        Scripted(text="finished"),
    )
    handle = await _start(client, tq, wid, task="tools and errors")
    await handle.result()
    return handle


async def approvals(client: Client, tq: str, llm: FakeLLMServer, sink: HttpSink, wid: str) -> Handle:
    """Two pending approvals in one turn: one approved, one rejected; a signal refused on the way."""
    post = {"method": "POST", "url": f"{sink.url}/orders"}
    llm.enqueue(
        Scripted(
            tool_calls=[
                ("http_request", json.dumps({**post, "json": {"sku": 1}})),
                ("http_request", json.dumps({**post, "json": {"sku": 2}})),
            ]
        ),
        Scripted(text="one ordered"),
    )
    handle = await _start(client, tq, wid, task="order", approvers=["alice", "bob"])
    first, second = await _pending_ids(handle, 2)
    await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=first, reviewer="mallory"))
    await handle.signal(AgentWorkflow.reject, RejectSignal(approval_id=second, reviewer="bob", reason="dup"))
    await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=first, reviewer="alice"))
    await handle.result()
    return handle


async def limit_exceeded(client: Client, tq: str, llm: FakeLLMServer, sink: HttpSink, wid: str) -> Handle:
    llm.default = Scripted(tool_calls=[("read_file", json.dumps({"path": "missing"}))])
    handle = await _start(client, tq, wid, task="loop forever", limits=Limits(max_steps=3))
    await handle.result()
    return handle


SCENARIOS: dict[str, Scenario] = {
    "tools_and_errors": tools_and_errors,
    "approvals": approvals,
    "limit_exceeded": limit_exceeded,
}
