"""``starter.py pending`` without a run id lists every run that waits for an approval, however many runs run.

Each test gets a dev server of its own (they start in a fraction of a second), so
what ``pending`` lists can be compared exactly. Runs go through an in-process
worker and the fake LLM; the model asks for an ``http_request`` POST, which the
default policy holds for approval, or answers at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from tests.conftest import TEMPORAL_CLI, WorkerFactory, start_agent
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.progress import COST_USD, MODEL, PENDING_APPROVALS, STATE, TENANT
from workflows.types import StatusView

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache_mode() -> str:
    """One worker mode is enough here: these tests are about the command line, not about replay."""
    return "cached"


async def _server(**options: Any) -> WorkflowEnvironment:
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI),
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
        **options,
    )


@pytest.fixture
async def indexed_env() -> AsyncIterator[WorkflowEnvironment]:
    """A dev server whose namespace has the ``Agent*`` search attributes."""
    env = await _server(search_attributes=[STATE, PENDING_APPROVALS, TENANT, MODEL, COST_USD])
    yield env
    await env.shutdown()


@pytest.fixture
async def plain_env() -> AsyncIterator[WorkflowEnvironment]:
    """A dev server whose namespace knows none of them (an operator who never registered them)."""
    env = await _server()
    yield env
    await env.shutdown()


def waits_or_answers(sink: HttpSink) -> Any:
    """Runs whose task starts with ``wait`` ask for a POST (held for approval); the others answer."""

    def reply(body: dict[str, Any]) -> Scripted:
        task = next((str(m.get("content")) for m in body.get("messages", []) if m.get("role") == "user"), "")
        if task.startswith("wait") and len(body.get("messages", [])) <= 2:
            post = json.dumps({"method": "POST", "url": f"{sink.url}/orders", "json": {"task": task}})
            return Scripted(tool_calls=[("http_request", post)])
        return Scripted(text="done")

    return reply


async def _start_waiting(client: Client, task_queue: str, count: int) -> list[str]:
    handles = await asyncio.gather(
        *(start_agent(client, task_queue, id_prefix="waiting", task=f"wait {n}") for n in range(count))
    )
    await asyncio.gather(*(_until_pending(client, handle.id) for handle in handles))
    return [handle.id for handle in handles]


async def _until_pending(client: Client, workflow_id: str) -> None:
    handle = client.get_workflow_handle(workflow_id)

    async def waiting() -> bool:
        return bool(StatusView.model_validate(await handle.query(AgentWorkflow.status)).pending_approvals)

    await eventually(waiting, f"{workflow_id} asks for an approval", every_s=0.1)


def _pending(address: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "TEMPORAL_ADDRESS": address}
    return subprocess.run(
        [sys.executable, str(ROOT / "starter.py"), "pending", "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def _listed_until(address: str, expected: set[str]) -> tuple[list[dict[str, Any]], str]:
    """``pending --json`` rows (and stderr) once they name exactly ``expected`` (visibility lags a little)."""

    async def listed() -> tuple[list[dict[str, Any]], str]:
        shown = await asyncio.to_thread(_pending, address)  # the worker answers queries on this loop
        assert shown.returncode == 0, shown.stderr
        rows: list[dict[str, Any]] = json.loads(shown.stdout)
        assert {row["workflow_id"] for row in rows} == expected, rows
        return rows, shown.stderr

    return await eventually(listed, f"pending lists {sorted(expected)}", every_s=0.2)


async def test_pending_finds_waiting_runs_by_search_attribute_among_many_running_ones(
    indexed_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    client = indexed_env.client
    address = client.service_client.config.target_host
    runtime.search_attributes_ready = True  # as the worker's plugin sets it on a namespace that has them
    with HttpSink() as sink:
        llm.default = waits_or_answers(sink)
        async with run_worker(client, runtime) as task_queue:
            waiting = await _start_waiting(client, task_queue, 3)
            done = await start_agent(client, task_queue, id_prefix="done", task="answer")
            await done.result()
            # Newer than the waiting runs, so listed first: running, but no worker ever picks them up.
            idle = await asyncio.gather(
                *(start_agent(client, f"{task_queue}-nobody", id_prefix="idle") for _ in range(60))
            )
            rows, stderr = await _listed_until(address, set(waiting))

    assert sorted(row["workflow_id"] for row in rows) == sorted(waiting), stderr
    assert all(row["tool"] == "http_request" and row["args"]["method"] == "POST" for row in rows)
    # The idle runs were never asked (each would have been a 10 s query timeout and a warning).
    assert not any(handle.id in stderr for handle in idle), stderr
    assert sink.received == [], "nothing was approved, so nothing was sent"


async def test_pending_without_the_search_attribute_asks_every_running_run(
    plain_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    client = plain_env.client
    address = client.service_client.config.target_host
    with HttpSink() as sink:
        llm.default = waits_or_answers(sink)
        async with run_worker(client, runtime) as task_queue:
            waiting = await _start_waiting(client, task_queue, 55)  # more than one page of the old listing
            done = await start_agent(client, task_queue, id_prefix="done", task="answer")
            await done.result()
            rows, stderr = await _listed_until(address, set(waiting))

    assert sorted(row["workflow_id"] for row in rows) == sorted(waiting), stderr
    assert len(rows) == 55


async def test_pending_does_not_ask_runs_no_worker_polls_for(plain_env: WorkflowEnvironment) -> None:
    """Runs on a task queue nobody polls are counted in one warning, not each asked (and waited for)."""
    client = plain_env.client
    address = client.service_client.config.target_host
    queue = "nobody-polls-this"
    await asyncio.gather(*(start_agent(client, queue, id_prefix="idle") for _ in range(40)))

    async def counted() -> subprocess.CompletedProcess[str] | None:  # visibility lags a little
        shown = await asyncio.to_thread(_pending, address)
        return shown if "40 run(s)" in shown.stderr else None

    shown = await eventually(counted, "pending counts the 40 runs", every_s=0.2)
    assert shown.returncode == 0 and json.loads(shown.stdout) == [], shown.stderr
    [warning] = shown.stderr.strip().splitlines()
    assert warning.startswith(
        f"warning: 40 run(s) on task queue {queue} may wait for approvals, but no worker polls task queue {queue} "
        f"to show them (start one with: AGENT_TASK_QUEUE={queue} "
    ) and warning.endswith("python worker.py)"), warning  # the interpreter running (tests/test_cli_worker_hint.py)
