"""A status read while the server refuses queries for a moment still answers.

The server refuses every query with ``WorkflowNotReady`` while a run's workflow task is on
a retry (attempt > 1). A worker's failed task puts it there, and so does the server itself
when it force-closes a task because more than 100 signals arrived while a worker held it (a
signal flood: seen failing the junk-signals test's status query on a busy machine). The
next attempt usually completes moments later; ``ask_status`` asks again until its timeout
instead of calling the run stuck at the first refusal.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import timedelta

from temporalio import workflow
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from durable_agents.cli.common import ask_status, workflow_not_ready
from tests.waiting import eventually

FAILING = threading.Event()  # set: every attempt of the run's workflow task fails


@workflow.defn(name="FirstTaskFails")
class FirstTaskFails:
    """Fails its workflow task while ``FAILING`` is set; then waits for ever and answers ``status``."""

    @workflow.run
    async def run(self) -> None:
        if FAILING.is_set():
            raise RuntimeError("this attempt of the task fails")
        await workflow.wait_condition(lambda: False)

    @workflow.query(name="status")
    def status(self) -> dict[str, object]:
        return {"state": "running", "step": 7}


async def not_ready(handle: object) -> bool:
    try:
        await handle.query("status", rpc_timeout=timedelta(seconds=5))  # type: ignore[attr-defined]
    except RPCError as err:
        return workflow_not_ready(err)
    return False


def worker(client: Client, task_queue: str) -> Worker:
    return Worker(
        client, task_queue=task_queue, workflows=[FirstTaskFails], workflow_runner=UnsandboxedWorkflowRunner()
    )


async def test_status_waits_out_a_workflow_task_retry(dev_env: WorkflowEnvironment) -> None:
    client = dev_env.client
    task_queue = f"not-ready-{uuid.uuid4().hex[:8]}"
    FAILING.set()
    async with worker(client, task_queue):
        handle = await client.start_workflow(
            FirstTaskFails.run, id=f"not-ready-{uuid.uuid4().hex[:8]}", task_queue=task_queue
        )

        async def retried() -> bool:
            return (await handle.describe()).raw_description.pending_workflow_task.attempt >= 2

        await eventually(retried, "the workflow task fails and is retried")
    FAILING.clear()
    # No worker now: the retry waits, and the server refuses queries meanwhile.
    await eventually(lambda: not_ready(handle), "the server refuses the query (task attempt 2)")
    desc = await handle.describe()
    asking = asyncio.ensure_future(ask_status(client, handle, desc, query_timeout=timedelta(seconds=60)))
    try:
        await eventually(lambda: not_ready(handle), "the server still refuses the query")
        assert not asking.done()
        async with worker(client, task_queue):
            view = await asyncio.wait_for(asking, timeout=60)
            await handle.terminate()
    finally:
        asking.cancel()
    assert view.state == "running" and view.step == 7
