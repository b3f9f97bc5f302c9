"""A long session's history stays bounded per run and linear in total (continue-as-new between messages).

300 messages, each answered after one tool call whose output is 10 KB. Every run of the
continue-as-new chain must stay under 1 MB of history, and the chain's total after 300 messages
must be less than 3.5 times its total after 100. The harness we compare with keeps one run and
re-sends the conversation: its history grew 19 times for 5 times the messages.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistoryEventFilterType
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.settings import ExtensionSettings
from tests.conftest import TEST_TOOLS, WorkerFactory, with_settings
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.fakes.session_tools import BULKY_BYTES
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.session_types import SendResult, SessionMessage, SessionSpec
from workflows.types import AgentInput, StatusView

MESSAGES = 300
FIRST_TALLY = 100
RUN_HISTORY_MAX = 1024 * 1024
GROWTH_MAX = 3.5


def read_then_answer(body: dict[str, Any]) -> Scripted:
    """Each message: one 10 KB read, then a reply naming the message (decided by the transcript)."""
    messages = body["messages"]
    number = sum(1 for m in messages if m["role"] == "user")
    if messages[-1]["role"] == "tool":
        return Scripted(text=f"reply {number}")
    return Scripted(tool_calls=[("bulky_read", json.dumps({"label": str(number)}))])


async def chain_sizes(client: Client, workflow_id: str, first_run_id: str) -> list[int]:
    """History size in bytes of every run of the chain, first to current (closed runs name their successor)."""
    sizes: list[int] = []
    run_id = first_run_id
    while run_id:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        info = (await handle.describe()).raw_description.workflow_execution_info
        sizes.append(info.history_size_bytes)
        run_id = ""
        if info.HasField("close_time"):
            async for event in handle.fetch_history_events(
                event_filter_type=WorkflowHistoryEventFilterType.CLOSE_EVENT
            ):
                if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                    run_id = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return sizes


# A hang guard, not a speed bound: 300 messages (600 model turns) take several minutes beside five other
# xdist workers on two cores, more than the suite's default 300 s.
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("cache_mode", ["cached"], indirect=True)
async def test_300_messages_with_10_kb_tool_outputs_keep_history_linear(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = read_then_answer
    tools = ExtensionSettings(tool_modules=(TEST_TOOLS, "tests.fakes.session_tools"))
    runtime = with_settings(runtime, extensions=tools)
    client = dev_env.client
    workflow_id = f"long-s-{uuid.uuid4().hex[:8]}"
    tallies: dict[int, list[int]] = {}
    async with run_worker(client, runtime) as tq:
        handle = await client.start_workflow(
            AgentWorkflow.run, AgentInput(session=SessionSpec()), id=workflow_id, task_queue=tq
        )
        first_run_id = handle.first_execution_run_id or handle.result_run_id or ""
        current = client.get_workflow_handle(workflow_id)  # follows the chain
        for seq in range(1, MESSAGES + 1):
            sent = await current.execute_update(
                "send", SessionMessage(message_id=f"m{seq}", text=f"message {seq}"), result_type=SendResult
            )
            assert sent.accepted and sent.seq == seq, sent

            async def answered(seq: int = seq) -> StatusView | None:
                view: StatusView = await current.query(AgentWorkflow.status)
                return view if view.replied >= seq and view.state == "idle" else None

            view = await eventually(answered, f"the reply to message {seq}", every_s=0.02)
            with llm._lock:  # the prompts grow with the conversation: keep only the latest
                del llm.requests[:-2]
            if seq in (FIRST_TALLY, MESSAGES):
                tallies[seq] = await chain_sizes(client, workflow_id, first_run_id)

    assert view.output == f"reply {MESSAGES}" and view.messages == MESSAGES
    last_prompt = llm.requests[-1]["body"]["messages"]
    assert sum(1 for m in last_prompt if m["role"] == "user") == MESSAGES  # one conversation across the chain
    tool_outputs = [m["content"] for m in last_prompt if m["role"] == "tool"]
    assert len(tool_outputs) == MESSAGES and all(len(t) == BULKY_BYTES for t in tool_outputs)

    runs = tallies[MESSAGES]
    early, late = sum(tallies[FIRST_TALLY]), sum(runs)
    print(
        f"\nsession history: {len(runs)} runs for {MESSAGES} messages; largest run {max(runs)} bytes; "
        f"total {early} bytes after {FIRST_TALLY} messages, {late} after {MESSAGES} "
        f"(ratio {late / early:.2f}); runs {runs}"
    )
    assert len(runs) >= 3, f"a long session continues as new between messages: {runs}"
    assert max(runs) < RUN_HISTORY_MAX, runs
    assert late / early < GROWTH_MAX, (early, late, runs)
