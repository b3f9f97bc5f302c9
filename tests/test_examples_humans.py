"""``examples/humans/review.py`` run for real: a dev server, ``worker.py`` on ``scripted:demo``, the script.

The script answers the model's question (2 units) and approves the reservation edited to 3 units with
``remember: call``; the shop it serves sees exactly one POST, of the edited body, and the run's audit
lists the answer and the edited approval.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from tests.fakes.worker_proc import WorkerProc
from tests.test_examples import example_env, run_example


async def test_the_review_example_answers_a_question_and_approves_an_edited_call(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    address = dev_env.client.service_client.config.target_host
    env = example_env(
        tmp_path,
        TEMPORAL_ADDRESS=address,
        AGENT_TASK_QUEUE=f"ex-humans-{uuid.uuid4().hex[:8]}",
        AGENT_MODEL="scripted:demo",
        AGENT_HTTP_ALLOW="127.0.0.1:1024-65535",
    )
    run_id = f"review-{uuid.uuid4().hex[:8]}"
    worker = WorkerProc(env, tmp_path / "worker.log")
    try:
        # The worker is another process; nothing on this loop waits.
        run = run_example("examples.humans.review", "--id", run_id, env=env, worker=worker)
        lines = run.stdout.splitlines()
        assert lines[:3] == [
            f"run {run_id} started",
            "state: waiting_human",
            "question q_…: How many units should I reserve? options=['1', '2', '3']",
        ], run.stdout
        assert lines[3].startswith("answer: answered by dana"), run.stdout
        assert lines[4] == "approval wanted: http_request POST json={'quantity': 2}", run.stdout  # the answer
        assert lines[5].startswith("approve: approved by dana with edited arguments; remembered for identical")
        assert lines[6:] == [
            "result: completed",
            "audit: question answered by dana",
            'audit: tool_call approved by dana edits={"quantity": 3} remember=remembered for identical calls',
            "shop received: {'quantity': 3} (key ik_…)",
        ], run.stdout
        assert worker.alive(), worker.tail()
    finally:
        code = worker.stop()
    assert code == 0, worker.tail()
