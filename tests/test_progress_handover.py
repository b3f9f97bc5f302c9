"""Continue-as-new hands the progress stream over only after running handlers finished.

A handler that is still running when the loop decides to continue as new (a decision
whose signature is being checked, for example) may publish an event; that event must
reach the next run's stream, not be dropped with the old run.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow
from temporalio.contrib.workflow_streams import WorkflowStreamClient, WorkflowStreamState
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from workflows.progress import TOPIC, ProgressEvent, Reporter


class ProbeInput(BaseModel):
    stream: WorkflowStreamState | None = None


@workflow.defn(name="HandoverProbe")
class HandoverProbe:
    @workflow.init
    def __init__(self, inp: ProbeInput) -> None:
        self._reporter = Reporter(inp.stream)
        self._handler_started = False

    @workflow.signal
    async def slow_decision(self) -> None:
        self._handler_started = True
        await workflow.sleep(timedelta(milliseconds=300))  # still running when the hand-over starts
        self._reporter.publish("decision_refused", 1, "published by a handler during the hand-over")

    @workflow.run
    async def run(self, inp: ProbeInput) -> int:
        if inp.stream is not None:
            self._reporter.publish("finished", 1, "next run")
            return len(inp.stream.log)
        await workflow.wait_condition(lambda: self._handler_started)
        self._reporter.publish("continued_as_new", 1, "continuing as new")
        state = await self._reporter.hand_over()
        workflow.continue_as_new(ProbeInput(stream=state))


async def test_event_published_by_a_running_handler_survives_continue_as_new(dev_env: WorkflowEnvironment) -> None:
    client = dev_env.client
    task_queue = f"handover-{uuid.uuid4().hex[:8]}"
    workflow_id = f"handover-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=task_queue, workflows=[HandoverProbe]):
        handle = await client.start_workflow(HandoverProbe.run, ProbeInput(), id=workflow_id, task_queue=task_queue)
        await handle.signal(HandoverProbe.slow_decision)
        carried = await client.get_workflow_handle(workflow_id, result_type=int).result()
        texts = []
        stream = WorkflowStreamClient.create(client, workflow_id)
        async for item in stream.subscribe(TOPIC, 0, result_type=ProgressEvent):
            texts.append(item.data.text)
            if item.data.kind == "finished":
                break
    assert carried == 2, "both events of the first run were carried into the next one"
    assert texts == ["continuing as new", "published by a handler during the hand-over", "next run"]
