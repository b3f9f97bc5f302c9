"""A decision signal that lands in the same workflow task as the model turn that opens its approval.

A reviewer can see an approval before the task that opens it is in history (a query answered by a worker
that is then lost), and approve it by signal; the server hands that signal to the next worker in the same
task as the turn's result. The SDK runs signal handlers before it resolves the turn's activity, so the
approval is not open yet when the decision is handled: the run must still take it.

The test makes that task for real: the model's reply is held while the only workflow worker is shut
down, so the turn completes with nobody to run the next task; the signal goes in; a new worker runs the
task holding both.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.plugin import SimplePlugin
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from activities.runtime import Runtime
from durable_agents.plugin import DurableAgentsPlugin
from tests.conftest import start_agent
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually
from worker import build_worker
from workflows.agent import AgentWorkflow
from workflows.approval_handlers import EARLY_DECISION_PATCH
from workflows.identity import approval_id
from workflows.types import ApproveSignal, ModelTurn, RejectSignal, StatusView

WORKFLOW_ID_PREFIX = "early"


def activity_worker(client: Client, runtime: Runtime, task_queue: str) -> Worker:
    """The plugin's activities alone: this worker never runs a workflow task."""
    drop_workflows = SimplePlugin("tests.activities-only", workflows=lambda _existing: [])
    plugin = DurableAgentsPlugin(runtime=runtime, search_attributes=False)
    return Worker(client, task_queue=task_queue, plugins=[plugin, drop_workflows])


async def history_events(handle: WorkflowHandle[Any, Any]) -> list[Any]:
    return list((await handle.fetch_history()).events)


async def turn_completed(handle: WorkflowHandle[Any, Any]) -> ModelTurn | None:
    """The first model turn's result, once it is in history."""
    for event in await history_events(handle):
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            payloads = event.activity_task_completed_event_attributes.result.payloads
            turn = pydantic_data_converter.payload_converter.from_payloads(payloads, [ModelTurn])[0]
            if isinstance(turn, ModelTurn) and turn.tool_calls:
                return turn
    return None


def task_of(events: list[Any], wanted: EventType.ValueType) -> int:
    """How many workflow tasks had started before the first event of type ``wanted``."""
    started = 0
    for event in events:
        if event.event_type == wanted:
            return started
        started += event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
    raise AssertionError(f"no {wanted} in history")


async def test_a_decision_in_the_task_that_opens_its_approval_is_taken(
    dev_env: WorkflowEnvironment, runtime: Runtime, llm: FakeLLMServer, tmp_path: Any
) -> None:
    client = dev_env.client
    with HttpSink() as sink:
        gate = threading.Event()
        order = json.dumps({"method": "POST", "url": f"{sink.url}/orders", "json": {"sku": 7}})
        llm.enqueue(Scripted(tool_calls=[("http_request", order)], hold=gate), Scripted(text="ordered"))
        task_queue = f"test-early-{tmp_path.name[-12:]}"
        async with activity_worker(client, runtime, task_queue):
            first = build_worker(
                client, runtime, task_queue=task_queue, no_remote_activities=True, max_cached_workflows=0
            )
            async with first:
                handle = await start_agent(client, task_queue, id_prefix=WORKFLOW_ID_PREFIX, task="order sku 7")
                await eventually(lambda: llm.requests, "the model was asked")
            # No workflow worker now: the turn's result schedules a task nobody runs yet.
            gate.set()
            turn = await eventually(lambda: turn_completed(handle), "the turn's result is in history")
            call = turn.tool_calls[0]
            aid = approval_id(handle.id, 1, call.id, call.name, call.arguments)
            await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=aid, reviewer="alice"))
            events = await history_events(handle)
            # The signal and the turn's result are in the same, not yet started, workflow task.
            assert task_of(events, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED) == task_of(
                events, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
            )
            second = build_worker(
                client, runtime, task_queue=task_queue, no_remote_activities=True, max_cached_workflows=0
            )
            async with second:
                view = await eventually(lambda: refused(handle, "unknown_approval"), "the new worker ran the task")
                # Refused as unknown when its handler ran (counted), and decided in that same task all the same.
                assert view.pending_approvals == [] and view.decisions[-1].decision == "approved", view
                result = await handle.result()
    assert result.status == "completed" and result.output == "ordered"
    assert [json.loads(w.body) for w in sink.writes()] == [{"sku": 7}]  # the approved call ran, once
    history = await handle.fetch_history()
    markers = [
        e.marker_recorded_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    ]
    assert any(EARLY_DECISION_PATCH.encode() in m.SerializeToString() for m in markers)  # taken under its patch
    # The run's history replays with the workflow as it is.
    await Replayer(workflows=[AgentWorkflow], data_converter=pydantic_data_converter).replay_workflow(history)


async def test_a_decision_for_an_approval_that_opens_later_is_not_taken(
    dev_env: WorkflowEnvironment, runtime: Runtime, llm: FakeLLMServer, tmp_path: Any
) -> None:
    """Knowing a coming approval's id (ids are derived, not secret) must not pre-approve it."""
    client = dev_env.client
    with HttpSink() as sink:
        gate = threading.Event()
        # Canonical arguments (as the tool's model fills them in): what the approval id is derived from.
        arguments = {"method": "POST", "url": f"{sink.url}/orders", "headers": None, "json": {"sku": 8}, "body": None}
        llm.enqueue(
            Scripted(tool_calls=[("http_request", json.dumps(arguments))], hold=gate), Scripted(text="not ordered")
        )
        task_queue = f"test-early-later-{tmp_path.name[-12:]}"
        async with (
            activity_worker(client, runtime, task_queue),
            build_worker(client, runtime, task_queue=task_queue, no_remote_activities=True),
        ):
            handle = await start_agent(client, task_queue, id_prefix=WORKFLOW_ID_PREFIX, task="order sku 8")
            # The reply is made (and held): the call's id in it gives the coming approval's id.
            reply = await eventually(lambda: llm.requests and llm.requests[0].get("reply"), "the reply is made")
            call_id = re.search(r'"id": "(call_\d+)"', reply)
            assert call_id is not None, reply
            aid = approval_id(handle.id, 1, call_id.group(1), "http_request", arguments)
            await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=aid, reviewer="mallory"))
            await eventually(lambda: refused(handle, "unknown_approval"), "the early decision was refused")
            gate.set()
            view = await eventually(lambda: opened_or_ran(handle, sink), "the approval is open (or the call ran)")
            assert sink.writes() == [] and [p.approval_id for p in view.pending_approvals] == [aid]
            reject = RejectSignal(approval_id=aid, reviewer="bob", reason="not asked for")
            await handle.signal(AgentWorkflow.reject, reject)
            result = await handle.result()
    assert result.status == "completed" and result.output == "not ordered"
    assert sink.writes() == []  # mallory's decision, sent before the approval opened, approved nothing


async def refused(handle: WorkflowHandle[Any, Any], kind: str) -> StatusView | None:
    view: StatusView = await handle.query(AgentWorkflow.status)
    return view if view.refused_counts.get(kind, 0) >= 1 else None


async def opened_or_ran(handle: WorkflowHandle[Any, Any], sink: HttpSink) -> StatusView | None:
    view: StatusView = await handle.query(AgentWorkflow.status)
    return view if view.pending_approvals or sink.writes() else None
