"""Cancelling a run after side effects: compensations run newest first and the result reports them."""

from __future__ import annotations

import asyncio
import json
import uuid

from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.settings import ExtensionSettings
from tests.conftest import WorkerFactory, with_settings
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from workflows.agent import AgentWorkflow
from workflows.types import AgentInput


async def test_cancel_compensates_completed_side_effects(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, tmp_path
) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"rules": [{"tool": "*", "decision": "allow"}]}))
    tools = ExtensionSettings(tool_modules=("tests.fakes.compensable_tools",))
    rt = with_settings(runtime, policy_file=str(policy), extensions=tools)
    with HttpSink() as sink:
        llm.enqueue(
            Scripted(tool_calls=[("reserve", json.dumps({"url": f"{sink.url}/seats/1"}))]),
            Scripted(
                tool_calls=[
                    ("reserve", json.dumps({"url": f"{sink.url}/seats/2"})),
                    ("http_request", json.dumps({"method": "POST", "url": f"{sink.url}/notes"})),
                ]
            ),
            Scripted(text="never seen", delay_s=3),
        )
        async with run_worker(dev_env.client, rt) as tq:
            handle = await dev_env.client.start_workflow(
                AgentWorkflow.run,
                AgentInput(task="reserve two seats"),
                id=f"comp-{uuid.uuid4().hex[:8]}",
                task_queue=tq,
            )
            for _ in range(400):
                if len(llm.requests) == 3:
                    break
                await asyncio.sleep(0.05)
            await handle.cancel()
            result = await handle.result()
            ledger = await rt.store.ledger(handle.id)

    assert result.status == "cancelled"
    lines = result.output.splitlines()
    assert lines[0] == "the run was cancelled."
    # Newest first; the POST declares no compensation and is reported as such.
    assert "http_request" in lines[2] and "no compensation declared" in lines[2]
    assert "reserve" in lines[3] and "compensated: released (200)" in lines[3]
    assert "reserve" in lines[4] and "compensated: released (200)" in lines[4]
    methods = [(r.method, r.path) for r in sink.received]
    assert methods == [
        ("POST", "/seats/1"),
        ("POST", "/seats/2"),
        ("POST", "/notes"),
        ("DELETE", "/seats/2"),
        ("DELETE", "/seats/1"),
    ]
    # The compensation carries the original call's idempotency key.
    assert sink.received[3].headers["idempotency-key"] == sink.received[1].headers["idempotency-key"]
    assert {e.state for e in ledger} == {"done"} and len(ledger) == 3
