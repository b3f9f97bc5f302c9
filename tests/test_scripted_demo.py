"""The offline ``scripted:demo`` model drives a full run: sandboxed Python, a GET, an approved POST."""

from __future__ import annotations

import asyncio
import uuid

from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from tests.conftest import WorkerFactory, require_bwrap, with_settings
from tests.fakes.http_sink import HttpSink
from workflows.agent import AgentWorkflow
from workflows.types import AgentInput, ApproveSignal


async def test_scripted_demo_end_to_end(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory
) -> None:
    require_bwrap()
    rt = with_settings(runtime, model="scripted:demo")
    with HttpSink() as sink:
        async with run_worker(dev_env.client, rt) as tq:
            handle = await dev_env.client.start_workflow(
                AgentWorkflow.run,
                AgentInput(task=f"Compute prime statistics, check stock at {sink.url}/inventory and reserve one."),
                id=f"demo-{uuid.uuid4().hex[:8]}",
                task_queue=tq,
            )
            for _ in range(300):
                view = await handle.query(AgentWorkflow.status)
                if view.pending_approvals:
                    break
                await asyncio.sleep(0.05)
            [approval] = view.pending_approvals
            assert approval.args == {
                "method": "POST",
                "url": f"{sink.url}/inventory/reservations",
                "headers": None,
                "json": {"quantity": 1},
                "body": None,
            }
            assert view.model == "scripted:demo"
            await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=approval.approval_id, reviewer="demo"))
            result = await handle.result()
    assert result.status == "completed" and result.steps == 4
    assert "primes below 60: 17, mean 25.88, largest 59" in result.output
    assert [(r.method, r.path) for r in sink.received] == [("GET", "/inventory"), ("POST", "/inventory/reservations")]
    assert sink.received[1].headers["idempotency-key"].startswith("ik_")
