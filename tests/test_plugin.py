"""``DurableAgentsPlugin`` owns what runs beside a worker: the reaper stops with it, the runtime closes after."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, replace

import pytest
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.settings import ConfigurationError, SandboxSettings, Settings, WorkerSettings
from durable_agents import DurableAgentsPlugin
from durable_agents.plugin import share_workflow_module
from durable_agents.workflow_runner import DirectContextSandboxedWorkflowRunner
from tests.waiting import eventually


def reaper_tasks(task_queue: str = "") -> list[asyncio.Task[object]]:
    """The reapers running in this event loop (of the worker on ``task_queue`` when given)."""
    return [
        t
        for t in asyncio.all_tasks()
        if t.get_name().startswith("sandbox-reaper ")
        and (not task_queue or t.get_name() == f"sandbox-reaper {task_queue}")
        and not t.done()
    ]


async def test_reaper_runs_with_the_worker_and_is_awaited_when_it_stops(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    fast = replace(settings, sandbox=SandboxSettings(reap_interval_s=0.05))
    plugin = DurableAgentsPlugin(fast, search_attributes=False)
    task_queue = f"plugin-{uuid.uuid4().hex[:8]}"
    # By name: other workers of this event loop (a shared fixture's, a test's leftover) have reapers of their own.
    async with Worker(dev_env.client, task_queue=task_queue, plugins=[plugin]):
        mine = await eventually(lambda: reaper_tasks(task_queue), "the worker's reaper runs")
        assert len(mine) == 1
    assert all(task.done() for task in mine), "the reaper task must finish before the worker's exit returns"
    assert plugin.runtime._store is None, "the plugin closed the runtime it built"
    # A later worker with the same plugin opens the store again.
    async with Worker(dev_env.client, task_queue=f"plugin-{uuid.uuid4().hex[:8]}", plugins=[plugin]):
        assert await plugin.runtime.store.get_message("nothing", 0) is None


async def test_no_reaper_when_the_interval_is_zero(dev_env: WorkflowEnvironment, settings: Settings) -> None:
    plugin = DurableAgentsPlugin(replace(settings, sandbox=SandboxSettings(reap_interval_s=0)), search_attributes=False)
    task_queue = f"plugin-{uuid.uuid4().hex[:8]}"
    async with Worker(dev_env.client, task_queue=task_queue, plugins=[plugin]):
        # The plugin counts the worker as running after the point where it would have started a reaper.
        await eventually(lambda: plugin._running_workers == 1, "the plugin runs the worker")
        assert reaper_tasks(task_queue) == []


async def test_workers_share_the_agent_workflow_module_across_runs(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    plugin = DurableAgentsPlugin(settings, reaper=False, search_attributes=False)
    worker = Worker(dev_env.client, task_queue=f"tq-{uuid.uuid4().hex[:8]}", plugins=[plugin])
    runner = worker.config(active_config=True)["workflow_runner"]
    assert isinstance(runner, DirectContextSandboxedWorkflowRunner)
    assert "workflows.agent" in runner.restrictions.passthrough_modules
    # Every other restriction is the default sandbox's.
    assert runner.restrictions.invalid_module_members == SandboxRestrictions.default.invalid_module_members
    # An application that chose to run its workflows unsandboxed keeps its choice.
    own = UnsandboxedWorkflowRunner()
    assert share_workflow_module(own) is own
    # A sandbox subclass of the application's keeps its class (and its overrides), with the modules shared.
    custom = share_workflow_module(_CustomSandbox())
    assert type(custom) is _CustomSandbox
    assert "workflows.agent" in custom.restrictions.passthrough_modules


@dataclass(frozen=True)
class _CustomSandbox(SandboxedWorkflowRunner):
    """An application's own sandbox runner."""


async def test_a_worker_whose_runtime_cannot_work_raises_from_async_with(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    # A SQLite store where a shared one is required fails the plugin's check, before the worker polls.
    broken = replace(settings, worker=WorkerSettings(require_shared_store=True))
    plugin = DurableAgentsPlugin(broken, reaper=False, search_attributes=False)
    with pytest.raises(ConfigurationError, match="AGENT_REQUIRE_SHARED_STORE"):
        async with Worker(dev_env.client, task_queue=f"plugin-{uuid.uuid4().hex[:8]}", plugins=[plugin]):
            await asyncio.Event().wait()  # only the worker's failure ends this (by cancelling it)
    # Worker.run() callers see the same error.
    with pytest.raises(ConfigurationError, match="AGENT_REQUIRE_SHARED_STORE"):
        await Worker(dev_env.client, task_queue=f"plugin-{uuid.uuid4().hex[:8]}", plugins=[plugin]).run()
