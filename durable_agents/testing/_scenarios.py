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
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from durable_agents.testing._http_sink import HttpSink
from durable_agents.testing._llm_server import FakeLLMServer, Scripted
from durable_agents.testing._ports import inherited_path
from workflows.agent import AgentWorkflow
from workflows.types import (
    AgentInput,
    AgentResult,
    AnswerSignal,
    ApproveSignal,
    ForkSpec,
    Limits,
    RejectSignal,
    StatusView,
)

Handle = WorkflowHandle[AgentWorkflow, AgentResult]
Scenario = Callable[[Client, str, FakeLLMServer, HttpSink, str], Awaitable[Handle]]
# Settings a scenario's runtime needs beyond the defaults: ``dataclasses.replace`` changes, given a
# temporary directory that lives as long as the scenario's worker.
SettingsChanges = Callable[[Path], dict[str, Any]]


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


def _tool_results(body: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in body.get("messages", []) if m.get("role") == "tool"]


async def fork(client: Client, tq: str, llm: FakeLLMServer, sink: HttpSink, wid: str) -> Handle:
    """A source run writes a.txt = v1 (step 1) and reads it (step 2); a fork at step 1 with a new task
    (``fork_prepare``, then a restored workspace) reads it and answers. The fork is the recorded run."""

    def reply(body: dict[str, Any]) -> Scripted:
        messages = body.get("messages", [])
        done = _tool_results(body)
        if any(m.get("role") == "user" and m.get("content") == "check the file" for m in messages):
            if messages[-1].get("role") == "user":
                return Scripted(tool_calls=[("run_shell", json.dumps({"command": "cat a.txt"}))])
            return Scripted(text=f"the file says: {done[-1]}")
        if not done:
            return Scripted(tool_calls=[("write_file", json.dumps({"path": "a.txt", "content": "v1"}))])
        if len(done) == 1:
            return Scripted(tool_calls=[("run_shell", json.dumps({"command": "cat a.txt"}))])
        return Scripted(text=f"done: {done[-1]}")

    llm.default = reply
    source = await _start(client, tq, f"{wid}-source", task="write and read")
    await source.result()
    handle = await _start(client, tq, wid, task="check the file", fork=ForkSpec(workflow_id=source.id, step=1))
    await handle.result()
    return handle


def mcp_time_settings(tmp: Path) -> dict[str, Any]:
    """The time server (``mcp-server-time`` from PyPI, next to this interpreter) as ``AGENT_MCP_CONFIG``."""
    config = tmp / "mcp.json"
    server = str(Path(sys.executable).parent / "mcp-server-time")
    config.write_text(json.dumps({"mcpServers": {"time": {"command": server}}}))
    return {"mcp_config": str(config), "environ": {"PATH": inherited_path()}}


async def mcp_tools(client: Client, tq: str, llm: FakeLLMServer, sink: HttpSink, wid: str) -> Handle:
    """A read-only MCP tool (``mcp`` activity), then a sandbox tool, then an answer."""
    llm.enqueue(
        Scripted(tool_calls=[("mcp__time__get_current_time", json.dumps({"timezone": "UTC"}))]),
        Scripted(tool_calls=[("write_file", json.dumps({"path": "time.txt", "content": "noted"}))]),
        Scripted(text="noted the time"),
    )
    handle = await _start(client, tq, wid, task="note the time", tools=["mcp__time__*", "write_file"])
    await handle.result()
    return handle


def humans_settings(tmp: Path) -> dict[str, Any]:
    rule = {"name": "two-eyes", "tool": "http_request", "when": {"url": "/pay"}, "decision": "ask", "approvals": 2}
    policy = tmp / "policy.json"
    policy.write_text(json.dumps({"rules": [rule]}))
    return {"policy_file": str(policy)}


async def humans(client: Client, tq: str, llm: FakeLLMServer, sink: HttpSink, wid: str) -> Handle:
    """A question answered, an edited approval remembered for identical calls, then a quorum of two."""
    order = {"method": "POST", "url": f"{sink.url}/orders"}
    llm.enqueue(
        Scripted(tool_calls=[("ask_human", json.dumps({"question": "Which sku?", "options": ["1", "3"]}))]),
        Scripted(tool_calls=[("http_request", json.dumps({**order, "json": {"sku": 1}}))]),
        Scripted(tool_calls=[("http_request", json.dumps({**order, "json": {"sku": 3}}))]),  # the edit: remembered
        Scripted(tool_calls=[("http_request", json.dumps({"method": "POST", "url": f"{sink.url}/pay"}))]),
        Scripted(text="ordered and paid"),
    )
    handle = await _start(client, tq, wid, task="order and pay")
    [question] = await _pending_ids(handle, 1)
    await handle.signal("answer", AnswerSignal(question_id=question, reviewer="alice", text="3"))
    [approval] = [a for a in (await pending_view(handle)).pending_approvals if a.approval_id != question]
    edited = {**approval.args, "json": {"sku": 3}}
    await handle.signal(
        AgentWorkflow.approve,
        ApproveSignal(approval_id=approval.approval_id, reviewer="alice", arguments=edited, remember="call"),
    )
    for _ in range(400):
        view = await handle.query(AgentWorkflow.status)
        if [a for a in view.pending_approvals if a.tool == "http_request" and a.args["url"].endswith("/pay")]:
            break
        await asyncio.sleep(0.05)
    [pay] = [a.approval_id for a in view.pending_approvals]
    await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=pay, reviewer="alice"))
    await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=pay, reviewer="bob"))
    await handle.result()
    return handle


SCENARIOS: dict[str, Scenario] = {
    "tools_and_errors": tools_and_errors,
    "approvals": approvals,
    "limit_exceeded": limit_exceeded,
    "fork": fork,
    "mcp_tools": mcp_tools,
    "humans": humans,
}

SETTINGS: dict[str, SettingsChanges] = {"mcp_tools": mcp_time_settings, "humans": humans_settings}


FORK_STEPS = 3  # the turns of ``get_twice_then_count``'s run


def get_twice_then_count(sink: HttpSink) -> Callable[[dict[str, Any]], Scripted]:
    """A model for fork and rewind tests: turns 1 and 2 GET the sink; turn 3 answers with the number of
    turns it saw (so a fork's or rewind's reply says how much of the source it kept)."""

    def reply(body: dict[str, Any]) -> Scripted:
        turns = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        if turns < FORK_STEPS - 1:
            get = json.dumps({"method": "GET", "url": f"{sink.url}/item/{turns + 1}"})
            return Scripted(tool_calls=[("http_request", get)])
        return Scripted(text=f"done after {turns} turns")

    return reply
