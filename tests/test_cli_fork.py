"""``starter.py fork`` and ``rewind``: their arguments and edges, against the dev server and an in-process worker.

The source run takes three steps: two read-only ``http_request`` GETs to a local sink, then an
answer. The fake model decides from the prompt alone (how many turns it holds), so a rewound or
forked run gets the same answers for the same transcript. ``starter.py`` runs as a subprocess
(in a thread: the worker answers on this test's event loop). What forks and rewinds do to the
workspace and to side effects is tested elsewhere.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from durable_agents.cli.fork import reset_event_for_step
from tests.conftest import TEMPORAL_CLI, WorkerFactory, start_agent
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer
from tests.scenarios import FORK_STEPS, get_twice_then_count
from workflows.progress import FORK_OF
from workflows.types import AgentInput, AgentResult

ROOT = Path(__file__).resolve().parent.parent
STEPS = FORK_STEPS


@pytest.fixture
def cache_mode() -> str:
    """One worker mode is enough here: these tests are about the command line, not about replay."""
    return "cached"


@dataclass
class Source:
    client: Client
    task_queue: str
    handle: WorkflowHandle[Any, AgentResult]
    result: AgentResult
    llm: FakeLLMServer
    sink: HttpSink

    def starter(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": os.environ["PATH"],
            "TEMPORAL_ADDRESS": self.client.service_client.config.target_host,
            "AGENT_TASK_QUEUE": self.task_queue,
        }
        return subprocess.run(
            [sys.executable, str(ROOT / "starter.py"), *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=90,
        )

    async def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(self.starter, *args)


@asynccontextmanager
async def _source(
    client: Client, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> AsyncIterator[Source]:
    """A closed run of three steps, with the worker still running."""
    with HttpSink() as sink:
        llm.default = get_twice_then_count(sink)
        async with run_worker(client, runtime) as task_queue:
            handle = await start_agent(client, task_queue, id_prefix="src", task="look two items up")
            result = await asyncio.wait_for(handle.result(), 60)
            assert result.status == "completed" and result.steps == STEPS, result
            assert len(sink.received) == STEPS - 1
            yield Source(client, task_queue, handle, result, llm, sink)


@pytest.fixture
async def source(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> AsyncIterator[Source]:
    async with _source(dev_env.client, runtime, run_worker, llm) as made:
        yield made


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), proc.stderr
    return lines[0]


async def _first_input(client: Client, workflow_id: str) -> AgentInput:
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        assert event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED
        [inp] = await client.data_converter.decode(
            event.workflow_execution_started_event_attributes.input.payloads, [AgentInput]
        )
        assert isinstance(inp, AgentInput)
        return inp
    raise AssertionError(f"{workflow_id} has no history")


async def test_reset_event_for_step_finds_the_task_that_scheduled_the_next_turn(source: Source) -> None:
    history = await source.handle.fetch_history()
    events = list(history.events)
    by_id = {event.event_id: event for event in events}
    scheduled = [
        event
        for event in events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and event.activity_task_scheduled_event_attributes.activity_type.name == "model"
    ]
    assert len(scheduled) == STEPS
    for step in range(STEPS):
        found = reset_event_for_step(events, step)
        expected = scheduled[step].activity_task_scheduled_event_attributes.workflow_task_completed_event_id
        assert found == expected, (step, found, expected)
        assert by_id[found].event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        # Step `step` ended before: its model turn (and, for steps 1 and 2, its tool call) completed earlier.
        assert found > scheduled[step - 1].event_id if step else found < scheduled[0].event_id
    assert reset_event_for_step(events, STEPS) is None
    assert reset_event_for_step(events, 100) is None


async def test_rewind_resets_to_the_end_of_the_step_and_the_run_completes_again(source: Source) -> None:
    asked = len(source.llm.requests)
    shown = await source.run("rewind", source.handle.id, "--to-step", "1")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.strip().splitlines()
    assert len(lines) == 2, shown.stdout
    assert lines[0].startswith(f"rewound {source.handle.id} to step 1: new run "), lines
    new_run = lines[0].rsplit(" ", 1)[1]
    assert new_run and new_run != source.handle.result_run_id
    assert "identical tool calls get their recorded results" in lines[1] and "step 2" in lines[1], lines

    handle = source.client.get_workflow_handle(source.handle.id, result_type=AgentResult)
    result = await asyncio.wait_for(handle.result(), 60)
    assert result.status == "completed" and result.steps == STEPS, result
    assert (await handle.describe()).run_id == new_run
    # The model was asked again for steps 2 and 3 only, and step 2's prompt held step 1 (four messages).
    again = source.llm.requests[asked:]
    assert len(again) == 2, [r["body"]["messages"] for r in again]
    assert len(again[0]["body"]["messages"]) == 4, again[0]["body"]["messages"]


async def test_rewind_past_the_last_step_is_refused_in_one_line(source: Source) -> None:
    for step in (STEPS, 9):
        shown = await source.run("rewind", source.handle.id, "--to-step", str(step))
        assert shown.returncode == 1, shown.stderr
        line = _one_line(shown)
        assert f"has no step after {step} to rewind from (steps it has: {STEPS})" in line, line
    assert (await source.handle.describe()).run_id == source.handle.result_run_id, "nothing was reset"


async def test_rewind_usage_errors_exit_2(source: Source) -> None:
    for bad in ("-1", "x", "1.5"):
        shown = await source.run("rewind", source.handle.id, "--to-step", bad)
        assert shown.returncode == 2, shown.stderr
        assert "--to-step" in _one_line(shown)
    shown = await source.run("rewind", source.handle.id)
    assert shown.returncode == 2 and "--to-step" in _one_line(shown)
    unknown = await source.run("rewind", f"nope-{uuid.uuid4().hex[:6]}", "--to-step", "1")
    assert unknown.returncode == 1 and "no run with id" in _one_line(unknown)


async def test_fork_starts_a_run_from_the_sources_first_steps(source: Source) -> None:
    shown = await source.run("fork", source.handle.id, "--at-step", "1", "--task", "again")
    assert shown.returncode == 0, shown.stderr
    first = shown.stdout.splitlines()[0]
    prefix = f"started fork {source.handle.id}-fork1-"
    assert first.startswith(prefix), first
    assert first.endswith(f" of {source.handle.id} at step 1 on task queue {source.task_queue}"), first
    fork_id = first.split()[2]
    assert "  ui: " in shown.stdout

    inp = await _first_input(source.client, fork_id)
    assert inp.fork is not None and inp.fork.step == 1 and inp.fork.workflow_id == source.handle.id
    assert inp.fork.run_id == "" and inp.carry is None
    assert inp.task == "again" and inp.model == ""
    src = await _first_input(source.client, source.handle.id)
    assert (inp.tools, inp.limits, inp.policy, inp.approvers, inp.tenant) == (
        src.tools,
        src.limits,
        src.policy,
        src.approvers,
        src.tenant,
    )
    handle = source.client.get_workflow_handle(fork_id, result_type=AgentResult)
    result = await asyncio.wait_for(handle.result(), 60)
    assert result.status == "completed" and result.steps == STEPS, result
    desc = await handle.describe()
    assert await desc.static_summary() == f"fork of {source.handle.id} at step 1: again"


async def test_fork_with_wait_and_own_id_reports_the_result(source: Source) -> None:
    fork_id = f"fork-{uuid.uuid4().hex[:8]}"
    shown = await source.run("fork", source.handle.id, "--at-step", "0", "--id", fork_id, "--wait")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"started fork {fork_id} of {source.handle.id} at step 0"), shown.stdout
    assert "status: completed" in shown.stdout and f"run id: {fork_id}" in shown.stdout, shown.stdout
    inp = await _first_input(source.client, fork_id)
    assert inp.task == "look two items up" and inp.fork is not None and inp.fork.step == 0
    desc = await source.client.get_workflow_handle(fork_id).describe()
    assert await desc.static_summary() == f"fork of {source.handle.id} at step 0"


async def test_fork_errors(source: Source) -> None:
    unknown = await source.run("fork", f"unknown-{uuid.uuid4().hex[:6]}", "--at-step", "1")
    assert unknown.returncode == 1, unknown.stderr
    assert "no run with id" in _one_line(unknown)
    for bad in ("-1", "one"):
        shown = await source.run("fork", source.handle.id, "--at-step", bad)
        assert shown.returncode == 2, shown.stderr
        assert "--at-step" in _one_line(shown)
    too_far = await source.run("fork", source.handle.id, "--at-step", str(STEPS + 1))
    assert too_far.returncode == 1, too_far.stderr
    assert f"has {STEPS} complete step(s); cannot fork at step {STEPS + 1}" in _one_line(too_far)
    empty = await source.run("fork", source.handle.id, "--at-step", "1", "--task", "  ")
    assert empty.returncode == 2 and "the task is empty" in _one_line(empty)
    wrong_run = await source.run("fork", source.handle.id, "--at-step", "1", "--run-id", str(uuid.uuid4()))
    assert wrong_run.returncode == 1 and "no run" in _one_line(wrong_run)


@pytest.mark.parametrize("registered", [True, False], ids=["with-AgentForkOf", "without"])
async def test_fork_records_its_source_in_AgentForkOf_when_the_namespace_has_it(
    registered: bool, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI),
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
        search_attributes=[FORK_OF] if registered else [],
    )
    try:
        async with _source(env.client, runtime, run_worker, llm) as source:
            shown = await source.run("fork", source.handle.id, "--at-step", "2", "--wait")
            assert shown.returncode == 0, shown.stderr
            assert shown.stderr == "", shown.stderr
            fork_id = shown.stdout.split()[2]
            desc = await env.client.get_workflow_handle(fork_id).describe()
            assert desc.typed_search_attributes.get(FORK_OF) == (source.handle.id if registered else None)
    finally:
        await env.shutdown()
