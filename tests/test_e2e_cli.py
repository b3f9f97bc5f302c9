"""End to end: ``worker.py`` as a real process, driven by ``starter.py`` and by the ``temporal`` CLI."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.conftest import TEMPORAL_CLI
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually_sync

ROOT = Path(__file__).resolve().parent.parent
API_KEY = "sk-e2e-SECRET-0123456789"


def decoded_payloads(node: Any) -> Iterator[str]:
    """Every payload ``data`` field of a JSON history, base64-decoded."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "data" and isinstance(value, str):
                yield base64.b64decode(value).decode(errors="replace")
            else:
                yield from decoded_payloads(value)
    elif isinstance(node, list):
        for item in node:
            yield from decoded_payloads(item)


class Cli:
    def __init__(self, env: dict[str, str], address: str) -> None:
        self.env = env
        self.address = address

    def starter(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(ROOT / "starter.py"), *args],
            env=env or self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def start_run(self, workflow_id: str, input_json: str) -> subprocess.CompletedProcess[str]:
        """``temporal workflow start`` of an AgentWorkflow on this worker's task queue."""
        return self.temporal(
            "workflow", "start", "--type", "AgentWorkflow", "--task-queue", self.env["AGENT_TASK_QUEUE"],
            "--workflow-id", workflow_id, "--input", input_json,
        )  # fmt: skip

    def temporal(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(TEMPORAL_CLI), *args, "--address", self.address],
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture
def worker_env(dev_env: WorkflowEnvironment, llm: FakeLLMServer, tmp_path: Path) -> Iterator[tuple[Cli, Path]]:
    address = dev_env.client.service_client.config.target_host
    env = {
        "PATH": os.environ["PATH"],
        "TEMPORAL_ADDRESS": address,
        "AGENT_TASK_QUEUE": f"e2e-{uuid.uuid4().hex[:8]}",
        "AGENT_MODEL": "openai:test-model",
        "OPENAI_BASE_URL": llm.openai_url,
        "OPENAI_API_KEY": API_KEY,
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "AGENT_LOG_LEVEL": "DEBUG",
        "AGENT_HTTP_ALLOW": "127.0.0.1:9",  # so that a POST there is asked for (outside the list it is refused)
    }
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        worker = subprocess.Popen(
            [sys.executable, str(ROOT / "worker.py")], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            yield Cli(env, address), log_path
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=30) == 0, log_path.read_text()[-2000:]


