"""Sub-agents survive a SIGKILLed worker: no child starts twice, no side effect is applied twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from tests.fakes.dedupe_server import DedupeServer
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.fakes.worker_proc import task_of
from tests.test_crash_recovery import Rig, wait_for
from workflows.types import AgentInput, AgentResult

PARENT_TASK = "buy both items"


def buying_model(api_url: str) -> Any:
    def reply(body: dict[str, Any]) -> Scripted:
        messages = body.get("messages", [])
        results = [str(m.get("content")) for m in messages if m.get("role") == "tool"]
        task = task_of(body)
        if task == PARENT_TASK:
            if results:
                return Scripted(text=" | ".join(results))
            return Scripted(tool_calls=[("buyer", json.dumps({"task": f"buy {item}"})) for item in ("A", "B")])
        item = task.split()[-1]
        if results:
            return Scripted(text=f"bought {item}")
        order = {"method": "POST", "url": f"{api_url}/orders/{item}", "json": {"sku": item}}
        return Scripted(tool_calls=[("http_request", json.dumps(order))])

    return reply


async def test_killed_worker_while_two_children_run_completes_the_tree_once(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    subagents = tmp_path / "subagents.json"
    subagents.write_text(json.dumps({"buyer": {"description": "Buys one item.", "tools": ["http_request"]}}))
    with DedupeServer() as api, FakeLLMServer() as llm:
        api.add_delay(after_s=8, method="POST", path_prefix="/orders", times=2)
        llm.default = buying_model(api.url)
        address = dev_env.client.service_client.config.target_host
        rig = Rig(dev_env.client, address, llm, tmp_path)
        try:
            first = await rig.spawn(AGENT_SUBAGENTS_FILE=str(subagents))
            handle = await dev_env.client.start_workflow(
                "AgentWorkflow",
                AgentInput(task=PARENT_TASK),
                id=f"{rig.task_queue}-parent",
                task_queue=rig.task_queue,
                result_type=AgentResult,
            )
            # Both children are mid-call: each POST reached the destination, neither got its answer.
            await wait_for(
                api, lambda: len(api.applied("/orders/A")) == 1 and len(api.applied("/orders/B")) == 1, "both orders"
            )
            first.kill()
            await rig.spawn(AGENT_SUBAGENTS_FILE=str(subagents))
            result = await rig.result(handle)
        finally:
            rig.stop_all()

        assert result.status == "completed", rig.logs()
        assert result.output == "bought A | bought B"
        history = await handle.fetch_history()
        started = [
            e.start_child_workflow_execution_initiated_event_attributes.workflow_id
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
        ]
        assert started == [f"{handle.id}/buyer/s1c0", f"{handle.id}/buyer/s1c1"]
        for child_id in started:  # each child ran exactly once (one execution of its id)
            runs = [wf async for wf in dev_env.client.list_workflows(f"WorkflowId = '{child_id}'")]
            assert len(runs) == 1, runs
        assert len(api.applied("/orders/A")) == 1 and len(api.applied("/orders/B")) == 1
