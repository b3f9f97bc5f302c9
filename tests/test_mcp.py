"""MCP tools in runs: real servers (mcp-server-time from PyPI, server-everything from npm, an SDK-built shop).

Each test writes an ``AGENT_MCP_CONFIG`` file, runs a worker on the real Temporal dev server, and a
scripted model calls ``mcp__<server>__<tool>`` tools. What the servers did is read from their own
records (the shop's delivery ledger file), never from the runtime's view of it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from activities.runtime import Runtime
from activities.settings import Settings
from tests.conftest import WorkerFactory, start_agent
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.mcp_servers import free_port, orders_http, read_ledger
from tests.scenarios import pending_view
from workflows.agent import AgentWorkflow
from workflows.types import ApproveSignal, ResolveSignal

ROOT = Path(__file__).resolve().parent.parent
TIME_SERVER = str(Path(sys.executable).parent / "mcp-server-time")


def orders_stdio(ledger: Path, **extra: Any) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": ["-m", "tests.fakes.mcp_orders"],
        "cwd": str(ROOT),
        "env": {"ORDERS_LEDGER": str(ledger)},
        **extra,
    }


ALLOW_SHOP = {"rules": [{"tool": "mcp__shop__*", "decision": "allow"}]}


def mcp_runtime(
    settings: Settings, tmp_path: Path, servers: dict[str, Any], *, policy: dict[str, Any] | None = None, **env: str
) -> Runtime:
    """A runtime with these MCP servers (and this operator policy: a run's own policy can only tighten)."""
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    environ = {"PATH": os.environ.get("PATH", ""), **env}
    policy_file = ""
    if policy is not None:
        policy_file = str(tmp_path / "policy.json")
        Path(policy_file).write_text(json.dumps(policy))
    return Runtime.from_settings(replace(settings, mcp_config=str(path), environ=environ, policy_file=policy_file))


def tool_messages(llm: FakeLLMServer, request_index: int) -> list[str]:
    return [m["content"] for m in llm.requests[request_index]["body"]["messages"] if m["role"] == "tool"]


def offered(llm: FakeLLMServer, request_index: int = 0) -> dict[str, Any]:
    return {t["function"]["name"]: t["function"] for t in llm.requests[request_index]["body"].get("tools", [])}


async def mcp_events(handle: WorkflowHandle[Any, Any]) -> list[tuple[str, str]]:
    """(activity type, summary) of every activity the run scheduled."""
    found = []
    async for event in handle.fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            kind = event.activity_task_scheduled_event_attributes.activity_type.name
            summary = event.user_metadata.summary.data.decode() if event.HasField("user_metadata") else ""
            found.append((kind, json.loads(summary) if summary else ""))
    return found


async def test_read_only_mcp_tool_runs_without_approval_and_returns_the_servers_output(
    dev_env: WorkflowEnvironment, settings: Settings, tmp_path: Path, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    runtime = mcp_runtime(settings, tmp_path, {"time": {"command": TIME_SERVER}})
    llm.enqueue(
        Scripted(tool_calls=[("mcp__time__get_current_time", json.dumps({"timezone": "UTC"}))]),
        Scripted(text="it is late"),
    )
    try:
        async with run_worker(dev_env.client, runtime) as tq:
            handle = await start_agent(dev_env.client, tq, id_prefix="mcp-time", tools=["mcp__time__*"])
            result = await handle.result()
        history = await handle.fetch_history()
    finally:
        await runtime.aclose()
    assert result.status == "completed", result.output
    tools = offered(llm)
    assert set(tools) == {"mcp__time__get_current_time", "mcp__time__convert_time"}
    assert "timezone" in json.dumps(tools["mcp__time__get_current_time"]["parameters"])
    [answer] = tool_messages(llm, 1)
    reported = json.loads(answer)
    assert reported["timezone"] == "UTC" and reported["datetime"][:4].isdigit()
    assert ("mcp", "mcp time.get_current_time") in await mcp_events(handle)
    # Replay needs no server: the history holds the snapshot's digest and the validated calls.
    await Replayer(workflows=[AgentWorkflow], data_converter=dev_env.client.data_converter).replay_workflow(history)


async def test_side_effecting_mcp_tool_waits_for_approval_then_delivers_once_with_its_key(
    dev_env: WorkflowEnvironment, settings: Settings, tmp_path: Path, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    ledger = tmp_path / "orders.jsonl"
    port = free_port()
    with orders_http(port, ledger):
        runtime = mcp_runtime(settings, tmp_path, {"shop": {"url": f"http://127.0.0.1:{port}/mcp"}})
        llm.enqueue(
            Scripted(tool_calls=[("mcp__shop__place_order", json.dumps({"item": "mug", "quantity": 2}))]),
            Scripted(text="ordered"),
        )
        try:
            async with run_worker(dev_env.client, runtime) as tq:
                handle = await start_agent(dev_env.client, tq, id_prefix="mcp-shop", tools=["mcp__shop__place_order"])
                view = await pending_view(handle)
                [approval] = view.pending_approvals
                assert approval.tool == "mcp__shop__place_order"
                assert approval.args == {"item": "mug", "quantity": 2}
                assert approval.rule == "default:side-effect"
                assert read_ledger(ledger) == []  # nothing is sent before the decision
                await handle.signal(
                    AgentWorkflow.approve, ApproveSignal(approval_id=approval.approval_id, reviewer="al")
                )
                result = await handle.result()
            entries = await runtime.store.ledger(handle.id)
        finally:
            await runtime.aclose()
    assert result.status == "completed", result.output
    deliveries = [e for e in read_ledger(ledger) if e.get("tool") == "place_order"]
    assert len(deliveries) == 1 and deliveries[0]["item"] == "mug"
    [entry] = entries
    assert entry.state == "done" and deliveries[0]["key"] == entry.key


async def test_server_killed_mid_call_makes_the_outcome_unknown_never_a_silent_repeat(
    dev_env: WorkflowEnvironment, settings: Settings, tmp_path: Path, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    ledger = tmp_path / "orders.jsonl"
    runtime = mcp_runtime(settings, tmp_path, {"shop": orders_stdio(ledger)}, policy=ALLOW_SHOP)
    llm.enqueue(
        Scripted(tool_calls=[("mcp__shop__slow_order", json.dumps({"item": "piano", "seconds": 30}))]),
        Scripted(text="gave up"),
    )
    try:
        async with run_worker(dev_env.client, runtime) as tq:
            handle = await start_agent(dev_env.client, tq, id_prefix="mcp-kill")
            started = await _started_event(ledger)
            os.kill(started["pid"], signal.SIGKILL)
            view = await pending_view(handle)
            [approval] = view.pending_approvals
            assert approval.kind == "resolve_unknown_outcome" and approval.tool == "mcp__shop__slow_order"
            await handle.signal(
                AgentWorkflow.resolve,
                ResolveSignal(approval_id=approval.approval_id, resolution="fail", reviewer="al", comment="no piano"),
            )
            result = await handle.result()
    finally:
        await runtime.aclose()
    assert result.status == "completed", result.output
    events = read_ledger(ledger)
    assert [e.get("event") for e in events] == ["started"]  # never sent again, never delivered
    [answer] = tool_messages(llm, 1)
    assert "marked failed by al" in answer


async def test_server_killed_mid_call_with_idempotent_by_key_is_resent_with_the_same_key(
    dev_env: WorkflowEnvironment, settings: Settings, tmp_path: Path, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    ledger = tmp_path / "orders.jsonl"
    runtime = mcp_runtime(
        settings,
        tmp_path,
        {"shop": orders_stdio(ledger, tools={"slow_order": {"recovery": "idempotent_by_key"}})},
        policy=ALLOW_SHOP,
    )
    llm.enqueue(
        Scripted(tool_calls=[("mcp__shop__slow_order", json.dumps({"item": "piano", "seconds": 1}))]),
        Scripted(text="ordered"),
    )
    try:
        async with run_worker(dev_env.client, runtime) as tq:
            handle = await start_agent(dev_env.client, tq, id_prefix="mcp-resend")
            first = await _started_event(ledger)
            os.kill(first["pid"], signal.SIGKILL)
            result = await handle.result()
    finally:
        await runtime.aclose()
    assert result.status == "completed", result.output
    events = read_ledger(ledger)
    starts = [e for e in events if e.get("event") == "started"]
    deliveries = [e for e in events if e.get("tool") == "slow_order" and "event" not in e]
    assert len(starts) == 2 and starts[0]["pid"] != starts[1]["pid"]  # a new server process got the resend
    assert starts[0]["key"] == starts[1]["key"] and starts[0]["key"].startswith("ik_")
    assert len(deliveries) == 1 and deliveries[0]["key"] == starts[0]["key"]


async def _started_event(ledger: Path, count: int = 1) -> dict[str, Any]:
    for _ in range(400):
        started = [e for e in read_ledger(ledger) if e.get("event") == "started"]
        if len(started) >= count:
            return started[count - 1]
        await asyncio.sleep(0.05)
    raise AssertionError(f"the shop never started the call; ledger: {read_ledger(ledger)}")
