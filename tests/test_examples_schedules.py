"""``examples/schedules/morning.py`` run for real: a dev server, ``worker.py`` on the example's echo model, the script.

The example creates a task schedule and a session schedule, fires both with ``trigger``, pauses one,
describes and deletes both; afterwards the server has the runs they started and no schedule left.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from tests.fakes.worker_proc import WorkerProc
from tests.test_examples import example_env, run_example
from tests.waiting import eventually


async def test_schedules_example_fires_both_schedules_and_deletes_them(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    address = dev_env.client.service_client.config.target_host
    env = example_env(tmp_path, TEMPORAL_ADDRESS=address, AGENT_TASK_QUEUE=f"ex-sched-{uuid.uuid4().hex[:8]}")
    name = f"morning-{uuid.uuid4().hex[:8]}"
    worker = WorkerProc(env, tmp_path / "worker.log")
    try:
        run = run_example("examples.schedules.morning", "--name", name, env=env, worker=worker)
        assert run.stdout.splitlines() == [
            f"created {name} (task): cron '0 9 * * 1-5', next runs at 09:00 UTC: True",
            f"created {name}-chat (session): messages session {name}-chat",
            f"the triggered run of {name}: completed: echo: Good morning: what should I check first?",
            f"session {name}-chat took the scheduled message as message 1",
            f"session {name}-chat replied: echo: Daily check-in: anything new?",
            f"{name}: paused=True runs=1 skipped=0",
            f"{name}-chat: paused=False runs=1 skipped=0",
            "deleted both schedules; their runs stay in the history",
        ], run.stdout
        for schedule_id in (f"agent-schedule-{name}", f"agent-schedule-{name}-chat"):
            with pytest.raises(RPCError):
                await dev_env.client.get_schedule_handle(schedule_id).describe()

        async def session_runs() -> list[str] | None:
            found = [wf.workflow_type async for wf in dev_env.client.list_workflows(f"WorkflowId = '{name}-chat'")]
            return found or None

        assert await eventually(session_runs, "the session is listed") == ["AgentWorkflow"]
        assert worker.alive(), worker.tail()
    finally:
        code = worker.stop()
    assert code == 0, worker.tail()