def test_starter_runs_and_reports(worker_env: tuple[Cli, Path], llm: FakeLLMServer) -> None:
    cli, log_path = worker_env
    llm.enqueue(Scripted(tool_calls=[("write_file", '{"path": "n.txt", "content": "42"}')]), Scripted(text="all done"))
    run = cli.starter("run", "write a number", "--id", "e2e-starter", "--wait", "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["workflow_id"] == "e2e-starter"
    assert result["status"] == "completed" and result["output"] == "all done" and result["steps"] == 2

    status = cli.starter("status", "e2e-starter", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "completed"

    listing = cli.starter("list", "--json")
    assert "e2e-starter" in [row["workflow_id"] for row in json.loads(listing.stdout)]

    # The API key reached the provider as a header but never a log line nor workflow history.
    assert llm.requests[0]["headers"]["authorization"] == f"Bearer {API_KEY}"
    history = cli.temporal("workflow", "show", "--workflow-id", "e2e-starter", "--output", "json")
    assert history.returncode == 0, history.stderr
    decoded = "\n".join(decoded_payloads(json.loads(history.stdout)))
    assert "all done" in decoded  # the decoding works: the final answer is in the result payload
    assert API_KEY not in decoded and API_KEY not in history.stdout
    assert API_KEY not in log_path.read_text()


def test_temporal_cli_with_defaults_only_task(worker_env: tuple[Cli, Path], llm: FakeLLMServer) -> None:
    cli, _ = worker_env
    started = cli.start_run("e2e-cli", '{"task": "say hi"}')
    assert started.returncode == 0, started.stderr
    result = cli.temporal("workflow", "result", "--workflow-id", "e2e-cli", "--output", "json")
    assert result.returncode == 0, result.stderr
    assert '"status": "completed"' in result.stdout.replace('":"', '": "')

    def answered() -> subprocess.CompletedProcess[str] | None:  # the query needs the worker; closed runs answer too
        query = cli.temporal("workflow", "query", "--workflow-id", "e2e-cli", "--name", "status", "--output", "json")
        assert query.returncode == 0, query.stderr
        return query

    query = eventually_sync(answered, "the status query of e2e-cli is answered", every_s=0.2)
    assert '"completed"' in query.stdout


def test_starter_errors_are_one_line(worker_env: tuple[Cli, Path]) -> None:
    cli, _ = worker_env
    unknown = cli.starter("status", "no-such-run")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == "error: no run with id 'no-such-run'"

    bad = cli.starter("run", "x", "--max-steps", "zero")
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1 and "--max-steps" in bad.stderr

    down = cli.starter("list", env={**cli.env, "TEMPORAL_ADDRESS": "127.0.0.1:1"})
    assert down.returncode == 2
    assert len(down.stderr.strip().splitlines()) == 1 and "cannot reach Temporal at 127.0.0.1:1" in down.stderr

    misconfigured = cli.starter("list", env={**cli.env, "AGENT_LOG_LEVEL": "loud"})
    assert misconfigured.returncode == 2
    assert misconfigured.stderr.strip().splitlines() == [
        "error: AGENT_LOG_LEVEL='loud': expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL"
    ]

    not_running = cli.starter("cancel", "no-such-run")
    assert not_running.returncode == 1 and "no run with id" in not_running.stderr


def test_bad_input_and_bad_signals_are_refused_cleanly(worker_env: tuple[Cli, Path], llm: FakeLLMServer) -> None:
    cli, _ = worker_env
    # A start without `task` fails the run at once with the reason (it does not retry a task forever).
    started = cli.start_run("e2e-bad-input", '{"tsk": "typo"}')
    assert started.returncode == 0, started.stderr
    result = cli.temporal("workflow", "result", "--workflow-id", "e2e-bad-input")
    assert result.returncode != 0
    assert "invalid run input: tsk: unknown key 'tsk' (did you mean 'task'?)" in result.stdout + result.stderr

    # A malformed signal is dropped and logged; the run goes on and completes.
    llm.enqueue(Scripted(tool_calls=[("http_request", '{"method": "POST", "url": "http://127.0.0.1:9/x"}')]))
    llm.enqueue(Scripted(text="finished anyway"))
    cli.start_run("e2e-bad-signal", '{"task": "post something"}')

    def waiting() -> list[dict[str, Any]]:
        query = cli.temporal("workflow", "query", "--workflow-id", "e2e-bad-signal", "--name", "status", "-o", "json")
        assert query.returncode == 0, query.stderr
        found: list[dict[str, Any]] = json.loads(query.stdout)["queryResult"][0]["pending_approvals"]
        return found

    pending = eventually_sync(waiting, "the POST waits for approval", every_s=0.2)
    garbage = cli.temporal(
        "workflow", "signal", "--workflow-id", "e2e-bad-signal", "--name", "approve", "--input", '{"reviewer": 7}'
    )
    assert garbage.returncode == 0  # Temporal accepts the signal; the workflow refuses it
    reject = cli.temporal(
        "workflow", "signal", "--workflow-id", "e2e-bad-signal", "--name", "reject",
        "--input", json.dumps({"approval_id": pending[0]["approval_id"], "reviewer": "alice", "reason": "no"}),
    )  # fmt: skip
    assert reject.returncode == 0
    final = cli.temporal("workflow", "result", "--workflow-id", "e2e-bad-signal", "-o", "json")
    assert final.returncode == 0 and "finished anyway" in final.stdout
