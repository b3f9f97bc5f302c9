"""Workspace checkpoints in runs: a lost sandbox finds its files, forks start from a step, rewinds never repeat.

Real parts: the Temporal dev server, the local bubblewrap sandbox, the SQLite run store, an HTTP
destination that records every delivery (``HttpSink``), and the ``starter.py``/``temporal`` CLIs.
The scripted model decides by what it has been told so far, so a fork or a rewind that asks it
again gets the same answer for the same transcript.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHandle
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from activities.checkpoints.workspace import RESTORED_NOTE
from activities.runtime import Runtime
from activities.sandbox.e2b.backend import E2BSandboxBackend
from activities.settings import E2BConfig, Settings
from activities.tools.activity import tool_activities
from durable_agents.cli.fork import reset_event_for_step
from tests.conftest import WorkerFactory, require_bwrap, start_agent
from tests.fakes.fake_e2b import FakeCloud
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from worker import build_worker
from workflows.agent import AgentWorkflow
from workflows.types import AgentInput, AgentResult, ApproveSignal, ForkSpec, ToolInvocation

ROOT = Path(__file__).resolve().parent.parent
Reply = Callable[[dict[str, Any]], Scripted]


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


def tool_results(body: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in body.get("messages", []) if m.get("role") == "tool"]


def three_steps(sink: HttpSink, *, after_rewind: dict[str, bool] | None = None) -> Reply:
    """Step 1 writes a.txt = v1, step 2 POSTs order 1, step 3 writes a.txt = v2; then it answers.

    With ``after_rewind["on"]`` set, step 3 reads a.txt instead (what a rewound run's workspace holds).
    A user message "check the file" (a fork's new task) makes it read a.txt and answer with it.
    """

    def reply(body: dict[str, Any]) -> Scripted:
        messages = body.get("messages", [])
        done = tool_results(body)
        if any(m.get("role") == "user" and m.get("content") == "check the file" for m in messages):
            if messages[-1].get("role") == "user":
                return Scripted(tool_calls=[("run_shell", json.dumps({"command": "cat a.txt"}))])
            return Scripted(text=f"the file says: {done[-1]}")
        if len(done) == 0:
            return Scripted(tool_calls=[("write_file", json.dumps({"path": "a.txt", "content": "v1"}))])
        if len(done) == 1:
            post = {"method": "POST", "url": f"{sink.url}/orders", "json": {"order": 1}}
            return Scripted(tool_calls=[("http_request", json.dumps(post))])
        if len(done) == 2:
            if after_rewind and after_rewind.get("on"):
                return Scripted(tool_calls=[("run_shell", json.dumps({"command": "cat a.txt"}))])
            return Scripted(tool_calls=[("write_file", json.dumps({"path": "a.txt", "content": "v2"}))])
        return Scripted(text=f"done: {done[-1]}")

    return reply


async def approve_all(handle: WorkflowHandle[Any, Any], stop: asyncio.Event) -> None:
    """Approve every pending approval until ``stop`` is set."""
    seen: set[str] = set()
    while not stop.is_set():
        view = await handle.query(AgentWorkflow.status)
        for approval in view.pending_approvals:
            if approval.approval_id not in seen:
                seen.add(approval.approval_id)
                await handle.signal(
                    AgentWorkflow.approve, ApproveSignal(approval_id=approval.approval_id, reviewer="ops")
                )
        await asyncio.sleep(0.05)


async def run_approved(handle: WorkflowHandle[Any, AgentResult]) -> AgentResult:
    stop = asyncio.Event()
    approver = asyncio.create_task(approve_all(handle, stop))
    try:
        return await handle.result()
    finally:
        stop.set()
        await approver


async def test_fork_at_step_1_has_step_1s_files_and_transcript_and_repeats_nothing(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    require_bwrap()
    llm.default = three_steps(sink)
    async with run_worker(dev_env.client, runtime) as tq:
        source = await start_agent(dev_env.client, tq, id_prefix="ck-src", task="write and order")
        result = await run_approved(source)
        assert result.status == "completed", result.output
        assert len(sink.writes()) == 1
        source_events = len((await source.fetch_history()).events)
        requests_before = len(llm.requests)

        fork = await dev_env.client.start_workflow(
            AgentWorkflow.run,
            AgentInput(task="check the file", fork=ForkSpec(workflow_id=source.id, step=1)),
            id=f"ck-fork-{uuid.uuid4().hex[:8]}",
            task_queue=tq,
        )
        forked = await fork.result()
        view = await fork.query(AgentWorkflow.status)
    assert forked.status == "completed", forked.output
    assert forked.output.startswith("the file says:") and "stdout:\nv1" in forked.output  # step 1's checkpoint
    first = llm.requests[requests_before]["body"]["messages"]
    roles = [m["role"] for m in first]
    assert roles == ["system", "user", "assistant", "tool", "user"]  # step 1, then the new instruction
    assert first[2]["tool_calls"][0]["function"]["name"] == "write_file"
    assert len(sink.writes()) == 1  # nothing of the source's steps ran again
    assert (await source.result()) == result and len((await source.fetch_history()).events) == source_events
    assert view.step == 3 and view.checkpoint  # step 1 copied, its step 2 read the file, step 3 answered


@pytest.mark.parametrize("backend_name", ["local", "e2b"])
async def test_a_lost_sandbox_is_restored_from_the_last_checkpoint(runtime: Runtime, backend_name: str) -> None:
    cloud = FakeCloud()
    if backend_name == "local":
        require_bwrap()
    else:  # the E2B fake at the SDK boundary: its VMs expire when nobody used them for their timeout
        runtime._sandbox_backend = E2BSandboxBackend(cloud.api_key, E2BConfig(), sdk=cloud.sdk())
    tools = {fn.__name__: fn for fn in tool_activities(runtime)}
    backend = runtime.sandbox_backend()
    await backend.create("sbx-ck-lost", metadata={})
    env = ActivityEnvironment()

    def invocation(seq: int, tool: str, arguments: dict[str, Any], checkpoint: str) -> ToolInvocation:
        return ToolInvocation(
            conversation_id="wf-ck-lost/run-1",
            workflow_id="wf-ck-lost",
            step=seq,
            call_id=f"call_{seq}",
            call_index=0,
            seq=seq,
            tool=tool,
            arguments=arguments,
            idempotency_key=f"ik_ck_lost_{seq}",
            sandbox_id="sbx-ck-lost",
            checkpoints=True,
            checkpoint=checkpoint,
        )

    write = {"path": "d/notes.txt", "content": "kept"}
    first = await env.run(tools["tool_write_file"], invocation(2, "write_file", write, ""))
    assert first.ok and first.checkpoint.startswith("sha256:")
    if backend_name == "local":
        await backend.kill("sbx-ck-lost")  # reaped, or the next step landed on another host
    else:
        cloud.advance(E2BConfig().timeout_s + 1)  # the VM expired between the steps
    read = await env.run(tools["tool_read_file"], invocation(3, "read_file", {"path": "d/notes.txt"}, first.checkpoint))
    assert read.ok, read.preview
    assert read.preview.startswith(RESTORED_NOTE) and read.preview.endswith("kept")
    assert read.checkpoint == first.checkpoint  # reading changed nothing: the same checkpoint

    again = {"path": "d/notes.txt", "content": "kept, and more"}
    third = await env.run(tools["tool_write_file"], invocation(4, "write_file", again, read.checkpoint))
    assert RESTORED_NOTE not in third.preview and third.checkpoint not in ("", read.checkpoint)


@pytest.mark.parametrize("how", ["starter", "temporal"])
async def test_rewind_restores_step_1s_workspace_and_never_repeats_the_order(
    dev_env: WorkflowEnvironment,
    runtime: Runtime,
    run_worker: WorkerFactory,
    llm: FakeLLMServer,
    sink: HttpSink,
    how: str,
) -> None:
    require_bwrap()
    phase = {"on": False}
    llm.default = three_steps(sink, after_rewind=phase)
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, id_prefix=f"ck-rw-{how}", task="write and order")
        result = await run_approved(handle)
        assert result.status == "completed" and len(sink.writes()) == 1
        phase["on"] = True
        address = dev_env.client.service_client.config.target_host
        if how == "starter":
            command = [sys.executable, "starter.py", "rewind", handle.id, "--to-step", "1", "--reason", "test"]
        else:
            event = reset_event_for_step((await handle.fetch_history()).events, 1)
            assert event is not None
            temporal = str(Path(sys.executable).parent / "temporal")
            command = [temporal, "workflow", "reset", "--address", address, "--workflow-id", handle.id]
            command += ["--event-id", str(event), "--reason", "test"]
        done = await asyncio.to_thread(
            subprocess.run,
            command,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "TEMPORAL_ADDRESS": address, "AGENT_TASK_QUEUE": tq},
        )
        assert done.returncode == 0, done.stderr
        rewound = dev_env.client.get_workflow_handle(handle.id, result_type=AgentResult)
        again = await run_approved(rewound)
    assert again.status == "completed", again.output
    # Step 2's POST is the same call (same key): its recorded outcome, not a second delivery.
    assert len(sink.writes()) == 1
    # Step 3 of the rewound run read a.txt: step 1's workspace (v1), not the old step 3's v2.
    assert "stdout:\nv1" in again.output, again.output


async def test_two_hosts_sharing_a_postgres_store_keep_the_runs_files(
    dev_env: WorkflowEnvironment, settings: Settings, tmp_path: Path, llm: FakeLLMServer, postgres_db_url: str
) -> None:
    """Workers with their own ``AGENT_STATE_DIR`` (local sandboxes) share only Temporal and the store."""
    require_bwrap()
    moved = threading.Event()

    def reply(body: dict[str, Any]) -> Scripted:
        done = tool_results(body)
        if not done:
            return Scripted(tool_calls=[("write_file", json.dumps({"path": "a.txt", "content": "written on A"}))])
        if len(done) == 1:
            moved.wait(60)  # meanwhile the test stops host A and starts host B
            return Scripted(tool_calls=[("read_file", json.dumps({"path": "a.txt"}))])
        return Scripted(text=f"read: {done[-1]}")

    llm.default = reply
    hosts = [
        Runtime.from_settings(replace(settings, store_url=postgres_db_url, state_dir=tmp_path / name))
        for name in ("host-a", "host-b")
    ]
    task_queue = f"ck-hosts-{uuid.uuid4().hex[:8]}"
    host_a = build_worker(dev_env.client, hosts[0], task_queue=task_queue)
    running_a = asyncio.create_task(host_a.run())
    try:
        handle = await start_agent(dev_env.client, task_queue, id_prefix="ck-hosts")
        for _ in range(600):
            if len(llm.requests) >= 2:  # step 2's model call is in flight on host A
                break
            await asyncio.sleep(0.05)
        await host_a.shutdown()  # its in-flight model call fails and is retried on host B
        await running_a
        host_b = build_worker(dev_env.client, hosts[1], task_queue=task_queue)
        async with host_b:
            moved.set()
            result = await handle.result()
    finally:
        moved.set()
        for host in hosts:
            await host.aclose()
    assert result.status == "completed", result.output
    assert result.output.startswith(f"read: {RESTORED_NOTE}") and result.output.endswith("written on A")
    # Host B made a sandbox of its own (the note) and restored A's file into it from the shared store.
