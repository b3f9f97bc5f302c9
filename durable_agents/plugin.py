"""``DurableAgentsPlugin``: the one composition root.

On a client it sets the pydantic data converter (with ``AGENT_PAYLOAD_KEYS``, also the
AES-256-GCM payload codec, ``activities.crypto.codec``); on a worker (built with that
client, or given the plugin itself) it adds ``AgentWorkflow`` and every activity
the workflow schedules (and ``ScheduledMessageWorkflow``, what a session schedule starts,
with its activity; ``EvalWorkflow``, what ``starter.py eval`` starts, with its two), all
bound to one :class:`~activities.runtime.Runtime` (settings, run store, tool and provider
registries, prices, policy, sandboxes).
While a worker runs, the plugin also registers the ``Agent*`` search attributes
where it may, reaps sandboxes of ended runs every ``AGENT_REAP_INTERVAL_S`` and,
with ``AGENT_HEALTH_PORT``, serves ``/healthz`` and ``/readyz`` (``durable_agents.health``).

Embedding in your own Temporal application::

    from temporalio.client import Client
    from temporalio.worker import Worker

    from durable_agents import DurableAgentsPlugin

    plugin = DurableAgentsPlugin()  # Settings.from_env(); or DurableAgentsPlugin(settings)
    client = await Client.connect("localhost:7233", plugins=[plugin])
    worker = Worker(client, task_queue="my-app", workflows=[MyWorkflow], activities=[my_activity])
    # MyWorkflow: await workflow.execute_child_workflow("AgentWorkflow", {"task": "..."}, task_queue="my-app")

Construction validates the configuration (default model, providers, tool and
provider modules, prices, policy) and raises
:class:`~activities.settings.ConfigurationError` with one line naming the problem.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pkgutil
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.plugin import SimplePlugin
from temporalio.worker import Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

import activities
import workflows
from activities.approvals import ApprovalActivities
from activities.checkpoints.fork import ForkActivities
from activities.crypto.codec import encrypted_converter
from activities.delegation import DelegationActivities
from activities.evals import EvalActivities
from activities.mcp.activity import McpActivities
from activities.mcp.catalog import SnapshotCache
from activities.memory.recall import MemoryRecallActivities
from activities.model_turn import ModelActivities
from activities.models.registry import ProviderRegistry
from activities.run_config import RunConfigActivities
from activities.runtime import Runtime
from activities.sandbox.activity import SandboxActivities
from activities.scheduled_messages import ScheduledMessageActivities
from activities.sessions import SessionActivities
from activities.settings import ConfigurationError, Settings
from activities.tenant_quota import TenantQuotaActivities
from activities.tools.activity import CompensationActivities, TranscriptActivities, tool_activities
from activities.tools.registry import ToolRegistry
from durable_agents.health import HealthServer, WorkerHealth
from durable_agents.reaping import reap_forever
from durable_agents.search_attributes import ensure_search_attributes
from durable_agents.workflow_runner import DirectContextSandboxedWorkflowRunner
from workflows.agent import AgentWorkflow
from workflows.eval import EvalWorkflow
from workflows.scheduled_message import ScheduledMessageWorkflow

PLUGIN_NAME = "durable_agents.DurableAgentsPlugin"
# The workflows the plugin adds to a worker (and that ``durable_agents.testing.replay`` replays by default).
WORKFLOWS: tuple[type, ...] = (AgentWorkflow, ScheduledMessageWorkflow, EvalWorkflow)
WORKFLOW_MODULE = AgentWorkflow.__module__
log = structlog.get_logger("plugin")
# Libraries of ours an application's workflow module may import at its top (to configure the agents' logs)
# whose import the sandbox refuses: ``structlog.dev`` imports ``rich``, which calls ``random.getrandbits``.
PASSED_THROUGH_LIBRARIES = ("structlog", "rich")


def own_modules() -> tuple[str, ...]:
    """The modules the sandbox takes from the host: ``durable_agents`` and every module of ``workflows`` and
    ``activities`` (named one by one, so that an application's own modules of the same top-level name are not).

    A user's workflow module may import ``durable_agents`` (``AgentInput`` for its types, or the plugin in a
    one-file app) at its top: passed through, those modules are imported once, outside the sandbox's import
    checks (``rich``, pulled in through ``mcp``, calls ``random.getrandbits`` when it is imported), the way
    Temporal's contrib plugins pass their own packages through (``OpenTelemetryPlugin``: ``opentelemetry``).
    """
    names = ["durable_agents"]
    for package in (workflows, activities):
        names.extend(f"{package.__name__}.{info.name}" for info in pkgutil.iter_modules(package.__path__))
    return tuple(names)


def share_workflow_module(runner: WorkflowRunner | None) -> WorkflowRunner:
    """The worker's sandbox, with ``AgentWorkflow``'s module (and the project's others, :func:`own_modules`)
    imported once instead of once per run.

    The sandbox re-imports a workflow's own module for every run it starts or replays, to isolate
    module-level state. ``workflows.agent`` keeps none (constants only; each run's state is on its
    instance), and its code objects were most of what a cached run cost beyond a bare workflow
    (~190 KB each). The sandbox's runtime restrictions (no I/O, no clocks, no threads) still apply
    to its code, as they do to the ``workflows`` modules it already imports passed through.

    The SDK's own runner becomes :class:`~durable_agents.workflow_runner.DirectContextSandboxedWorkflowRunner`
    (the same sandbox, without its per-payload re-entry to answer context asks).
    """
    runner = runner if runner is not None else SandboxedWorkflowRunner()
    if not isinstance(runner, SandboxedWorkflowRunner):  # an embedding application chose otherwise
        return runner
    modules = (WORKFLOW_MODULE, *own_modules(), *PASSED_THROUGH_LIBRARIES)
    restrictions = runner.restrictions.with_passthrough_modules(*modules)
    if type(runner) is SandboxedWorkflowRunner:  # a subclass of the user's keeps its own class
        return DirectContextSandboxedWorkflowRunner(restrictions=restrictions, runner_class=runner.runner_class)
    return dataclasses.replace(runner, restrictions=restrictions)


def _never_started(worker: Worker) -> None:
    """Mark a worker that stops before its polling starts as shut down.

    ``Worker.shutdown()`` (and so the exit of ``async with Worker(...)``) waits for an event that only the
    SDK's own run sets, once polling has started or failed; a plugin raising before that would leave the
    caller waiting forever instead of seeing the error. The event is private: if a release renames it,
    the error still reaches ``Worker.run()`` callers.
    """
    done = getattr(worker, "_shutdown_complete_event", None)
    if isinstance(done, asyncio.Event):
        done.set()


def all_activities(runtime: Runtime) -> list[Callable[..., Any]]:
    """Every activity ``AgentWorkflow`` schedules (run config, model, transcript, sandbox, one per tool) and
    ``ScheduledMessageWorkflow``'s ``scheduled_message_send``, and ``EvalWorkflow``'s ``eval_score`` and
    ``eval_judge``."""
    snapshots = SnapshotCache()  # run_config's MCP snapshots, read by the run's model turns
    model = ModelActivities(runtime, snapshots)
    sandbox = SandboxActivities(runtime.sandbox_backend)
    transcript = TranscriptActivities(runtime)
    mcp = McpActivities(runtime)
    approvals = ApprovalActivities(runtime.settings, runtime.tools)
    evals = EvalActivities(runtime)
    return [
        RunConfigActivities(runtime, snapshots).run_config,
        approvals.verify_decision,
        approvals.check_edited_call,
        model.model,
        transcript.transcript_append,
        CompensationActivities(runtime).compensate,
        sandbox.sandbox_create,
        sandbox.sandbox_kill,
        mcp.mcp,
        mcp.mcp_release,
        ForkActivities(runtime).fork_prepare,
        SessionActivities(runtime).session_open,
        DelegationActivities(runtime).tree_run_reserve,
        TenantQuotaActivities(runtime).tenant_run_release,
        MemoryRecallActivities(runtime).memory_recall,
        ScheduledMessageActivities().scheduled_message_send,
        evals.eval_score,
        evals.eval_judge,
        *tool_activities(runtime),
    ]


def with_pydantic(existing: DataConverter | None) -> DataConverter:
    """The pydantic payload converter, keeping any payload codec or failure converter already configured."""
    if existing is None or existing is DataConverter.default:
        return pydantic_data_converter
    if existing.payload_converter_class is PydanticPayloadConverter:
        return existing
    return dataclasses.replace(existing, payload_converter_class=PydanticPayloadConverter)


class DurableAgentsPlugin(SimplePlugin):
    """Adds ``AgentWorkflow``, its activities and the data converter to a client and its workers.

    ``settings`` defaults to ``Settings.from_env()``. ``tools`` / ``providers`` replace the
    registries built from the settings (built-ins plus ``AGENT_TOOL_MODULES`` /
    ``AGENT_PROVIDER_MODULES``). ``runtime`` supplies a ready runtime instead (its owner
    closes it); otherwise the plugin closes the one it built when its last worker stops.
    ``reaper=False`` turns the background sandbox reaper off for this plugin's workers.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        tools: ToolRegistry | None = None,
        providers: ProviderRegistry | None = None,
        runtime: Runtime | None = None,
        reaper: bool = True,
        search_attributes: bool = True,
    ) -> None:
        if runtime is not None:
            self.runtime, self._owns_runtime = runtime, False
        else:
            settings = settings if settings is not None else Settings.from_env()
            self.runtime, self._owns_runtime = Runtime.from_settings(settings, tools=tools, providers=providers), True
        self.settings = self.runtime.settings
        self._reaper = reaper and self.settings.sandbox.reap_interval_s > 0
        self._search_attributes = search_attributes
        self._running_workers = 0
        self._checked = False
        super().__init__(
            PLUGIN_NAME,
            data_converter=self._data_converter,
            workflows=list(WORKFLOWS),
            activities=all_activities(self.runtime),
            workflow_runner=share_workflow_module,
        )

    def _data_converter(self, existing: DataConverter | None) -> DataConverter:
        """The pydantic converter and, when ``AGENT_PAYLOAD_KEYS`` is set, the payload codec (client, replayer)."""
        return encrypted_converter(with_pydantic(existing), self.settings.encryption.keyring)

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        """Around each worker: the runtime checked and search attributes registered once, the reaper and the
        health server while it runs, the runtime closed after. A failed check (or a health port that cannot be
        bound) raises ``ConfigurationError`` from ``Worker.run`` and out of ``async with Worker(...)``."""
        client = worker.client
        try:
            await self.check()  # a store or sandbox that cannot work stops the worker before it polls
            if self._search_attributes and not self.runtime.search_attributes_ready:
                self.runtime.search_attributes_ready = await ensure_search_attributes(client)
        except BaseException:
            _never_started(worker)
            raise
        reaper = (
            asyncio.create_task(
                reap_forever(
                    client,
                    self.runtime.sandbox_backend,
                    self.settings.sandbox.reap_interval_s,
                    store=lambda: self.runtime.store,
                    retention_days=self.settings.checkpoints.retention_days,
                    run_retention_days=self.settings.checkpoints.run_retention_days,
                    memory=lambda: self.runtime.memory,
                    deltas=lambda: self.runtime.deltas,
                ),
                name=f"sandbox-reaper {worker.task_queue}",  # whose it is, among the workers of one process
            )
            if self._reaper
            else None
        )
        self._running_workers += 1
        health: HealthServer | None = None
        try:
            health = await self._start_health(worker)
            await next(worker)
        finally:
            self._running_workers -= 1
            if health is not None:
                await health.stop()
            if reaper is not None:
                reaper.cancel()
                # Awaited so that a reap pass in flight finishes its cancellation before the store closes.
                with contextlib.suppress(asyncio.CancelledError):
                    await reaper
            if self._owns_runtime and self._running_workers == 0:
                await self.runtime.aclose()

    async def _start_health(self, worker: Worker) -> HealthServer | None:
        """The health server on ``AGENT_HEALTH_PORT`` (one worker per port), or ``None`` when it is unset."""
        port = self.settings.worker.health_port
        if port is None:
            return None
        server = HealthServer(WorkerHealth(worker), port)
        await server.start()
        return server

    async def check(self) -> None:
        """``Runtime.check()`` once per plugin (and ``AGENT_REQUIRE_SHARED_STORE``): at the first worker, or
        earlier when the caller asks."""
        if not self._checked:
            problem = self.settings.shared_store_problem()
            if problem:
                raise ConfigurationError(problem)
            await self.runtime.check()
            self._checked = True

    async def aclose(self) -> None:
        """Close the runtime (store, provider connections); for callers that never ran a worker."""
        await self.runtime.aclose()
