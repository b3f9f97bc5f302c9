"""The offline ``scripted:demo`` model drives a full run (sandboxed Python, a GET, an approved POST) and a session."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from tests.conftest import WorkerFactory, require_bwrap, with_settings
from tests.fakes.http_sink import HttpSink
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.session_types import SendResult, SessionMessage, SessionSpec
from workflows.types import AgentInput, ApproveSignal, StatusView


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


async def _replied(handle: WorkflowHandle[Any, Any], seq: int) -> StatusView:
    async def check() -> StatusView | None:
        view: StatusView = await handle.query(AgentWorkflow.status)
        return view if view.replied >= seq and view.state == "idle" else None

    return await eventually(check, f"the reply to message {seq}")


async def test_scripted_demo_answers_follow_up_messages_of_a_session(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory
) -> None:
    require_bwrap()
    rt = with_settings(runtime, model="scripted:demo")
    with HttpSink() as sink:
        async with run_worker(dev_env.client, rt) as tq:
            handle = await dev_env.client.start_workflow(
                AgentWorkflow.run,
                AgentInput(session=SessionSpec()),
                id=f"demo-s-{uuid.uuid4().hex[:8]}",
                task_queue=tq,
            )

            async def send(message_id: str, text: str) -> StatusView:
                sent = await handle.execute_update(
                    "send", SessionMessage(message_id=message_id, text=text), result_type=SendResult
                )
                assert sent.accepted, sent
                return await _replied(handle, sent.seq)

            # Message 1 plays the first-run plan: sandboxed Python, then the GET.
            first = await send("m1", f"Compute prime statistics and check the stock at {sink.url}/inventory.")
            assert "primes below 60: 17, mean 25.88, largest 59" in first.output
            assert '"n": 1' in first.output and first.step == 3
            # Message 2 asks to check again: a second GET, compared with message 1's.
            second = await send("m2", "Check it again, please.")
            assert second.output.startswith("Message 2: here is what I see now:")
            assert '"n": 2' in second.output and 'in message 1 it returned {"ok": true, "n": 1}' in second.output
            assert second.step == 5
            # Message 3 asks nothing to fetch: the answer comes from the earlier results of the conversation.
            third = await send("m3", "What did the sandbox say?")
            assert third.output.startswith("Message 3: from earlier in this conversation:")
            assert "sandboxed Python said: primes below 60: 17" in third.output
            assert "(you asked: What did the sandbox say?)" in third.output and third.step == 6
            await handle.signal("close")
            ended = await handle.result()
    assert ended.status == "completed" and ended.output == third.output
    assert [(r.method, r.path) for r in sink.received] == [("GET", "/inventory"), ("GET", "/inventory")]
