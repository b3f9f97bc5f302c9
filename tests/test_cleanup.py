"""Cleanup at the end of a run: each step runs on its own, so one failure never skips the next."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.runtime import Runtime
from durable_agents.plugin import all_activities
from tests.conftest import require_bwrap, start_agent
from tests.fakes.llm_server import FakeLLMServer, Scripted
from workflows.agent import AgentWorkflow
from workflows.identity import sandbox_id_for
from workflows.types import Limits, TranscriptEntry


@activity.defn(name="transcript_append")
async def failing_transcript_append(conversation_id: str, entries: list[TranscriptEntry]) -> None:
    raise ApplicationError("the run store is down", non_retryable=True)


async def test_failed_transcript_append_still_kills_the_sandbox(
    dev_env: WorkflowEnvironment, runtime: Runtime, llm: FakeLLMServer
) -> None:
    require_bwrap()
    # Turn 1 creates the sandbox (write_file) and leaves a workflow-made entry (the unknown
    # tool's error) to store at cleanup; max_steps=1 then ends the run.
    llm.enqueue(
        Scripted(tool_calls=[("write_file", json.dumps({"path": "a.txt", "content": "x"})), ("nope", "{}")]),
    )
    activities = [a for a in all_activities(runtime) if getattr(a, "__name__", "") != "transcript_append"]
    task_queue = f"cleanup-{uuid.uuid4().hex[:8]}"
    async with Worker(
        dev_env.client,
        task_queue=task_queue,
        workflows=[AgentWorkflow],
        activities=[*activities, failing_transcript_append],
    ):
        handle = await start_agent(dev_env.client, task_queue, limits=Limits(max_steps=1))
        result = await handle.result()
        history = await handle.fetch_history()

    assert result.status == "limit_exceeded"
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert "transcript_append" in scheduled and scheduled[-1] == "sandbox_kill", scheduled
    first_run_id = history.events[0].workflow_execution_started_event_attributes.original_execution_run_id
    sandbox = Path(runtime.settings.state_dir) / "sandboxes" / sandbox_id_for(f"{handle.id}/{first_run_id}")
    assert not sandbox.exists(), "the sandbox was killed although storing the final results failed"
