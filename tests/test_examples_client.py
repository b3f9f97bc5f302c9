"""``examples/client/inbox.py`` run for real: a dev server, ``worker.py`` on ``scripted:demo``, the script.

The script starts a run through ``AgentClient``, follows its events, approves the reservation it asks
for, and reads its result and transcript; the events it prints are every progress event in order,
and the run's history holds no stream-poll update (following it added nothing).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from tests.conftest import require_bwrap
from tests.fakes.worker_proc import ROOT, WorkerProc
from tests.test_examples import example_env, run_example


async def test_the_client_example_follows_a_run_and_approves_its_call(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    require_bwrap()
    address = dev_env.client.service_client.config.target_host
    env = example_env(
        tmp_path,
        TEMPORAL_ADDRESS=address,
        AGENT_TASK_QUEUE=f"ex-client-{uuid.uuid4().hex[:8]}",
        AGENT_MODEL="scripted:demo",
        AGENT_HTTP_ALLOW="127.0.0.1:1024-65535",
    )
    run_id = f"inbox-{uuid.uuid4().hex[:8]}"
    worker = WorkerProc(env, tmp_path / "worker.log")
    try:
        # The worker is another process; nothing on this loop waits.
        run = run_example("examples.client.inbox", "--id", run_id, env=env, worker=worker)
        lines = run.stdout.splitlines()
        assert lines[0] == f"run {run_id} started", run.stdout
        events = [line.split(": ", 1) for line in lines if line.startswith("event ")]
        assert [number for number, _ in events] == [f"event {n}" for n in range(1, len(events) + 1)], run.stdout
        kinds = [kind for _, kind in events]
        assert kinds[0] == "started" and kinds[-1] == "finished" and "approval_requested" in kinds, run.stdout
        approving = [line for line in lines if line.startswith("approving ")]
        assert len(approving) == 1 and approving[0].startswith("approving http_request POST http://127.0.0.1:")
        assert approving[0].endswith("/reservations"), run.stdout
        assert "result: completed" in lines, run.stdout
        assert "tool call: http_request ok=True" in lines, run.stdout
        assert worker.alive(), worker.tail()
    finally:
        code = worker.stop()
    assert code == 0, worker.tail()
    updates = [
        event.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
        async for event in dev_env.client.get_workflow_handle(run_id).fetch_history_events()
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    ]
    assert updates == ["decide"], updates  # the approval; no __temporal_workflow_stream_poll


def test_the_front_ends_page_shows_the_example_as_it_is() -> None:
    page = (ROOT / "docs" / "front-ends.md").read_text(encoding="utf-8")
    section = page.split("## The Python client", 1)[1]
    shown = section.split("```python\n", 1)[1].split("```", 1)[0]
    source = (ROOT / "examples" / "client" / "inbox.py").read_text(encoding="utf-8")
    assert shown.strip() and shown in source, shown  # the whole main(), character for character
