"""``AGENT_FAIL_WORKFLOW_ON_ERROR=1``: a failed or limit_exceeded run fails its workflow, its result in the failure.

Against the real dev server: with the flag on, the Temporal workflow of a run that hit
``max_steps`` (or whose model failed) is FAILED with an ``AgentRunFailed`` failure whose
details decode to the ``AgentResult``, and the CLI (``status``, ``run --wait`` /
``--follow``, ``list``, ``watch``) shows that result as it shows the same run with the flag
off, whose workflow COMPLETES as before.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.settings import Settings
from tests.conftest import WorkerFactory, start_agent, with_settings
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.test_cli_bad_input import by_task, clean, cli_env, starter
from workflows.agent import AgentWorkflow
from workflows.run_failure import AGENT_RUN_FAILED, result_of_failure
from workflows.types import AgentResult, Limits, StatusView, SubagentDef


@pytest.fixture
def address(dev_env: WorkflowEnvironment) -> str:
    return dev_env.client.service_client.config.target_host


def test_the_flag_is_read_from_the_environment() -> None:
    assert Settings.from_env({}).fail_workflow_on_error is False
    assert Settings.from_env({"AGENT_FAIL_WORKFLOW_ON_ERROR": "1"}).fail_workflow_on_error is True
    assert Settings.from_env({"AGENT_FAIL_WORKFLOW_ON_ERROR": "0"}).fail_workflow_on_error is False


async def _failure(client: Client, workflow_id: str) -> tuple[ApplicationError, AgentResult]:
    handle = client.get_workflow_handle(workflow_id, result_type=AgentResult)
    with pytest.raises(WorkflowFailureError) as caught:
        await handle.result()
    cause = caught.value.cause
    assert isinstance(cause, ApplicationError), cause
    assert cause.type == AGENT_RUN_FAILED and cause.non_retryable
    result = result_of_failure(caught.value)
    assert result is not None, cause.details
    return cause, result


async def test_flag_on_fails_the_workflow_with_the_result_in_its_details(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    client = dev_env.client
    llm.default = by_task
    async with run_worker(client, with_settings(runtime, fail_workflow_on_error=True)) as task_queue:
        limited = await start_agent(
            client, task_queue, id_prefix="flag-limit", task="limit me", limits=Limits(max_steps=1)
        )
        failed = await start_agent(client, task_queue, id_prefix="flag-fail", task="fail me")
        done = await start_agent(client, task_queue, id_prefix="flag-done", task="answer me")

        cause, result = await _failure(client, limited.id)
        assert result.status == "limit_exceeded" and result.steps == 1
        assert result.output.startswith("max_steps=1")
        assert cause.message == f"agent run limit_exceeded: {result.output.splitlines()[0]}"
        assert (await limited.describe()).status == WorkflowExecutionStatus.FAILED
        # The status query (a worker answers it for the closed run) still says the agent's state.
        view = StatusView.model_validate(await limited.query(AgentWorkflow.status))
        assert view.state == "limit_exceeded" and view.output == result.output

        cause, result = await _failure(client, failed.id)
        assert result.status == "failed" and cause.message.startswith("agent run failed: model ")
        assert (await failed.describe()).status == WorkflowExecutionStatus.FAILED

        # A completed run completes its workflow, the flag on or not.
        assert (await done.result()).status == "completed"
        assert (await done.describe()).status == WorkflowExecutionStatus.COMPLETED


async def test_flag_off_the_same_run_completes(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    client = dev_env.client
    llm.default = by_task
    async with run_worker(client, runtime) as task_queue:
        limited = await start_agent(client, task_queue, id_prefix="noflag", task="limit me", limits=Limits(max_steps=1))
        result = await limited.result()
        assert result.status == "limit_exceeded" and result.steps == 1
        assert (await limited.describe()).status == WorkflowExecutionStatus.COMPLETED


@pytest.mark.parametrize("cache_mode", ["cached"])  # one worker mode: this is about the command line
async def test_the_cli_shows_the_result_of_a_failed_workflow(
    address: str, dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    client = dev_env.client
    llm.default = by_task
    async with (
        run_worker(client, with_settings(runtime, fail_workflow_on_error=True)) as flag_on,
        run_worker(client, runtime) as flag_off,
    ):
        on_env, off_env = cli_env(address, flag_on), cli_env(address, flag_off)
        on_id, off_id = f"cli-on-{uuid.uuid4().hex[:8]}", f"cli-off-{uuid.uuid4().hex[:8]}"

        # run --wait: the result, and the exit code of a run that did not complete (1), either way.
        waits = [
            await asyncio.to_thread(
                starter, env, "run", "limit me", "--id", wid, "--max-steps", "1", "--wait", "--json"
            )
            for env, wid in ((on_env, on_id), (off_env, off_id))
        ]
        for waited in waits:
            clean(waited)
            assert waited.returncode == 1, (waited.stdout, waited.stderr)
        on_result, off_result = (json.loads(w.stdout) for w in waits)
        assert on_result["status"] == off_result["status"] == "limit_exceeded"
        assert on_result["output"] == off_result["output"] and on_result["steps"] == off_result["steps"] == 1
        assert on_result["usage"] == off_result["usage"]
        assert (await client.get_workflow_handle(on_id).describe()).status == WorkflowExecutionStatus.FAILED
        assert (await client.get_workflow_handle(off_id).describe()).status == WorkflowExecutionStatus.COMPLETED

        # status: the same result, the same exit code.
        on_status, off_status = [
            await asyncio.to_thread(starter, env, "status", wid, "--json")
            for env, wid in ((on_env, on_id), (off_env, off_id))
        ]
        for shown in (on_status, off_status):
            clean(shown)
        assert on_status.returncode == off_status.returncode == 0, on_status.stderr
        on_data, off_data = json.loads(on_status.stdout), json.loads(off_status.stdout)
        assert on_data["state"] == "limit_exceeded" and "error" not in on_data
        assert {k: v for k, v in on_data.items() if k != "workflow_id"} == {
            k: v for k, v in off_data.items() if k != "workflow_id"
        }
        text = await asyncio.to_thread(starter, on_env, "status", on_id)
        clean(text)
        assert text.returncode == 0 and "limit_exceeded" in text.stdout and "max_steps=1" in text.stdout
        assert "internal error" not in text.stderr and "workflow failed" not in text.stdout

        # run --follow: the progress, then the result.
        follow_id = f"cli-follow-{uuid.uuid4().hex[:8]}"
        followed = await asyncio.to_thread(
            starter, on_env, "run", "limit me", "--id", follow_id, "--max-steps", "1", "--follow", timeout=60
        )
        clean(followed)
        assert followed.returncode == 1, (followed.stdout, followed.stderr)
        assert "status: limit_exceeded" in followed.stdout and "max_steps=1" in followed.stdout
        assert "failed:" not in followed.stderr, followed.stderr

        # list: the agent's state, and Temporal's.
        listing = await asyncio.to_thread(starter, on_env, "list", "--json", "--limit", "50")
        clean(listing)
        rows = {row["workflow_id"]: row for row in json.loads(listing.stdout)}
        assert rows[on_id]["status"] == "limit_exceeded" and rows[on_id]["execution_status"] == "failed"
        assert rows[off_id]["status"] == "limit_exceeded" and rows[off_id]["execution_status"] == "completed"

        # watch: the run's events to the end, as for the run that completed its workflow.
        on_watch, off_watch = [
            await asyncio.to_thread(starter, env, "watch", wid) for env, wid in ((on_env, on_id), (off_env, off_id))
        ]
        for watched in (on_watch, off_watch):
            clean(watched)
            assert "finished: limit_exceeded" in watched.stdout, (watched.stdout, watched.stderr)
        assert on_watch.returncode == off_watch.returncode


def _delegating_model(body: dict[str, Any]) -> Scripted:
    """The parent hands the task to ``helper``, then answers with its result; the helper calls a failing tool."""
    messages = body["messages"]
    if messages[0]["content"] == "You are the helper.":
        return Scripted(tool_calls=[("always_fails", "{}")])
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if results:
        return Scripted(text="parent saw: " + " | ".join(results))
    return Scripted(tool_calls=[("helper", json.dumps({"task": "help"}))])


async def test_a_parent_reads_a_failed_childs_result_from_the_failure(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    client = dev_env.client
    llm.default = _delegating_model
    helper = SubagentDef(
        description="Helps.", system_prompt="You are the helper.", tools=["always_fails"], limits=Limits(max_steps=1)
    )
    async with run_worker(client, with_settings(runtime, fail_workflow_on_error=True)) as task_queue:
        parent = await start_agent(client, task_queue, id_prefix="flag-parent", subagents={"helper": helper})
        result = await parent.result()
        child_id = f"{parent.id}/helper/s1c0"
        _, child = await _failure(client, child_id)

    assert child.status == "limit_exceeded"
    assert (await client.get_workflow_handle(child_id).describe()).status == WorkflowExecutionStatus.FAILED
    # The parent got the child's own result (not "sub-agent failed"), and its usage.
    assert result.status == "completed", result.output
    assert f"[sub-agent helper ({child_id}) ended limit_exceeded after 1 steps]" in result.output
    assert "failed:" not in result.output
    assert result.usage.input_tokens == child.usage.input_tokens + 20  # the parent's two turns, 10 each
