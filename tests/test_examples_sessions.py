"""``examples/sessions/chat.py`` run for real: a dev server, ``worker.py`` on ``scripted:demo``, the script.

The example starts a session, sends two messages with the ``send`` update (and message 2 again: one
message), reads ``status``, closes the session and wakes it with update-with-start; its output shows
each step, and the session's history shows two executions under one id on one conversation.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from tests.conftest import require_bwrap
from tests.fakes.worker_proc import WorkerProc
from tests.test_examples import example_env, run_example
from tests.waiting import eventually

SANDBOX_SAID = "    - sandboxed Python said: primes below 60: 17, mean 25.88, largest 59"


async def test_sessions_example_sends_closes_and_wakes(dev_env: WorkflowEnvironment, tmp_path: Path) -> None:
    require_bwrap()
    address = dev_env.client.service_client.config.target_host
    env = example_env(
        tmp_path,
        TEMPORAL_ADDRESS=address,
        AGENT_TASK_QUEUE=f"ex-sessions-{uuid.uuid4().hex[:8]}",
        AGENT_MODEL="scripted:demo",
    )
    session_id = f"chat-{uuid.uuid4().hex[:8]}"
    worker = WorkerProc(env, tmp_path / "worker.log")
    try:
        # The worker is another process; nothing on this loop waits.
        run = run_example("examples.sessions.chat", "--id", session_id, env=env, worker=worker)
        assert run.stdout.splitlines() == [
            f"session {session_id} started",
            "send m1: accepted=True seq=1 duplicate=False",
            "reply 1:",
            "    Done. Here is what I found:",
            SANDBOX_SAID,
            "send m2: accepted=True seq=2 duplicate=False",
            "reply 2:",
            "    Message 2: from earlier in this conversation:",
            SANDBOX_SAID,
            "    (you asked: Which of them is the largest?)",
            "send m2: accepted=True seq=2 duplicate=True",
            "status: state=idle messages=2 replied=2 queued=0",
            "closed: completed",
            "send m3 (update-with-start): accepted=True seq=3",
            "reply 3 (the woken session):",
            "    Message 3: from earlier in this conversation:",
            SANDBOX_SAID,
            "    (you asked: Remind me what you found.)",
            "closed again: completed",
        ], run.stdout

        # Two executions under the session's one id: the first closed, the woken one closed after message 3.
        async def executions() -> list[str] | None:
            found = [wf.workflow_type async for wf in dev_env.client.list_workflows(f"WorkflowId = '{session_id}'")]
            return found if len(found) == 2 else None

        assert await eventually(executions, "both executions listed") == ["AgentWorkflow", "AgentWorkflow"]
        assert worker.alive(), worker.tail()
    finally:
        code = worker.stop()
    assert code == 0, worker.tail()
